"""RoCEv2 on the wire: frame templates declared as header layouts, built once, patched
per packet.

A ``FrameTemplate`` holds one QP direction's Ethernet/IPv4/UDP(4791)/BTH headers as
bytes; the hot path copies it, patches the BTH opcode, ack-request bit and PSN, and
appends the ICRC (CRC-32 of the invariant fields, computed incrementally from a prefix
precomputed at build time). The unit tests check every frame kind against Scapy's own
build of the same packet, ICRC included (``testbed.wire.reference``, the one module that
imports Scapy; the agents never load it), and against golden bytes.

Wire choices (the usual RoCE deployment):
- data: DSCP 26 (the lossless class) with ECT(0), UDP checksum 0 (RoCEv2), DF set;
- ACK/NAK: BTH opcode RC ACKNOWLEDGE + AETH (syndrome 0x1F = ACK, 0x60 = NAK PSN
  sequence error), in the control class (DSCP 48), so a paused data class never holds
  the acknowledgements that would drain it;
- CNP: BTH opcode 0x81 + 16 reserved bytes, DSCP 48 (NVIDIA's ``cnp_dscp`` default),
  not ECN-capable, so it is never marked and belongs to the control class.

The UET transport (``agent.uet``) rides in the same framing (UDP 4791, BTH and its PSN), so
the switches, the marker and tshark treat its packets as RoCE; it is not the Ultra Ethernet
wire format (PDS header on UDP 4793). Its acknowledgements use two opcodes of the
manufacturer-specific range, in the control class:
- SACK (0xC0): BTH PSN = the PSN that triggered it; body ``SACK``: cumulative PSN (every
  PSN below it arrived), 64-bit bitmap of the PSNs from cumulative + 1, Rcvd_Bytes
  (UET 3.6.13.9: new data bytes in 256-byte units, 32 bits), flags (bit 0: M, ECN-CE seen);
- NACK (0xC1): BTH PSN = the PSN of a trimmed packet; body: reason (1 = trimmed), 3 pad.
A trimmed data packet (the switch cut it to its headers, ``queues.trim``) arrives with
DSCP ``DSCP_TRIMMED`` and no payload.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from dataclasses import dataclass

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
OP_UET_SACK = 0xC0
OP_UET_NACK = 0xC1
DSCP_TRIMMED = 46  # a switch-trimmed data packet (control class, bpf/marker.c)
NACK_TRIMMED = 1
SACK = struct.Struct("!IQIB3x")  # cumulative PSN, bitmap, Rcvd_Bytes (256 B units), flags
SACK_BITS = 64
SACK_FLAG_M = 1
AETH_ACK = 0x1F  # ACK, credit count "invalid" (no end-to-end credits)
AETH_NAK_SEQ = 0x60  # NAK: PSN sequence error (the requester goes back N)
PSN_MASK = 0xFFFFFF
NVLINK_QPN_BIT = 1 << 22  # QPs on a server's NVLink segment (``qpn``: GPUs in the low 20 bits)

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


QP_INDEX_BITS = (20, 21, 23)  # a connection's QP index (0..7) in the QP number; bit 22 is NVLink
SPRAY_ENTROPY_VALUES = 64  # distinct UDP source ports a spraying QP cycles through


def qpn(local: int, remote: int, qp: int = 0) -> int:
    """QP number of GPU ``local``'s ``qp``-th QP connected to GPU ``remote`` (1-based GPU
    numbers; ``qp`` < 8): unique per pair and index, never 0 or 1 (special QPs), fits in 24
    bits up to 1023 GPUs."""
    n = (local << 10) | remote
    for i, bit in enumerate(QP_INDEX_BITS):
        if qp >> i & 1:
            n |= 1 << bit
    return n


def split_qpn(n: int) -> tuple:
    """(local GPU, remote GPU, QP index, NVLink?) of a QP number made by ``qpn``."""
    qp = sum(1 << i for i, bit in enumerate(QP_INDEX_BITS) if n >> bit & 1)
    return (n >> 10) & 0x3FF, n & 0x3FF, qp, bool(n & NVLINK_QPN_BIT)


def udp_source_port(src_qpn: int, dst_qpn: int, entropy: int = 0) -> int:
    """The ECMP entropy a RoCE NIC puts in the UDP source port: a hash of the QP pair,
    kept in the dynamic range. ``entropy`` > 0 picks another value for the same QP (a
    spraying sender's per-packet entropy, as Ultra Ethernet's EV)."""
    key = struct.pack("!II", src_qpn, dst_qpn) + (struct.pack("!I", entropy) if entropy else b"")
    return 0xC000 | (zlib.crc32(key) & 0x3FFF)


@dataclass(frozen=True)
class Endpoint:
    mac: str
    ip: str  # without prefix length


_ETH = struct.Struct("!6s6sH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
_BTH_HEAD = struct.Struct("!BBHB3sB3s")
IP_DF = 0x4000
IP_TTL = 64
IP_PROTO_UDP = 17
PKEY_DEFAULT = 0xFFFF


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def headers(src: Endpoint, dst: Endpoint, sport: int, dscp: int, ecn: int, opcode: int, dqpn: int, psn: int,
            ackreq: bool, body_len: int) -> bytes:
    """Ethernet, IPv4 (DF, TTL 64, id 0, checksum), UDP (checksum 0, as RoCEv2 sends) and
    BTH (P_Key 0xFFFF) of a frame whose BTH is followed by ``body_len`` bytes and the ICRC."""
    udp_len = UDP_LEN + BTH_LEN + body_len + ICRC_LEN
    ip = bytearray(_IPV4.pack(0x45, (dscp << 2) | ecn, IP_LEN + udp_len, 0, IP_DF, IP_TTL, IP_PROTO_UDP, 0,
                              ipaddress.ip_address(src.ip).packed, ipaddress.ip_address(dst.ip).packed))
    ip[10:12] = _ip_checksum(bytes(ip)).to_bytes(2, "big")
    bth = _BTH_HEAD.pack(opcode, 0, PKEY_DEFAULT, 0, dqpn.to_bytes(3, "big"), 0x80 if ackreq else 0,
                         (psn & PSN_MASK).to_bytes(3, "big"))
    return (_ETH.pack(bytes.fromhex(dst.mac.replace(":", "")), bytes.fromhex(src.mac.replace(":", "")), 0x0800)
            + bytes(ip) + _UDP.pack(sport, ROCE_UDP_PORT, udp_len, 0) + bth)


class FrameTemplate:
    """One direction of one QP, for packets whose BTH is followed by ``body_len`` bytes
    (payload, or AETH, or CNP padding). ``frame(opcode, psn, ackreq, body)`` returns the
    frame to send."""

    def __init__(self, src: Endpoint, dst: Endpoint, sport: int, dqpn: int, body_len: int, dscp: int, ecn: int):
        ref = headers(src, dst, sport, dscp, ecn, OP_SEND_ONLY, dqpn, 0, False, body_len)
        self.head = bytearray(ref)
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
    body: bytes = b""  # UET SACK / NACK body


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
    if opcode in (OP_UET_SACK, OP_UET_NACK):
        return Parsed(opcode, dqpn, psn, ackreq, 0, body=bytes(datagram[BTH_LEN:len(datagram) - ICRC_LEN]))
    return Parsed(opcode, dqpn, psn, ackreq, len(datagram) - BTH_LEN - ICRC_LEN)
