"""RoCEv2 on the wire: frame templates built once with Scapy, patched per packet.

The only module that imports Scapy. A ``FrameTemplate`` holds one QP direction's
Ethernet/IPv4/UDP(4791)/BTH headers as bytes; the hot path copies it, patches the
BTH opcode, ack-request bit and PSN, and appends the ICRC (CRC-32 of the invariant
fields, computed incrementally from a prefix precomputed at build time). Building a
Scapy packet per send is ~700x slower (DESIGN section 5); the unit tests check the
patched bytes against Scapy's own build of the same packet, ICRC included.

Wire choices (the usual RoCE deployment):
- data: DSCP 26 (the lossless class) with ECT(0), UDP checksum 0 (RoCEv2), DF set;
- ACK/NAK: BTH opcode RC ACKNOWLEDGE + AETH (syndrome 0x1F = ACK, 0x60 = NAK PSN
  sequence error), in the control class (DSCP 48), so a paused data class never holds
  the acknowledgements that would drain it;
- CNP: BTH opcode 0x81 + 16 reserved bytes, DSCP 48 (NVIDIA's ``cnp_dscp`` default),
  not ECN-capable, so it is never marked and belongs to the control class.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

ROCE_UDP_PORT = 4791
ECT0, CE = 0b10, 0b11
DSCP_DATA = 26
DSCP_CNP = 48
DSCP_CONTROL = DSCP_CNP  # the switch ports' control class (bpf/marker.c)

OP_SEND_FIRST = 0x00
OP_SEND_MIDDLE = 0x01
OP_SEND_LAST = 0x02
OP_SEND_ONLY = 0x04
OP_ACK = 0x11
OP_CNP = 0x81
AETH_ACK = 0x1F  # ACK, credit count "invalid" (no end-to-end credits)
AETH_NAK_SEQ = 0x60  # NAK: PSN sequence error (the requester goes back N)
PSN_MASK = 0xFFFFFF
NVLINK_QPN_BIT = 1 << 22  # QPs on a server's NVLink segment (``qpn`` uses the low 20 bits)

ETH_LEN, IP_LEN, UDP_LEN, BTH_LEN, AETH_LEN, ICRC_LEN, CNP_PAD_LEN = 14, 20, 8, 12, 4, 4, 16
OFF_IP = ETH_LEN
OFF_UDP = OFF_IP + IP_LEN
OFF_BTH = OFF_UDP + UDP_LEN
OFF_PAYLOAD = OFF_BTH + BTH_LEN
HEADER_BYTES = OFF_PAYLOAD + ICRC_LEN  # Ethernet to ICRC around a data payload: 58 bytes


def wire_bytes(payload_bytes: int) -> int:
    """Bytes a data packet with this payload occupies on a link (Ethernet header on, FCS off,
    as Linux counts them)."""
    return payload_bytes + HEADER_BYTES


def qpn(local: int, remote: int) -> int:
    """QP number of GPU ``local``'s QP connected to GPU ``remote`` (1-based GPU numbers):
    unique per pair, never 0 or 1 (special QPs), fits in 24 bits up to 1024 GPUs."""
    return (local << 10) | remote


def udp_source_port(src_qpn: int, dst_qpn: int) -> int:
    """The ECMP entropy a RoCE NIC puts in the UDP source port: a hash of the QP pair,
    kept in the dynamic range."""
    return 0xC000 | (zlib.crc32(struct.pack("!II", src_qpn, dst_qpn)) & 0x3FFF)


@dataclass(frozen=True)
class Endpoint:
    mac: str
    ip: str  # without prefix length


def scapy_bytes(src: Endpoint, dst: Endpoint, sport: int, dscp: int, ecn: int, opcode: int, dqpn: int,
                psn: int, ackreq: bool = False, payload: bytes = b"", aeth: tuple | None = None) -> bytes:
    """A whole frame built by Scapy, ICRC included: the reference the fast path is checked
    against, and the builder for rare packets."""
    bth = BTH(opcode=opcode, dqpn=dqpn, psn=psn & PSN_MASK, ackreq=int(ackreq))
    if aeth is not None:
        bth = bth / AETH(syndrome=aeth[0], msn=aeth[1])
    elif opcode == OP_CNP:
        bth = bth / CNPPadding()
    # Scapy's BTH computes the ICRC over everything after it, so the payload goes inside
    bth = bth / Raw(payload) if payload else bth
    return bytes(Ether(src=src.mac, dst=dst.mac, type=0x0800)
                 / IP(src=src.ip, dst=dst.ip, tos=(dscp << 2) | ecn, ttl=64, flags="DF", id=0)
                 / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=0) / bth)


class FrameTemplate:
    """One direction of one QP, for packets whose BTH is followed by ``body_len`` bytes
    (payload, or AETH, or CNP padding). ``frame(opcode, psn, ackreq, body)`` returns the
    frame to send."""

    def __init__(self, src: Endpoint, dst: Endpoint, sport: int, dqpn: int, body_len: int, dscp: int, ecn: int):
        ref = scapy_bytes(src, dst, sport, dscp, ecn, OP_SEND_ONLY, dqpn, 0, payload=bytes(body_len))
        self.head = bytearray(ref[:OFF_PAYLOAD])
        self.body_len = body_len
        # ICRC: CRC-32 over 8 x 0xFF (the absent LRH), the IP header with TOS, TTL and
        # checksum set to all ones, the UDP header with checksum all ones, the BTH with its
        # FECN/BECN/reserved byte all ones, then the payload (IBA annex A17).
        masked = bytearray(ref[OFF_IP:OFF_BTH])
        masked[1] = 0xFF  # TOS
        masked[8] = 0xFF  # TTL
        masked[10:12] = b"\xff\xff"  # IP checksum
        masked[IP_LEN + 6:IP_LEN + 8] = b"\xff\xff"  # UDP checksum
        self._crc_prefix = zlib.crc32(b"\xff" * 8 + bytes(masked))
        self.dqpn = dqpn

    def frame(self, opcode: int, psn: int, ackreq: bool, body: bytes) -> bytes:
        h = self.head
        h[OFF_BTH] = opcode
        h[OFF_BTH + 8] = 0x80 if ackreq else 0
        h[OFF_BTH + 9] = (psn >> 16) & 0xFF
        h[OFF_BTH + 10] = (psn >> 8) & 0xFF
        h[OFF_BTH + 11] = psn & 0xFF
        bth = h[OFF_BTH:OFF_PAYLOAD]
        bth[4] = 0xFF  # FECN, BECN, reserved: ones for the ICRC
        crc = zlib.crc32(body, zlib.crc32(bth, self._crc_prefix))
        return bytes(h) + body + struct.pack("<I", crc)


@dataclass(frozen=True)
class Parsed:
    """What a receiver needs from a RoCE datagram (the UDP payload: BTH onwards)."""

    opcode: int
    dqpn: int
    psn: int
    ackreq: bool
    payload_len: int
    syndrome: int = 0  # AETH, ACK/NAK only
    msn: int = 0


_BTH = struct.Struct("!BBHII")


def parse(datagram: bytes) -> Parsed | None:
    """Parse a UDP 4791 payload; None when it is too short to be RoCE."""
    if len(datagram) < BTH_LEN + ICRC_LEN:
        return None
    opcode, _flags, _pkey, dqpn, psn = _BTH.unpack_from(datagram)
    dqpn &= PSN_MASK
    ackreq = bool(psn >> 31)
    psn &= PSN_MASK
    if opcode == OP_ACK:
        if len(datagram) < BTH_LEN + AETH_LEN + ICRC_LEN:
            return None
        aeth = struct.unpack_from("!I", datagram, BTH_LEN)[0]
        return Parsed(opcode, dqpn, psn, ackreq, 0, syndrome=aeth >> 24, msn=aeth & PSN_MASK)
    return Parsed(opcode, dqpn, psn, ackreq, len(datagram) - BTH_LEN - ICRC_LEN)
