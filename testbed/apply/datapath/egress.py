"""Apply: every switch egress port gets its planned queue (TBF shaper + FIFO, and the
ECN/WRED marker on clsact egress; netem link delay where the kernel has it), and reads of
the port counters.

``EgressQueues`` is entered after the fabric is up; the qdiscs go away with the
fabric's interfaces, the marker's pins when this context exits.
"""

from __future__ import annotations

import time

from testbed.wire import bpfmaps
from testbed.model import queues
from testbed.model.placement import WHOLE, Site
from testbed.apply.datapath.marker import Marker
from testbed.apply.datapath.tc import PortTc


class EgressQueues:
    def __init__(self, plan, run_id: str, link_delay: bool = False, site: Site = WHOLE):
        """The PortQueues of ``site`` (model.placement.Site.queues: every planned port, or a
        cluster share's, its tunnel ends included)."""
        self.plan, self.run_id, self.link_delay = plan, run_id, link_delay
        self.ports = site.queues(plan)
        self.by_ifindex: dict[int, queues.PortQueue] = {}
        self.marker: Marker | None = None
        self.tc: PortTc | None = None

    def __enter__(self):
        self.marker = Marker(self.run_id).__enter__()
        try:
            self.tc = PortTc()
            for pq in self.ports:
                idx = self.tc.apply(pq.intf, pq.emulated_rate_bps, pq.burst_bytes, pq.fifo_limit_bytes,
                                    self.marker.prog_fd)
                self.marker.configure(idx, pq)
                if self.link_delay and pq.emulated_delay_ns > 0:
                    self.tc.add_delay(pq.intf, pq.emulated_delay_ns)
                self.by_ifindex[idx] = pq
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.tc is not None:
            self.tc.close()
            self.tc = None
        if self.marker is not None:
            self.marker.__exit__(None, None, None)
            self.marker = None
        return False

    def depth_sample(self, intf: str) -> tuple[float, int, bool]:
        """(shadow depth, TBF backlog, clean) of one port, in bytes. The netlink read of the
        TBF takes ~0.1-1 ms; the shadow is evaluated at its midpoint, and ``clean`` says no
        packet reached the port meanwhile (else the two views differ by those arrivals)."""
        idx = self.tc.ifindex(intf)
        before = self.marker.state.lookup(idx, lock=True)
        t0 = time.monotonic_ns()
        backlog = self.tc.qdisc_stats(intf)["backlog_bytes"]
        t1 = time.monotonic_ns()
        after = self.marker.state.lookup(idx, lock=True)
        if before is None:
            return 0.0, backlog, after is None
        state = bpfmaps.marker_state(before)
        cfg = self.marker.cfg.lookup(idx)  # the rate in force (a link event may have slowed the port)
        rate = bpfmaps.cfg_rate_bps(cfg) if cfg else self.by_ifindex[idx].emulated_rate_bps
        shadow = bpfmaps.shadow_depth_now(state, rate, (t0 + t1) // 2)
        clean = after is not None and bpfmaps.marker_state(after)["packets"] == state["packets"]
        return shadow, backlog, clean

    def counters(self, intf: str) -> dict:
        """Marker counters of one port (no epoch bump: max depth is since the last Marker.read)."""
        raw = self.marker.state.lookup(self.tc.ifindex(intf), lock=True)
        return bpfmaps.marker_state(raw) if raw else {}
