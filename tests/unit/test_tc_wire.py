"""The one-qdisc RTM_GETQDISC request and reply parsing, as bytes (no root needed)."""

import struct

import pytest

from testbed.apply.datapath import qdiscstat


def test_request_golden_bytes():
    # nlmsghdr: len 36, RTM_GETQDISC (38), NLM_F_REQUEST|NLM_F_ECHO, seq 7, pid 0
    # tcmsg: AF_UNSPEC, ifindex 42, handle 10:0 (the data class's TBF), parent 1:1, info 0
    assert qdiscstat.qdisc_request(7, 42) == bytes.fromhex(
        "24000000" "2600" "0900" "07000000" "00000000"
        "00000000" "2a000000" "00001000" "01000100" "00000000")


def _attr(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + bytes(-len(raw) % 4)


def test_reply_parsing():
    stats2 = _attr(1, struct.pack("=QI", 123456, 789) + bytes(4)) + _attr(3, struct.pack("=5I", 3, 4500, 2, 0, 17))
    attrs = _attr(1, b"tbf\0") + _attr(7, stats2)
    tcm = struct.pack("=BxxxiIII", 0, 42, 0x10000, 0xFFFFFFFF, 1)
    reply = struct.pack("=IHHII", 16 + len(tcm) + len(attrs), 36, 0, 7, 0) + tcm + attrs
    assert qdiscstat.parse_qdisc_reply(reply) == {"kind": "tbf", "sent_bytes": 123456, "sent_packets": 789,
                                           "backlog_bytes": 4500, "backlog_packets": 3, "drops": 2,
                                           "overlimits": 17}


def test_error_reply_raises():
    reply = struct.pack("=IHHII", 36, 2, 0, 7, 0) + struct.pack("=i", -2) + bytes(16)
    with pytest.raises(OSError) as err:
        qdiscstat.parse_qdisc_reply(reply)
    assert err.value.errno == 2
