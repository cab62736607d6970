"""RoCEv2 frames: the patched fast path equals Scapy's build (ICRC included) and golden bytes."""

import pytest

from testbed.wire import roce
from testbed.wire.reference import scapy_bytes

A = roce.Endpoint("00:00:00:00:01:01", "10.0.1.1")
B = roce.Endpoint("00:00:00:00:02:01", "10.0.2.1")
# Scapy 2.8's build of RC SEND_MIDDLE, DSCP 26 + ECT(0), dqpn 2049, PSN 0x123456, AckReq,
# payload 00..63; the last 4 bytes are the ICRC (checked by hand against Scapy's compute_icrc)
GOLDEN = bytes.fromhex(
    "0000000002010000000001010800456a009000004000401122f20a0001010a000201c12312b7007c0000"
    "0100ffff0000080180123456" + bytes(range(100)).hex() + "9464258e")


def test_data_frame_matches_golden_bytes():
    t = roce.FrameTemplate(A, B, 0xC123, roce.qpn(2, 1), 100, roce.DSCP_DATA, roce.ECT0)
    assert t.frame(roce.OP_SEND_MIDDLE, 0x123456, True, bytes(range(100))) == GOLDEN


@pytest.mark.parametrize("opcode,psn,ackreq", [(roce.OP_SEND_FIRST, 0, False), (roce.OP_SEND_LAST, 0xFFFFFF, True),
                                               (roce.OP_SEND_ONLY, 77, True)])
def test_patched_frames_equal_scapy_builds(opcode, psn, ackreq):
    payload = bytes(4096)
    t = roce.FrameTemplate(A, B, 0xC001, 3000, len(payload), roce.DSCP_DATA, roce.ECT0)
    # the template is reused: a frame must not depend on the one before it
    t.frame(roce.OP_SEND_MIDDLE, 12345, not ackreq, payload)
    ref = scapy_bytes(A, B, 0xC001, roce.DSCP_DATA, roce.ECT0, opcode, 3000, psn, ackreq, payload)
    assert t.frame(opcode, psn, ackreq, payload) == ref
    assert len(ref) == roce.wire_bytes(4096) == 4154


def test_ack_nak_and_cnp_frames_equal_scapy_and_parse_back():
    ack = roce.FrameTemplate(B, A, 0xC002, 1026, roce.AETH_LEN, roce.DSCP_DATA, 0)
    body = bytes([roce.AETH_NAK_SEQ, 0, 0, 9])
    frame = ack.frame(roce.OP_ACK, 500, False, body)
    assert frame == scapy_bytes(B, A, 0xC002, roce.DSCP_DATA, 0, roce.OP_ACK, 1026, 500,
                                     aeth=(roce.AETH_NAK_SEQ, 9))
    p = roce.parse(frame[roce.OFF_BTH:])
    assert (p.opcode, p.dqpn, p.psn, p.syndrome, p.msn) == (roce.OP_ACK, 1026, 500, roce.AETH_NAK_SEQ, 9)

    cnp = roce.FrameTemplate(B, A, 0xC002, 1026, roce.CNP_PAD_LEN, roce.DSCP_CNP, 0)
    frame = cnp.frame(roce.OP_CNP, 0, False, bytes(16))
    assert frame == scapy_bytes(B, A, 0xC002, roce.DSCP_CNP, 0, roce.OP_CNP, 1026, 0)
    assert frame[roce.OFF_IP + 1] == roce.DSCP_CNP << 2  # not ECN-capable: never marked


def test_parse_data_and_reject_runts():
    p = roce.parse(GOLDEN[roce.OFF_BTH:])
    assert (p.opcode, p.dqpn, p.psn, p.ackreq, p.payload_len) == (roce.OP_SEND_MIDDLE, 2049, 0x123456, True, 100)
    assert roce.parse(b"\x00" * 10) is None


def test_qpn_and_entropy():
    assert roce.qpn(1, 2) == 1026 and roce.qpn(1024, 1023) < 2 ** 24
    ports = {roce.udp_source_port(roce.qpn(1, d), roce.qpn(d, 1)) for d in range(2, 26)}
    assert len(ports) > 20 and all(0xC000 <= p <= 0xFFFF for p in ports)
