"""DCQCN reaction point (the sender's rate control), pure: every method takes ``now_ns``
(real-fabric time) and returns nothing; ``rate_bps`` is the current rate in real units.

Algorithm: Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015
(rate cut Rc <- Rc (1 - alpha / 2) on a CNP, at most once per rate_reduce_monitor_period;
alpha EWMA updated every dce_tcp_rtt, up if a CNP came in the period, else down; fast
recovery / additive / hyper increase driven by a timer and a byte counter). Parameters:
NVIDIA ConnectX firmware defaults as published for mlx5
(``/sys/class/net/*/ecn/roce_rp/*``, mlxconfig): rpg_time_reset 300 us, rpg_byte_reset
32767 (in 64-byte units: 2 MB), rpg_threshold 1, rpg_ai_rate 5 Mb/s, rpg_hai_rate 50 Mb/s,
rpg_min_dec_fac 50 %, rpg_min_rate 1 Mb/s, rate_reduce_monitor_period 4 us,
initial_alpha_value 1023 (= 1.0), dce_tcp_g 1019 (alpha gain g = (1024 - 1019) / 1024),
dce_tcp_rtt 1 us (alpha update period), clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1;
notification point: min_time_between_cnps 4 us.

Three readings that matter, as models of the firmware do (Google's isekai RoCE model;
Spirent TestCenter's DCQCN profile, ByteReset 2 MB): the byte counter counts 64-byte
units, so a rate-increase event every ~2 MB sent, not every 32 KB (at 400G a 32 KB counter
returns a cut flow to its old rate in ~5 us, before the 4 us decrease period can act
again: DCQCN then never holds a queue); and a cut sets the target rate to the current rate
only if the rate has increased since the previous cut (clamp_tgt_rate 0,
clamp_tgt_rate_after_time_inc 1), so back-to-back cuts keep the rate the flow had before
the congestion as its target; an increase event looks at the stage counters before
counting itself, so with rpg_threshold 1 the first event after a cut is fast recovery.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    time_reset_ns: int = 300_000
    byte_reset: int = 32767 * 64  # bytes (the firmware's 32767 is in 64-byte units)
    threshold: int = 1
    ai_bps: float = 5e6
    hai_bps: float = 50e6
    min_dec_factor: float = 0.5
    min_rate_bps: float = 1e6
    reduce_period_ns: int = 4_000
    initial_alpha: float = 1.0
    g: float = (1024 - 1019) / 1024
    alpha_period_ns: int = 1_000
    cnp_interval_ns: int = 4_000  # notification point: at most one CNP per QP per interval
    clamp_target: bool = False  # clamp_tgt_rate: every cut sets the target to the current rate
    clamp_after_time_inc: bool = True  # clamp_tgt_rate_after_time_inc


class ReactionPoint:
    def __init__(self, line_bps: float, now_ns: int, params: Params = Params(), enabled: bool = True):
        self.p, self.line_bps, self.enabled = params, line_bps, enabled
        self.rate_bps = self.target_bps = line_bps
        self.alpha = params.initial_alpha
        self.timer_count = self.byte_count = 0
        self.bytes_since = 0
        self.last_cut_ns = None
        self.cnp_since_alpha = False
        self.next_alpha_ns = now_ns + params.alpha_period_ns
        self.next_timer_ns = now_ns + params.time_reset_ns
        self.active = False  # increase events only run after a first cut
        self.cnps = 0
        self.cuts = 0

    def on_cnp(self, now_ns: int):
        self.cnps += 1
        if not self.enabled:
            return
        if self.last_cut_ns is None:
            # "initial_alpha_value: the alpha used when receiving the first CNP for a flow"
            self.alpha = self.p.initial_alpha
            self.next_alpha_ns = now_ns + self.p.alpha_period_ns
        self.cnp_since_alpha = True
        if self.last_cut_ns is not None and now_ns - self.last_cut_ns < self.p.reduce_period_ns:
            return
        self.last_cut_ns = now_ns
        self.cuts += 1
        if self.p.clamp_target or self.byte_count > 0 or (self.p.clamp_after_time_inc and self.timer_count > 0):
            self.target_bps = self.rate_bps  # the rate had recovered some way: aim for that, not the old target
        factor = max(1 - self.alpha / 2, self.p.min_dec_factor)
        self.rate_bps = max(self.rate_bps * factor, self.p.min_rate_bps)
        self.timer_count = self.byte_count = self.bytes_since = 0
        self.next_timer_ns = now_ns + self.p.time_reset_ns
        self.active = True

    def on_sent(self, nbytes: int, now_ns: int):
        if not (self.enabled and self.active):
            return
        self.bytes_since += nbytes
        while self.bytes_since >= self.p.byte_reset:
            self.bytes_since -= self.p.byte_reset
            self._increase()
            self.byte_count += 1

    def tick(self, now_ns: int):
        """Run the alpha and rate-increase timers up to ``now_ns``."""
        if not self.enabled:
            return
        while now_ns >= self.next_alpha_ns:
            # every dce_tcp_rtt: alpha rises if a CNP came in the period, else decays
            self.alpha = (1 - self.p.g) * self.alpha + (self.p.g if self.cnp_since_alpha else 0)
            self.cnp_since_alpha = False
            self.next_alpha_ns += self.p.alpha_period_ns
        while now_ns >= self.next_timer_ns:
            self.next_timer_ns += self.p.time_reset_ns
            if self.active:
                self._increase()
                self.timer_count += 1

    def next_event_ns(self) -> int:
        return min(self.next_alpha_ns, self.next_timer_ns)

    def _increase(self):
        # the stage counters are those before this event (as the firmware models count them):
        # with rpg_threshold 1 the first event after a cut is fast recovery
        f = self.p.threshold
        if max(self.timer_count, self.byte_count) < f:
            pass  # fast recovery: move halfway back to the target
        elif min(self.timer_count, self.byte_count) > f:
            self.target_bps += (min(self.timer_count, self.byte_count) - f) * self.p.hai_bps  # hyper increase
        else:
            self.target_bps += self.p.ai_bps  # additive increase
        self.target_bps = min(self.target_bps, self.line_bps)
        self.rate_bps = min((self.target_bps + self.rate_bps) / 2, self.line_bps)
        if self.rate_bps >= self.line_bps * 0.9999 and self.target_bps >= self.line_bps:
            self.rate_bps = self.line_bps
            self.active = False
