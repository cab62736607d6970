"""The UET model, pure: the receiver's out-of-order placement and SACK bookkeeping, the
sender's selective retransmission (UET 1.0 PDS RUD, 3.5), and NSCC's window rules (3.6.13)."""

import pytest

from testbed.agent.nscc import Nscc, Params
from testbed.agent.uet import ACK_EVERY, UetRecvQP, UetSendQP
from testbed.wire import roce
from testbed.units import Dilation

MTU = 4096
PKT = roce.wire_bytes(MTU)


def data(r, psn, last=False, ackreq=False, ce=False):
    return r.on_data(psn, roce.OP_SEND_LAST if last else roce.OP_SEND_MIDDLE, MTU, ackreq, ce)


def sack_fields(body):
    cack, bitmap, rcvd, flags = roce.SACK.unpack(body)
    return cack, [cack + 1 + i for i in range(64) if bitmap >> i & 1], rcvd, flags


def test_the_receiver_places_packets_in_any_order_and_completes_a_message_once_whole():
    r = UetRecvQP()
    replies = [data(r, psn, last=psn == 5) for psn in (2, 0, 5, 4, 3)]
    assert [done for _, done in replies] == [[], [], [], [], []]  # PSN 1 still missing
    assert r.expected == 1 and r.out_of_order == 4 and sorted(r.above) == [2, 3, 4, 5]
    sack, done = data(r, 1)
    assert done == [6 * MTU] and r.expected == 6 and not r.above  # the gap filled: the message, whole
    cack, sacked, rcvd, flags = sack_fields(sack)
    assert (cack, sacked, flags) == (6, [], 0)
    assert rcvd == -(-6 * PKT // 256)  # Rcvd_Bytes: new bytes in 256-byte units, rounded up (3.6.13.9)


def test_a_sack_reports_the_holes_and_every_ack_every_packets():
    r = UetRecvQP()
    replies = [data(r, psn)[0] for psn in (0, 2, 3, 5)]
    assert replies[:ACK_EVERY - 1] == [None] * (ACK_EVERY - 1) and replies[ACK_EVERY - 1] is not None
    cack, sacked, _, _ = sack_fields(replies[-1])
    assert cack == 1 and sacked == [2, 3, 5]  # PSN 1 and 4 missing


def test_duplicates_are_acknowledged_at_once_and_counted_once():
    r = UetRecvQP()
    data(r, 0)
    data(r, 3)
    assert data(r, 3)[0] is not None and data(r, 0)[0] is not None
    assert r.duplicates == 2 and r.bytes == MTU and r.rcvd_bytes == 2 * PKT


def test_the_m_flag_carries_a_ce_mark_to_the_next_sack_only():
    r = UetRecvQP()
    data(r, 0, ce=True)
    first = data(r, 1, ackreq=True)[0]
    second = data(r, 2, ackreq=True)[0]
    assert sack_fields(first)[3] == roce.SACK_FLAG_M and sack_fields(second)[3] == 0


def test_a_trimmed_packet_is_nacked_once_unless_it_already_arrived():
    r = UetRecvQP()
    data(r, 0)
    assert r.on_trimmed(1) and not r.on_trimmed(0)
    assert (r.trimmed, r.naks_sent) == (2, 1)


class Window:
    """A stand-in NSCC that never limits the window, to test the sender's bookkeeping alone."""

    def __init__(self):
        self.inflight, self.nacks, self.losses, self.acked = 0, 0, 0, 0

    def can_send(self):
        return True

    def ack_request(self, nbytes):
        return False

    def on_send(self, nbytes):
        self.inflight += nbytes

    def on_ack(self, nbytes, marked, rtt, now):
        self.inflight -= nbytes
        self.acked += nbytes

    def on_nack(self, nbytes, rtt, now):
        self.inflight -= nbytes
        self.nacks += 1

    def on_inferred_loss(self, nbytes):
        self.inflight -= nbytes
        self.losses += 1


def send_all(q, now=0):
    out = []
    while q.has_pending():
        p = q.peek()
        q.sent(p, now)
        out.append(p.psn)
    return out


def sack(cack, sacked=(), flags=0):
    bitmap = sum(1 << (p - cack - 1) for p in sacked)
    return roce.SACK.pack(cack, bitmap, 0, flags)


def test_the_sender_retransmits_exactly_the_nacked_packets():
    cc = Window()
    q = UetSendQP(MTU, cc, dilation=Dilation(1.0))
    q.post(8 * MTU)
    assert send_all(q) == list(range(8))
    assert q.on_sack(7, sack(2, (3, 5, 6, 7)), 100) == []  # 2 and 4 missing
    q.on_nack(2, 110)
    q.on_nack(4, 120)
    q.on_nack(4, 121)  # a second NACK for a packet already queued changes nothing
    assert send_all(q, 200) == [2, 4] and q.retransmitted == 2
    assert q.on_sack(4, sack(8), 300) == [0]  # every PSN below 8: the message is done
    assert not q.unacked and cc.inflight == 0 and cc.acked == 8 * PKT - 2 * PKT + 2 * PKT


def test_a_timeout_resends_only_what_was_not_acknowledged():
    cc = Window()
    q = UetSendQP(MTU, cc, dilation=Dilation(1.0))
    q.post(4 * MTU)
    send_all(q, 0)
    q.on_sack(3, sack(0, (1, 3)), 50)  # PSN 0 and 2 lost without a trim
    assert not q.check_timeout(100, 1000)
    assert q.check_timeout(1050, 1000)
    assert send_all(q, 1100) == [0, 2] and q.timeouts == 1 and cc.losses == 2
    # both retransmissions were the timer's, none a NACK's
    assert q.retransmitted == q.timeout_resends == 2


def test_a_packet_the_timer_queued_and_an_ack_took_back_is_not_counted_as_resent():
    cc = Window()
    q = UetSendQP(MTU, cc, dilation=Dilation(1.0))
    q.post(4 * MTU)
    send_all(q, 0)
    q.on_sack(3, sack(0, (1, 3)), 50)  # PSN 0 and 2 not acknowledged yet
    assert q.check_timeout(1050, 1000)
    q.on_sack(2, sack(3), 1060)  # every PSN below 3 after all, before the resend went
    assert send_all(q, 1100) == [] and q.retransmitted == q.timeout_resends == 0
    # a NACK's resend is not the timer's
    q.post(MTU)
    send_all(q, 1200)
    q.on_nack(4, 1210)
    assert send_all(q, 1300) == [4] and (q.retransmitted, q.timeout_resends) == (1, 0)


def test_rtt_samples_only_from_packets_sent_once():
    """3.6.13.1: the ACK of a retransmitted packet may be for either copy."""
    samples = []

    class Recorder(Window):
        def on_ack(self, nbytes, marked, rtt, now):
            samples.append(rtt)

    q = UetSendQP(MTU, Recorder(), dilation=Dilation(10.0), rtt_missing_ns=5.0)
    q.post(2 * MTU)
    send_all(q, 0)
    q.on_nack(0, 100)
    send_all(q, 200)
    q.on_sack(1, sack(0, (1,)), 1000)  # triggered by PSN 1, sent once at 0
    q.on_sack(0, sack(2), 1500)  # triggered by PSN 0, retransmitted
    assert samples == [1000 / 10 + 5, None]


# -- NSCC (3.6.13.5 / 3.6.13.6) ----------------------------------------------------------
BASE_RTT = 2_000.0


def nscc(trimming=False):
    return Nscc(MTU, 400e9, BASE_RTT, trimming, now_ns=0)


def test_nscc_defaults_follow_the_spec():
    cc = nscc(trimming=True)
    bdp = 400e9 / 8 * BASE_RTT / 1e9
    assert cc.cwnd == cc.max_wnd == pytest.approx(1.5 * bdp)  # MaxWnd
    assert cc.target_ns == 0.75 * BASE_RTT and nscc().target_ns == BASE_RTT  # 3.6.13.3
    assert cc.alpha == pytest.approx(4.0 * (bdp / 150_000) * (cc.target_ns / 12_000) * MTU / cc.target_ns)
    assert cc.qa_threshold_ns == float("inf") and nscc().qa_threshold_ns == 4 * BASE_RTT


def test_case_no_ecn_low_delay_increases_in_proportion_to_the_headroom():
    cc = nscc()
    cc.cwnd = 20 * MTU
    cc.on_ack(PKT, False, BASE_RTT + 500, now_ns=10)  # delay 500 < target 2000
    assert cc.counts["proportional"] == 1
    assert cc.inc_bytes == pytest.approx(cc.alpha * PKT * (cc.target_ns - 500))


def test_case_no_ecn_high_delay_is_a_fair_increase():
    cc = nscc()
    cc.on_ack(PKT, False, BASE_RTT + 2500, now_ns=10)
    assert cc.counts["fair"] == 1 and cc.inc_bytes == pytest.approx(cc.fi * PKT)


def test_case_ecn_with_low_delay_changes_nothing():
    cc = nscc()
    before = cc.cwnd
    cc.on_ack(PKT, True, BASE_RTT + 100, now_ns=10)
    assert cc.counts["hold"] == 1 and cc.cwnd == before and cc.inc_bytes == 0


def test_case_ecn_with_high_delay_cuts_the_window_once_per_base_rtt():
    cc = nscc()
    cc.avg_delay_ns = 3 * BASE_RTT  # the running average the cut scales by
    w = cc.cwnd
    cc.on_ack(PKT, True, BASE_RTT + 3 * BASE_RTT, now_ns=3 * BASE_RTT)
    avg = cc.avg_delay_ns
    assert cc.counts["decrease"] == 1
    # the cut, then the adjustment due (a base RTT passed since the last): + eta
    assert cc.cwnd == pytest.approx(w * max(1 - 0.8 * (avg - cc.target_ns) / avg, 0.5) + cc.eta)
    w = cc.cwnd
    cc.on_ack(PKT, True, 4 * BASE_RTT, now_ns=3 * BASE_RTT + 10)  # within a base RTT: no second cut
    assert cc.cwnd == w


def test_accumulated_increases_are_applied_after_adjust_bytes():
    cc = nscc()
    cc.cwnd = 10 * MTU
    for _ in range(8):  # 8 packets with their headers > adjust_bytes (8 MTU)
        cc.on_ack(PKT, False, BASE_RTT + 2500, now_ns=10)
    assert cc.received_bytes == 0 and cc.cwnd > 10 * MTU and cc.inc_bytes == 0


def test_a_trim_nack_triggers_quick_adapt_to_the_delivered_bytes():
    cc = nscc(trimming=True)
    cc.on_ack(PKT, False, BASE_RTT, now_ns=1)  # opens the first quick-adapt period
    for t in range(2, 4):
        cc.on_send(PKT)
        cc.on_ack(PKT, False, BASE_RTT, now_ns=t)
    cc.on_nack(PKT, None, now_ns=int(3 * BASE_RTT))
    assert cc.counts["quick_adapt"] == 1 and cc.cwnd == max(2 * PKT, MTU)


def test_can_send_keeps_an_mtu_of_room():
    cc = Nscc(MTU, 400e9, BASE_RTT, False, 0, Params(max_wnd_bdp=0.1))  # 10 KB window
    cc.on_send(PKT)
    assert cc.can_send()
    cc.on_send(PKT)
    assert not cc.can_send()
