"""PFC (IEEE 802.1Qbb) on the wire: the frame, its pause time in real and emulated units,
and the packet socket the switches' PFC process and the GPU agents read and send it on.

``testbed.model.pfc`` decides when to send one; ``testbed.apply.processes.pfcd`` sends it.

Frame (60 bytes before the FCS): destination 01:80:c2:00:00:01, the sending port's MAC,
EtherType 0x8808 (MAC control), opcode 0x0101 (priority-based flow control), a
class-enable vector (bit p set: the quanta for priority p are valid) and eight 16-bit
pause quanta, one per priority, then zero padding. One quantum is 512 bit-times at the
link's real rate; quanta 0 resumes (XON).
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct

PFC_DST_MAC = bytes.fromhex("0180c2000001")
ETH_TYPE_MAC_CONTROL = 0x8808
OPCODE_PFC = 0x0101
FRAME_BYTES = 60
QUANTUM_BITS = 512
MAX_QUANTA = 0xFFFF
LOSSLESS_PRIORITY = 3  # RoCEv2's usual lossless class (DSCP 26)


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def frame(src_mac: str, quanta: dict[int, int]) -> bytes:
    """A PFC frame pausing (quanta > 0) or resuming (0) the given priorities."""
    vector, times = 0, [0] * 8
    for prio, q in quanta.items():
        if not 0 <= prio <= 7 or not 0 <= q <= MAX_QUANTA:
            raise ValueError(f"priority {prio} / quanta {q} out of range")
        vector |= 1 << prio
        times[prio] = q
    body = PFC_DST_MAC + mac_bytes(src_mac) + struct.pack("!HHH8H", ETH_TYPE_MAC_CONTROL, OPCODE_PFC, vector, *times)
    return body + bytes(FRAME_BYTES - len(body))


def restart_frame(src_mac: str) -> bytes:
    """A PFC frame with an empty class-enable vector: it pauses nothing and every receiver
    ignores it (OVS drops MAC control). The PFC process sends one into a port's data queue
    when it resumes the port: Linux's TBF keeps the watchdog it set at the paused rate
    across a rate change, so without an arrival the backlog would wait for it (seconds)."""
    return frame(src_mac, {})


def parse(data: bytes) -> tuple[str, dict[int, int]] | None:
    """(source MAC, {priority: quanta}) of a PFC frame, None for anything else."""
    if len(data) < 34 or data[:6] != PFC_DST_MAC:
        return None
    ethertype, opcode, vector = struct.unpack_from("!HHH", data, 12)
    if ethertype != ETH_TYPE_MAC_CONTROL or opcode != OPCODE_PFC:
        return None
    times = struct.unpack_from("!8H", data, 18)
    src = ":".join(f"{b:02x}" for b in data[6:12])
    return src, {p: times[p] for p in range(8) if vector & (1 << p)}


ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_QDISC_BYPASS = 263, 20
SO_ATTACH_FILTER = 26
# classic BPF: accept EtherType 0x8808 (whole frame), drop everything else
_FILTER = [(0x28, 0, 0, 12), (0x15, 0, 1, ETH_TYPE_MAC_CONTROL), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]


def open_socket(intf: str) -> socket.socket:
    """A non-blocking packet socket on ``intf`` that receives only MAC-control frames and
    sends past the qdiscs. It listens on ETH_P_ALL, as a tap: a socket bound to 0x8808
    alone is served after the device's rx handler, and OVS's kernel datapath (the lab VM)
    consumes every frame there; the filter keeps data frames out of user space."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    insns = (ctypes.c_uint8 * (8 * len(_FILTER)))(*b"".join(struct.pack("=HBBI", *i) for i in _FILTER))
    prog = struct.pack("HL", len(_FILTER), ctypes.addressof(insns))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
    sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    sock.bind((intf, ETH_P_ALL))
    sock.setblocking(False)
    return sock  # SO_ATTACH_FILTER copied the program: insns may go


def open_restart_socket(intf: str) -> socket.socket:
    """A send-only packet socket on ``intf`` whose frames go through the qdiscs (for
    ``restart_frame``): protocol 0 receives nothing."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.bind((intf, 0))
    sock.setblocking(False)
    return sock


# a packet socket on an interface that went down (a link event) or away: on a real port
# no frame crosses a dead link either, so this reads as "nothing" and sends nothing
LINK_GONE_ERRNOS = frozenset({errno.ENETDOWN, errno.ENXIO, errno.ENODEV})


def drain(sock):
    """Every PFC frame waiting on a non-blocking packet socket, as (source MAC, {priority:
    quanta}); anything else on the socket is skipped. A socket whose link is down
    yields nothing (``LINK_GONE_ERRNOS``)."""
    while True:
        try:
            data = sock.recv(256)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in LINK_GONE_ERRNOS:
                return
            raise
        parsed = parse(data)
        if parsed is not None:
            yield parsed


def pause_ns(quanta: int, real_rate_bps: float) -> float:
    """How long ``quanta`` pause a link, in real-fabric nanoseconds (x dilation to emulate)."""
    return quanta * QUANTUM_BITS * 1e9 / real_rate_bps
