"""Real fabric units and time dilation.

Scenarios are written in the units an engineer uses on a real fabric (``400G``,
``1us``, ``32MB``, ``100m``). This module owns parsing them into plain numbers
(bits per second, nanoseconds, bytes, metres) and the one conversion between the
real fabric and the emulation: rates are divided by the dilation factor D,
durations multiplied by it, byte counts left alone. Nothing else in the project
multiplies by D.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Signal propagation in fibre/copper: about 5 ns per metre (velocity factor ~0.67).
PROPAGATION_NS_PER_M = 5.0

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"

_RATE_UNITS = {
    "": 1, "bps": 1, "b/s": 1,
    "k": 1e3, "kbps": 1e3, "kbit": 1e3, "kb/s": 1e3,
    "m": 1e6, "mbps": 1e6, "mbit": 1e6, "mb/s": 1e6,
    "g": 1e9, "gbps": 1e9, "gbit": 1e9, "gb/s": 1e9, "gbe": 1e9,
    "t": 1e12, "tbps": 1e12, "tbit": 1e12, "tb/s": 1e12,
}
_TIME_UNITS_NS = {"ns": 1, "us": 1e3, "\u00b5s": 1e3, "ms": 1e6, "s": 1e9}
# Decimal prefixes are SI (switch datasheets quote MB as 10^6 bytes is not
# universal, so binary prefixes are accepted explicitly as KiB/MiB/GiB).
_SIZE_UNITS = {
    "b": 1, "": 1, "bytes": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3,
}
_LENGTH_UNITS_M = {"m": 1, "cm": 0.01, "km": 1000}


class UnitError(ValueError):
    """A value that is not a number with a unit of the expected kind."""


def _parse(text, units: dict, kind: str, examples: str, allow_bare: bool) -> float:
    if isinstance(text, bool):
        raise UnitError(f"expected a {kind} like {examples}, got {text!r}")
    if isinstance(text, (int, float)):
        if not allow_bare:
            raise UnitError(f"expected a {kind} with a unit like {examples}, got bare number {text!r}")
        value = float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*(?P<unit>[^\s0-9]*)", str(text).strip())
        unit = m.group("unit").lower() if m else None
        if m is None or unit not in units:
            raise UnitError(f"expected a {kind} like {examples}, got {text!r}")
        if unit == "" and not allow_bare:
            raise UnitError(f"expected a {kind} with a unit like {examples}, got {text!r}")
        value = float(m.group("num")) * units[unit]
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"expected a finite, non-negative {kind}, got {text!r}")
    return value


def _within(value: float, text, low: float, high: float, kind: str, fmt) -> float:
    """A parsed value inside what a data-centre fabric can have (the physics' bounds)."""
    if value < low:
        raise UnitError(f"expected a {kind} of at least {fmt(low)}, got {text!r}")
    if value > high:
        raise UnitError(f"expected a {kind} of at most {fmt(high)}, got {text!r}")
    return value


MIN_RATE_BPS, MAX_RATE_BPS = 1e3, 1e14  # 1 kbit/s .. 100 Tbit/s (real)
MAX_DURATION_NS = 3600e9  # an hour
MAX_SIZE_BYTES = 1e12  # 1 TB
MAX_LENGTH_M = 100e3  # 100 km: longer is not a data-centre cable


def parse_rate_bps(text) -> int:
    """``"400G"`` -> 400_000_000_000 (bits per second). Bare numbers are not accepted."""
    value = _parse(text, _RATE_UNITS, "rate", "400G, 25Gbps, 100M", allow_bare=False)
    return int(round(_within(value, text, MIN_RATE_BPS, MAX_RATE_BPS, "rate", lambda r: f"{format_rate(r)}bit/s")))


def parse_duration_ns(text) -> int:
    """``"1us"`` -> 1000 (nanoseconds)."""
    value = _parse(text, _TIME_UNITS_NS, "duration", "1us, 500ns, 2ms", allow_bare=False)
    return int(round(_within(value, text, 0, MAX_DURATION_NS, "duration", format_duration)))


def parse_size_bytes(text) -> int:
    """``"32MB"`` -> 32_000_000; ``"1MiB"`` -> 1_048_576; a bare integer is bytes."""
    value = _parse(text, _SIZE_UNITS, "size", "32MB, 100KB, 9000B", allow_bare=True)
    return int(round(_within(value, text, 0, MAX_SIZE_BYTES, "size", format_size)))


def parse_length_m(text) -> float:
    """``"100m"`` -> 100.0 metres of cable."""
    value = _parse(text, _LENGTH_UNITS_M, "cable length", "3m, 100m, 2km", allow_bare=False)
    return _within(value, text, 0, MAX_LENGTH_M, "cable length", lambda m: f"{m / 1e3:g}km")


def cable_delay_ns(length_m: float) -> int:
    """One-way propagation delay of a cable of ``length_m`` metres."""
    return int(round(length_m * PROPAGATION_NS_PER_M))


def format_rate(bps: float) -> str:
    """400e9 -> ``"400G"``; 10e6 -> ``"10M"``; keeps three significant digits."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if bps >= scale:
            return f"{_sig(bps / scale)}{unit}"
    return f"{_sig(bps)}bps"


def format_duration(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{_sig(ns / scale)}{unit}"
    return f"{_sig(ns)}ns"


def format_size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{_sig(nbytes / scale)}{unit}"
    return f"{int(nbytes)}B"


def _sig(x: float) -> str:
    text = f"{x:.3g}"
    if "e" in text:  # large values: plain integer rather than 1.2e+03
        text = str(int(round(x)))
    return text


@dataclass(frozen=True)
class Dilation:
    """Time dilation by ``factor`` (D >= 1): real-fabric values <-> emulated values."""

    factor: float

    def __post_init__(self):
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise UnitError(f"dilation must be a number >= 1, got {self.factor!r}")

    def rate_bps(self, real_bps: float) -> float:
        """Emulated rate for a real-fabric rate."""
        return real_bps / self.factor

    def duration_ns(self, real_ns: float) -> float:
        """Emulated duration for a real-fabric duration."""
        return real_ns * self.factor

    def real_duration_ns(self, emulated_ns: float) -> float:
        """Real-fabric-equivalent duration of an emulated one."""
        return emulated_ns / self.factor

    def real_rate_bps(self, emulated_bps: float) -> float:
        """Real-fabric-equivalent rate of an emulated one."""
        return emulated_bps * self.factor

    def scaled(self, k: float) -> float:
        """A dilation ``k`` times this one (the fidelity guard's suggestion), as a number."""
        return self.factor * k

    def __str__(self) -> str:
        """The factor as an engineer writes it: 1100000, not 1.1e+06; 2.5 stays 2.5."""
        return f"{self.factor:.0f}" if float(self.factor).is_integer() else f"{self.factor:g}"

    @staticmethod
    def of(value) -> "Dilation":
        """From a manifest's or plan's ``dilation`` (a number; missing or 0: none, 1)."""
        return Dilation(float(value or 1))

    @staticmethod
    def nice(minimum: float) -> "Dilation":
        """Smallest 1/2/5 x 10^k factor that is >= ``minimum`` (and >= 1)."""
        return Dilation(nice_ceil(minimum))


def nice_ceil(x: float) -> int:
    """The smallest 1, 2 or 5 x 10^k at or above ``x`` (at least 1): the round numbers
    dilations are chosen and suggested in."""
    if x <= 1:
        return 1
    exp = math.floor(math.log10(x))
    for mantissa in (1, 2, 5, 10):
        candidate = mantissa * 10 ** exp
        if candidate >= x * (1 - 1e-12):
            return candidate
    raise AssertionError("unreachable")
