"""The BPF maps' values as bytes: the marker's per-port ``struct cfg`` and ``struct state``
(``bpf/marker.c``) and the PFC process's ``struct pfc_counters``, with the shadow queue's
drain between packets. The layouts must match ``bpf/marker.c``."""

from __future__ import annotations

import socket
import struct

ECN_OFF = 2 ** 64 - 1
PMAX_ONE = 2 ** 32

# bpf/marker.c: struct cfg (8 x u64) and struct state (13 x u64 + spin lock, padded)
CFG_FORMAT = "=8Q"
CFG_SIZE = struct.calcsize(CFG_FORMAT)
CFG_RATE = 0  # index of "rate_bps" in struct cfg (the PFC process sets it when a link event slows a port)
CFG_PAUSED = 6  # index of "paused" in struct cfg (the PFC process flips it)
STATE_FORMAT = "=13Q8x"
STATE_SIZE = struct.calcsize(STATE_FORMAT)
# struct pfc_counters (testbed_pfc, written by testbed.apply.processes.pfcd, read by the collector)
PFC_FORMAT = "=6Q"
PFC_SIZE = struct.calcsize(PFC_FORMAT)
PFC_FIELDS = ("frames_sent", "xoff_sent", "frames_received", "paused_ns", "paused_since_ns",
              "headroom_high_water_bytes")
STATE_FIELDS = ("depth_bytes", "tokens_bytes", "last_ns", "packets", "bytes", "ect", "marked", "drops",
                "max_depth_bytes", "epoch", "prev_max_depth_bytes", "control_packets", "trimmed")


def marker_cfg(pq, paused: bool = False) -> bytes:
    """``struct cfg`` of bpf/marker.c for a port."""
    if pq.ecn:
        kmin, kmax, pmax = pq.kmin_bytes, pq.kmax_bytes, int(round(pq.pmax * PMAX_ONE))
    else:
        kmin = kmax = ECN_OFF
        pmax = 0
    return struct.pack(CFG_FORMAT, int(pq.emulated_rate_bps), pq.burst_bytes, pq.buffer_bytes, kmin, kmax, pmax,
                       int(paused), int(pq.trim))


def cfg_rate_bps(raw: bytes) -> int:
    """The emulated port rate in a port's ``struct cfg`` (a link event may have changed it)."""
    return struct.unpack(CFG_FORMAT, raw)[CFG_RATE]


def shadow_depth_now(state: dict, emulated_rate_bps: float, now_ns: int) -> float:
    """The shadow queue drained up to ``now_ns`` (CLOCK_MONOTONIC, the BPF clock): the
    program only updates it when a packet passes."""
    elapsed = max(0, now_ns - state["last_ns"])
    return max(0.0, state["depth_bytes"] - elapsed * emulated_rate_bps / 8e9)


def marker_state(raw: bytes) -> dict:
    """``struct state`` of bpf/marker.c as a dict."""
    return dict(zip(STATE_FIELDS, struct.unpack(STATE_FORMAT, raw)))


def pfc_counters(raw: bytes) -> dict:
    """``struct pfc_counters`` of bpf/marker.c as a dict."""
    return dict(zip(PFC_FIELDS, struct.unpack(PFC_FORMAT, raw)))


def pack_pfc_counters(**fields) -> bytes:
    return struct.pack(PFC_FORMAT, *(int(fields.get(k, 0)) for k in PFC_FIELDS))


# bpf/marker.c: struct steer_key {u32 hop; u32 src; u32 dst_net} (addresses in network
# order) and struct steer_choice {u32 n, pad; u32 ifindex[16]; u32 port[16]; u64 decisions,
# moved}: adaptive routing's decision table
STEER_MAX_CHOICES = 16
STEER_KEY_FORMAT = "=I4s4s"
STEER_FORMAT = f"=II{STEER_MAX_CHOICES}I{STEER_MAX_CHOICES}IQQ"
STEER_SIZE = struct.calcsize(STEER_FORMAT)


def steer_key(hop_ifindex: int, src: str | None, dst_net: str) -> bytes:
    """Key of one decision: the hop's ifindex (0: a GPU NIC, keyed by its ``src`` address)
    and the destination /24 (``10.0.2.0/24``)."""
    return struct.pack(STEER_KEY_FORMAT, hop_ifindex, socket.inet_aton(src) if src else bytes(4),
                       socket.inet_aton(dst_net.split("/")[0]))


def steer_choice(choices) -> bytes:
    """Value of one decision: ``choices`` is ((ifindex, OpenFlow port), ...), counters zero."""
    if not 1 <= len(choices) <= STEER_MAX_CHOICES:
        raise ValueError(f"adaptive routing takes 1 to {STEER_MAX_CHOICES} candidate ports, got {len(choices)}")
    pad = [0] * (STEER_MAX_CHOICES - len(choices))
    return struct.pack(STEER_FORMAT, len(choices), 0, *([i for i, _ in choices] + pad),
                       *([p for _, p in choices] + pad), 0, 0)


def steer_counters(raw: bytes) -> dict:
    """The decision counters of a ``struct steer_choice``: packets tagged, and of those the
    ones sent to a port other than the flow hash's."""
    fields = struct.unpack(STEER_FORMAT, raw)
    return {"decisions": fields[-2], "moved": fields[-1]}
