"""The collectives' arithmetic (pure): how a buffer is cut into chunks, each collective's
analytical ideal time, nccl-tests' bus bandwidth, and the bytes a collective puts on each
link in closed form.

Collectives and their analytical ideal (B: link payload rate, a: per-step latency):
- ring AllReduce: reduce-scatter + all-gather, 2(n-1) steps of S/n; 2(n-1)/n S/B + 2(n-1)a
- halving-doubling (n a power of two): recursive halving reduce-scatter then recursive
  doubling all-gather, 2 log2(n) steps exchanging S/2, S/4, ...; 2(n-1)/n S/B + 2 log2(n) a
- reduce-scatter / all-gather alone (ring): (n-1)/n S/B + (n-1) a
- all-to-all: every rank sends S/n to every other at once; (n-1)/n S/B + a
- hierarchical: ring reduce-scatter on NVLink inside each server, ring AllReduce of S/g
  across servers among GPUs of the same rank (the rails), ring all-gather on NVLink.
- broadcast (Chakra replay): a chain from the root in n chunks of S/n, each forwarded as it
  arrives: the last rank has the last chunk after 2(n-1) chunk times; 2(n-1)/n S/B + (n-1) a.
"""

from __future__ import annotations

import math

from testbed.wire import roce


def chunk_sizes(total_bytes: int, n: int) -> list:
    """S cut into n chunks, each a multiple of 4 bytes (RoCE payloads are 4-byte aligned)."""
    words = -(-total_bytes // 4)
    base, extra = divmod(words, n)
    return [4 * (base + (1 if i < extra else 0)) for i in range(n)]


def payload_bps(link_bps: float, mtu_bytes: int) -> float:
    return link_bps * mtu_bytes / roce.wire_bytes(mtu_bytes)


def ring_ideal_ns(size_bytes: int, n: int, link_bps: float, mtu_bytes: int, step_latency_ns: float = 0.0) -> float:
    """Ideal ring AllReduce time (real ns) on links of ``link_bps``: 2(n-1)/n x S at the
    link's payload rate (every packet carries ``roce.HEADER_BYTES`` of headers) plus
    2(n-1) x the per-step latency (path propagation)."""
    return 2 * (n - 1) / n * size_bytes * 8 / payload_bps(link_bps, mtu_bytes) * 1e9 + 2 * (n - 1) * step_latency_ns


def collective_ideal_ns(algorithm: str, size_bytes: int, n: int, link_bps: float, mtu_bytes: int,
                        latency_ns: float = 0.0, nvlink_bps: float = 0.0, g: int = 1) -> float:
    """The analytical ideal of one collective (see the module docstring)."""
    b = payload_bps(link_bps, mtu_bytes)
    if n < 2:
        return 0.0
    if algorithm == "ring":
        return ring_ideal_ns(size_bytes, n, link_bps, mtu_bytes, latency_ns)
    if algorithm == "halving-doubling":
        return 2 * (n - 1) / n * size_bytes * 8 / b * 1e9 + 2 * math.log2(n) * latency_ns
    if algorithm in ("reduce-scatter", "all-gather"):
        return (n - 1) / n * size_bytes * 8 / b * 1e9 + (n - 1) * latency_ns
    if algorithm == "all-to-all":
        return (n - 1) / n * size_bytes * 8 / b * 1e9 + latency_ns
    if algorithm == "broadcast":
        return 2 * (n - 1) / n * size_bytes * 8 / b * 1e9 + (n - 1) * latency_ns
    if algorithm == "hierarchical":
        servers = n // g
        nv = payload_bps(nvlink_bps, mtu_bytes)
        intra = 2 * (g - 1) / g * size_bytes * 8 / nv * 1e9 if g > 1 else 0.0
        return intra + ring_ideal_ns(size_bytes // g, servers, link_bps, mtu_bytes, latency_ns)
    raise ValueError(algorithm)


def bus_bandwidth_bps(size_bytes: int, n: int, elapsed_ns: float, algorithm: str = "ring") -> float:
    """nccl-tests: algbw = S / t; busbw = algbw x 2(n-1)/n for AllReduce, x (n-1)/n for
    reduce-scatter, all-gather and all-to-all, x 1 for broadcast (bits/s)."""
    factor = (n - 1) / n if algorithm in ("reduce-scatter", "all-gather", "all-to-all") else 2 * (n - 1) / n
    if algorithm == "broadcast":
        factor = 1.0
    return size_bytes * 8 / (elapsed_ns / 1e9) * factor


def sent_bytes(c: dict) -> dict:
    """Payload bytes every member of collective ``c`` sends in all, per link ({"fabric": B,
    "nvlink": B}), in closed form (the tests check it against the built ops)."""
    n, size = c["ranks"], c["bytes"]
    link = "nvlink" if c["phase"] == "tp" else "fabric"
    padded = sum(chunk_sizes(size, n)) if n else 0
    algo = c["algorithm"]
    if algo == "ring":
        total = 2 * (n - 1) * padded
    elif algo in ("reduce-scatter", "all-gather", "broadcast"):
        total = (n - 1) * padded
    elif algo == "halving-doubling":
        rounds = int(math.log2(n))
        total = n * 2 * sum(max(4, size // 2 ** (i + 1) - size // 2 ** (i + 1) % 4) for i in range(rounds))
    elif algo == "all-to-all":
        total = n * (n - 1) * chunk_sizes(size, n)[0]
    else:  # hierarchical: NVLink halves inside each server, rail rings of size / g across them
        g = c["per_server"]
        servers = n // g
        rail = max(4, size // g)
        nvlink = servers * 2 * (g - 1) * sum(chunk_sizes(size, g)) if g > 1 else 0
        fabric = g * 2 * (servers - 1) * sum(chunk_sizes(rail, servers)) if servers > 1 else 0
        return {"fabric": fabric, "nvlink": nvlink}
    return {"fabric": total if link == "fabric" else 0, "nvlink": total if link == "nvlink" else 0}
