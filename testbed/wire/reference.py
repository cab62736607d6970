"""Reference builds of RoCEv2 frames with Scapy: what the fast path in ``roce`` is checked
against in the tests and benchmarks. The only module that imports Scapy."""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from testbed.wire.roce import OP_CNP, PSN_MASK, ROCE_UDP_PORT, Endpoint


def scapy_bytes(src: Endpoint, dst: Endpoint, sport: int, dscp: int, ecn: int, opcode: int, dqpn: int,
                psn: int, ackreq: bool = False, payload: bytes = b"", aeth: tuple | None = None) -> bytes:
    """A whole frame built by Scapy, ICRC included."""
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
