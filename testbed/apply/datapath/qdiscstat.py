"""Counters of one qdisc per netlink request, with no dependency (the controller reads
them every interval; pyroute2 dumps every qdisc of the machine per call: ~1.6 ms against
~7 us for one RTM_GETQDISC over a raw socket)."""

from __future__ import annotations

import os
import socket
import struct

# where tc.PortTc puts the data class's TBF: under the mq root (1:), on TX queue 0 (1:1)
TBF_HANDLE = 0x100000  # 10:
TBF_PARENT = 0x10001  # 1:1
NETLINK_TIMEOUT_S = 5
# rtnetlink wire format for one RTM_GETQDISC
RTM_NEWQDISC, RTM_GETQDISC, NLMSG_ERROR = 36, 38, 2
NLM_F_REQUEST, NLM_F_ECHO = 1, 8  # a single-qdisc GET answers only with ECHO
TCA_KIND, TCA_STATS2 = 1, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3


def qdisc_request(seq: int, ifindex: int, handle: int = TBF_HANDLE, parent: int = TBF_PARENT) -> bytes:
    """nlmsghdr + tcmsg asking for one qdisc."""
    tcm = struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, handle, parent, 0)
    return struct.pack("=IHHII", 16 + len(tcm), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_ECHO, seq, 0) + tcm


def _attrs(data: bytes):
    off = 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            return
        yield kind & 0x3FFF, data[off + 4:off + length]
        off += (length + 3) & ~3


def parse_qdisc_reply(reply: bytes) -> dict:
    """Kind and counters from an RTM_NEWQDISC message (TCA_STATS2: basic + queue)."""
    length, msg_type = struct.unpack_from("=IH", reply)
    if msg_type == NLMSG_ERROR:
        err = struct.unpack_from("=i", reply, 16)[0]
        raise OSError(-err, os.strerror(-err))
    out = {}
    for kind, value in _attrs(reply[16 + 20:length]):
        if kind == TCA_KIND:
            out["kind"] = value.rstrip(b"\0").decode()
        elif kind == TCA_STATS2:
            for sub, v in _attrs(value):
                if sub == TCA_STATS_BASIC:
                    out["sent_bytes"], out["sent_packets"] = struct.unpack_from("=QI", v)
                elif sub == TCA_STATS_QUEUE:
                    qlen, backlog, drops, _requeues, overlimits = struct.unpack_from("=5I", v)
                    out.update(backlog_bytes=backlog, backlog_packets=qlen, drops=drops, overlimits=overlimits)
    return out


class QdiscReader:
    """One raw rtnetlink socket; ``read(ifindex)`` returns one qdisc's kind and counters
    (raises OSError when the interface or qdisc is gone)."""

    def __init__(self):
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.nl.bind((0, 0))
        self.nl.settimeout(NETLINK_TIMEOUT_S)
        self.seq = 0

    def close(self):
        self.nl.close()

    def read(self, ifindex: int, handle: int = TBF_HANDLE, parent: int = TBF_PARENT) -> dict:
        self.seq += 1
        self.nl.sendto(qdisc_request(self.seq, ifindex, handle, parent), (0, 0))
        while True:
            reply = self.nl.recv(65536)
            if struct.unpack_from("=I", reply, 8)[0] == self.seq:
                return parse_qdisc_reply(reply)
