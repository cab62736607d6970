"""Telemetry decisions and record formats, pure: the controller polls every switch's
OpenFlow port counters every ``interval`` and writes one record per port per poll.

The interval is set in real-fabric time and dilated (10 us of the real fabric at the
default dilation of 50000 is a poll every 0.5 s of the emulation), so a report shows the
same number of samples per real microsecond whatever the dilation.
"""

from __future__ import annotations

DEFAULT_INTERVAL_REAL_NS = 10_000
COUNTERS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors",
            "tx_errors")
LOCAL_PORT = 0xFFFFFFFE  # OFPP_LOCAL: the bridge's own interface, not a fabric port
UNAVAILABLE = 2 ** 64 - 1  # what OVS reports for a counter it cannot read (a port being removed)


class Poller:
    """When the next poll is due (monotonic ns); polls that fall behind are skipped, not
    bunched (a late controller must not flood the switches)."""

    def __init__(self, interval_ns: int, now_ns: int):
        self.interval_ns = interval_ns
        self.next_ns = now_ns

    def due(self, now_ns: int) -> bool:
        if now_ns < self.next_ns:
            return False
        behind = (now_ns - self.next_ns) // self.interval_ns
        self.next_ns += (behind + 1) * self.interval_ns
        return True

    def wait_s(self, now_ns: int) -> float:
        return max(0.0, (self.next_ns - now_ns) / 1e9)


def port_records(now_ns: int, switch: str, stats) -> list:
    """One record per fabric port from an OpenFlow port-stats reply body (objects with
    ``port_no`` and the counters, as os-ken parses them)."""
    out = []
    for s in stats:
        if s.port_no >= LOCAL_PORT or s.tx_bytes == UNAVAILABLE or s.rx_bytes == UNAVAILABLE:
            continue
        rec = {"t_ns": now_ns, "switch": switch, "port": s.port_no, "intf": f"{switch}-eth{s.port_no}"}
        rec.update({c: getattr(s, c) for c in COUNTERS})
        out.append(rec)
    return out
