"""PFC (IEEE 802.1Qbb) as pure data and decisions: the frame, its pause time in real and
emulated units, which ports feed a congested egress queue, and the XOFF/XON hysteresis.

``testbed.pfcd`` applies these on the data plane.

Frame (60 bytes before the FCS): destination 01:80:c2:00:00:01, the sending port's MAC,
EtherType 0x8808 (MAC control), opcode 0x0101 (priority-based flow control), a
class-enable vector (bit p set: the quanta for priority p are valid) and eight 16-bit
pause quanta, one per priority, then zero padding. One quantum is 512 bit-times at the
link's real rate; quanta 0 resumes (XON).
"""

from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass

from testbed.model.plan import lookup

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


def drain(sock):
    """Every PFC frame waiting on a non-blocking packet socket, as (source MAC, {priority:
    quanta}); anything else on the socket is skipped."""
    while True:
        try:
            data = sock.recv(256)
        except BlockingIOError:
            return
        parsed = parse(data)
        if parsed is not None:
            yield parsed


def pause_ns(quanta: int, real_rate_bps: float) -> float:
    """How long ``quanta`` pause a link, in real-fabric nanoseconds (x dilation to emulate)."""
    return quanta * QUANTUM_BITS * 1e9 / real_rate_bps


def feeders(plan, switch: str, egress_port: int) -> tuple[int, ...]:
    """Ports of ``switch`` whose arriving traffic the planned routes can send out of
    ``egress_port``: the upstream neighbours feeding that queue, which its PFC pauses.
    A host port feeds every egress its routes use; a switch neighbour feeds it only with
    destinations it routes toward this switch (so a leaf never pauses an uplink for
    another uplink: traffic does not turn around at a leaf)."""
    routes: dict[str, list] = {}
    for r in plan.routes:
        routes.setdefault(r.switch, []).append(r)
    hosts = [h.addr for h in plan.hosts]

    def out_ports(sw: str, addr: str) -> tuple:
        return lookup(routes.get(sw, ()), addr)

    dests = [a for a in hosts if egress_port in out_ports(switch, a)]
    result = []
    for link in plan.fabric_links:
        for here, port, peer, peer_port in ((link.a, link.a_port, link.b, link.b_port),
                                            (link.b, link.b_port, link.a, link.a_port)):
            if here != switch or port == egress_port:
                continue
            if peer in routes:  # a switch: only what it routes to us on this link
                if any(peer_port in out_ports(peer, a) for a in dests):
                    result.append(port)
            elif any(a != plan.host(peer).addr for a in dests):  # a GPU: anything but itself
                result.append(port)
    return tuple(sorted(set(result)))


@dataclass
class Hysteresis:
    """XOFF/XON for one ingress accounting point: pause above ``xoff_bytes`` (and refresh
    the pause before it expires), resume at or below ``xon_bytes``."""

    xoff_bytes: int
    xon_bytes: int
    pause_emulated_ns: float  # how long one XOFF frame pauses the neighbour
    paused_until_ns: float = 0.0

    def update(self, depth_bytes: float, now_ns: float) -> str | None:
        """"xoff" (send a pause), "xon" (send a resume) or None."""
        paused = now_ns < self.paused_until_ns
        if depth_bytes > self.xoff_bytes:
            # refresh at half the pause time so the neighbour never resumes on expiry
            if not paused or now_ns >= self.paused_until_ns - self.pause_emulated_ns / 2:
                self.paused_until_ns = now_ns + self.pause_emulated_ns
                return "xoff"
            return None
        if paused and depth_bytes <= self.xon_bytes:
            self.paused_until_ns = 0.0
            return "xon"
        return None
