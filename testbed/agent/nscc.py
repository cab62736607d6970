"""NSCC, the Ultra Ethernet sender-based congestion control (UET 1.0 spec, section 3.6.13),
pure: every method takes ``now_ns`` (real-fabric time) and the window is in bytes.

A window (``cwnd``) bounds the bytes in flight (``can_send``: inflight + MTU <= cwnd,
3.6.13.5). Each ACK brings the newly acknowledged bytes, whether the acknowledged packet
was ECN-marked (the ACK's M flag) and an RTT sample; delay = RTT - base RTT. The four
cases of ``on_ack`` (3.6.13.5):
  no ECN, delay <  target: proportional_increase (and fast_increase near zero delay)
  no ECN, delay >= target: fair_increase (queues draining: additive, converges to fairness)
  ECN,    delay <  target: nothing (mild marking is a load-balancing symptom, not congestion)
  ECN,    delay >= target: multiplicative_decrease (cwnd x max(1 - gamma (avg - target) /
                           avg, max_md_jump), at most once per base RTT)
Increases accumulate in ``inc_bytes`` and are applied by ``fulfill_adjustment`` (cwnd +=
inc_bytes / cwnd, + eta once per adjust period) every adjust_bytes acknowledged or every
adjust period. ``quick_adapt`` (on a trim NACK, or a delay above qa_threshold) sets the
window to what was delivered in the last base RTT + target, once per such period, if that
is below max_wnd / 2^qa_gate, then ignores the ACKs of what was in flight (3.6.13.6).
``on_nack`` (a trimmed packet, 3.6.13.5): the delay is taken as the base RTT, quick_adapt
is triggered, else cwnd -= one packet. ``on_inferred_loss`` (a timeout): cwnd -= one packet.

Constants: target_qdelay = 0.75 x base RTT with trimming, 1.0 x without, and alpha =
4 x scaling_a x scaling_b x MTU / target_qdelay (3.6.13.3), with scaling_a = BDP /
150 KB and scaling_b = target_qdelay / 12 us. The defaults of Table 3-82 of UEC 1.0.3
(MaxWnd 1.5 BDP, gamma 0.8, max_md_jump 0.5, fi 5 MTU x scaling_a, fi_scale 0.25 x
scaling_a, eta 0.15 MTU x scaling_a, qa_gate 3, qa_threshold 4 x target_qdelay without
trimming and off with it, adjust_bytes 8 MTU, adjust_period 1 base RTT) are as an ns-3
model of NSCC quotes them: the table itself was not available to us. Two choices the spec
leaves to implementations: ``delay ~= 0`` in fast_increase is within 1 us (the tolerance
of the UEC's htsim model of NSCC), and the average delay is an EWMA with gain 1/8.
Not modelled: destination flow control (Rcv_Cwnd_Pend, 3.6.13.2), the probe control
packet for base RTT (3.6.13.7), and RCCC (receiver credits, 3.6.14).
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE_BDP_BYTES = 150_000
REFERENCE_RTT_NS = 12_000


@dataclass(frozen=True)
class Params:
    max_wnd_bdp: float = 1.5
    gamma: float = 0.8
    max_md_jump: float = 0.5
    fi_mtu: float = 5.0  # x scaling_a
    fi_scale: float = 0.25  # x scaling_a
    eta_mtu: float = 0.15  # x scaling_a
    alpha_gain: float = 4.0
    qa_gate: int = 3
    qa_threshold_targets: float = 4.0  # without trimming; with it quick_adapt waits for a trim
    adjust_bytes_mtu: int = 8
    adjust_period_rtts: float = 1.0
    clear_delay_ns: int = 1_000
    delay_gain: float = 1 / 8


class Nscc:
    def __init__(self, mtu_bytes: int, line_bps: float, base_rtt_ns: float, trimming: bool, now_ns: int,
                 params: Params = Params()):
        p = self.p = params
        self.mtu = mtu_bytes
        self.line_bps = line_bps
        self.config_base_rtt_ns = self.base_rtt_ns = base_rtt_ns
        bdp = line_bps / 8 * base_rtt_ns / 1e9
        self.target_ns = base_rtt_ns * (0.75 if trimming else 1.0)
        scaling_a = bdp / REFERENCE_BDP_BYTES
        scaling_b = self.target_ns / REFERENCE_RTT_NS
        self.alpha = p.alpha_gain * scaling_a * scaling_b * mtu_bytes / self.target_ns  # bytes per ns
        self.fi = p.fi_mtu * mtu_bytes * scaling_a
        self.fi_scale = p.fi_scale * scaling_a
        self.eta = p.eta_mtu * mtu_bytes * scaling_a
        self.qa_threshold_ns = float("inf") if trimming else p.qa_threshold_targets * self.target_ns
        self.adjust_bytes = p.adjust_bytes_mtu * mtu_bytes
        self.adjust_period_ns = p.adjust_period_rtts * base_rtt_ns
        self.max_wnd = self.cwnd = p.max_wnd_bdp * bdp  # Table 3-77: cwnd starts at MaxWnd
        self.inflight = 0
        self.achieved_bytes = self.received_bytes = self.fi_count = 0
        self.trigger_qa = False
        self.qa_endtime = 0
        self.bytes_to_ignore = self.bytes_ignored = 0
        self.inc_bytes = 0.0
        self.last_adjust_ns = self.last_dec_ns = now_ns
        self.increase = False
        self.avg_delay_ns = 0.0
        self.counts = {"proportional": 0, "fair": 0, "hold": 0, "decrease": 0, "quick_adapt": 0, "nack": 0}

    # -- the interface (3.6.13.5) -----------------------------------------------------------
    def can_send(self) -> bool:
        return self.inflight + self.mtu <= self.cwnd

    def ack_request(self, nbytes: int) -> bool:
        """Ask the destination for an ACK when the window is (nearly) full once this
        ``nbytes`` packet is in flight (the spec counts it in inflight before asking)."""
        return self.cwnd - (self.inflight + nbytes) < self.mtu

    def on_send(self, nbytes: int):
        self.inflight += nbytes

    def on_ack(self, newly_rcvd_bytes: int, marked: bool, rtt_ns: float | None, now_ns: int):
        """An ACK acknowledged ``newly_rcvd_bytes``; ``rtt_ns`` None when the acknowledged
        packet's RTT is ambiguous (``calculate_rtt``: retransmitted more than once, or an ACK
        of the original for a retransmitted packet)."""
        self.inflight -= newly_rcvd_bytes
        self.bytes_ignored += newly_rcvd_bytes
        self.received_bytes += newly_rcvd_bytes
        self.achieved_bytes += newly_rcvd_bytes
        if rtt_ns is None:
            return
        self._update_base_rtt(rtt_ns)
        delay = rtt_ns - self.base_rtt_ns
        self._update_delay(delay)
        if self._quick_adapt(False, marked, delay, now_ns):
            return
        if not marked and delay >= self.target_ns:
            self.counts["fair"] += 1
            self._fair_increase(newly_rcvd_bytes)
        elif not marked:
            self.counts["proportional"] += 1
            self._proportional_increase(newly_rcvd_bytes, delay)
        elif delay >= self.target_ns:
            self.counts["decrease"] += 1
            self._multiplicative_decrease(now_ns)
        else:
            self.counts["hold"] += 1
        if now_ns - self.last_adjust_ns >= self.adjust_period_ns or self.received_bytes > self.adjust_bytes:
            self._fulfill_adjustment(now_ns)

    def on_nack(self, nbytes: int, rtt_ns: float | None, now_ns: int):
        """A NACK for a trimmed packet of ``nbytes`` (it left the window; it will be resent)."""
        self.counts["nack"] += 1
        self.inflight -= nbytes
        if rtt_ns is not None:
            self._update_base_rtt(rtt_ns)
        self._update_delay(self.config_base_rtt_ns)  # a trim: the queue was full
        self.bytes_ignored += nbytes
        self.trigger_qa = True
        if not self._quick_adapt(True, True, 0, now_ns):
            self.cwnd = max(self.cwnd - nbytes, self.mtu)

    def on_inferred_loss(self, nbytes: int):
        """A packet presumed lost (retransmission timeout)."""
        self.cwnd = max(self.cwnd - nbytes, self.mtu)
        self.bytes_ignored += nbytes
        self.inflight -= nbytes

    # -- internal functions (3.6.13.6) ------------------------------------------------------
    def _fulfill_adjustment(self, now_ns: int):
        self.cwnd += self.inc_bytes / self.cwnd
        if now_ns - self.last_adjust_ns >= self.adjust_period_ns:
            self.last_adjust_ns = now_ns
            self.cwnd += self.eta
        self.cwnd = min(self.cwnd, self.max_wnd)
        self.inc_bytes = 0.0
        self.received_bytes = 0

    def _fair_increase(self, nbytes: int):
        self.inc_bytes += self.fi * nbytes

    def _proportional_increase(self, nbytes: int, delay: float):
        self._fast_increase(nbytes, delay)
        if self.increase:
            return
        self.inc_bytes += self.alpha * nbytes * (self.target_ns - delay)

    def _fast_increase(self, nbytes: int, delay: float):
        if abs(delay) <= self.p.clear_delay_ns:
            self.fi_count += nbytes
            if self.fi_count > self.cwnd or self.increase:
                self.cwnd = min(self.cwnd + nbytes * self.fi_scale, self.max_wnd)
                self.increase = True
                return
        else:
            self.fi_count = 0
        self.increase = False

    def _multiplicative_decrease(self, now_ns: int):
        self.increase = False
        self.fi_count = 0
        avg = self.avg_delay_ns
        if avg > self.target_ns and now_ns - self.last_dec_ns > self.base_rtt_ns:
            self.cwnd *= max(1 - self.p.gamma * (avg - self.target_ns) / avg, self.p.max_md_jump)
            self.cwnd = max(self.cwnd, self.mtu)
            self.last_dec_ns = now_ns

    def _quick_adapt(self, is_loss: bool, marked: bool, delay: float, now_ns: int) -> bool:
        done = False
        if self.bytes_ignored < self.bytes_to_ignore and marked:
            done = True  # still ignoring the ACKs of what was in flight at the last quick_adapt
        elif now_ns >= self.qa_endtime:
            if self.qa_endtime != 0 and (self.trigger_qa or is_loss or delay > self.qa_threshold_ns) \
                    and self.achieved_bytes < self.max_wnd / (1 << self.p.qa_gate):
                self.counts["quick_adapt"] += 1
                self.cwnd = max(self.achieved_bytes, self.mtu)
                self.bytes_to_ignore = self.inflight
                self.bytes_ignored = 0
                self.trigger_qa = False
                done = True
            self.achieved_bytes = 0
            self.qa_endtime = now_ns + self.base_rtt_ns + self.target_ns
        if done:
            self.inc_bytes = 0.0
            self.received_bytes = 0
        return done

    def _update_base_rtt(self, rtt_ns: float):
        if rtt_ns < self.base_rtt_ns:
            self.base_rtt_ns = rtt_ns
            self.max_wnd = self.p.max_wnd_bdp * self.line_bps / 8 * rtt_ns / 1e9

    def _update_delay(self, delay: float):
        self.avg_delay_ns += self.p.delay_gain * (delay - self.avg_delay_ns)
