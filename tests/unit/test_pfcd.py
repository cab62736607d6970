"""The PFC process's decisions on a fake clock and fake ports (no root): XOFF out of every
feeder when a queue passes XOFF, refreshed before the pause runs out, XON once no congested
queue needs a feeder paused; a received pause stops the port's data class for its quanta
at the real rate x D, a resume or the quanta running out restarts it (rate back, restart
frame through the qdisc), and a link event's rate waits for the resume. The frames are the
real bytes (``wire.pfc``), decoded back here."""

import io
import json
import struct

import pytest

from testbed.apply.processes.pfcd import Pfcd
from testbed.apply.datapath.tc import PAUSED_RATE_BPS
from testbed.config import scenario
from testbed.model import plan as planning
from testbed.model.plan_file import PlanFile
from testbed.wire import bpfmaps, pfc

D = 50_000
T0 = 10 ** 12  # the fake CLOCK_MONOTONIC at the start, ns


class FakeSock:
    def __init__(self):
        self.sent, self.inbox = [], []

    def send(self, data: bytes):
        self.sent.append(data)

    def quanta_sent(self) -> list:
        """The lossless priority's quanta of every PFC frame sent (restart frames pause nothing)."""
        return [q[pfc.LOSSLESS_PRIORITY] for _, q in map(pfc.parse, self.sent) if pfc.LOSSLESS_PRIORITY in q]


class FakePorts:
    """SwitchPorts in memory: marker state and config per ifindex, the TBF rates set."""

    def __init__(self, plan: PlanFile):
        self.queues = {pq.intf: pq for pq in plan.queues}
        self.index, self.socks, self.restarts = {}, {}, {}
        self.state_raw, self.cfg_raw, self.published, self.rates = {}, {}, {}, []

    def open_port(self, intf):
        i = self.index[intf] = len(self.index) + 1
        self.socks[intf], self.restarts[intf] = FakeSock(), FakeSock()
        pq = self.queues[intf]
        self.cfg_raw[i] = struct.pack(bpfmaps.CFG_FORMAT, int(pq.emulated_rate_bps), pq.burst_bytes,
                                      pq.buffer_bytes, 0, 0, 0, 0, 0)
        return i, f"02:ff:00:00:00:{i:02x}", self.socks[intf], self.restarts[intf]

    def drain(self, sock):
        frames, sock.inbox = sock.inbox, []
        return [pfc.parse(f) for f in frames]

    def state(self, ifindex):
        return self.state_raw.get(ifindex)

    def cfg(self, ifindex):
        return self.cfg_raw.get(ifindex)

    def set_cfg(self, ifindex, raw):
        self.cfg_raw[ifindex] = raw

    def publish(self, ifindex, raw):
        self.published[ifindex] = bpfmaps.pfc_counters(raw)

    def set_rate(self, intf, rate_bps, burst_bytes, limit_bytes):
        self.rates.append((intf, rate_bps))

    # what the test does to the fabric
    def depth(self, intf, depth_bytes, now_ns):
        """The marker saw a packet at ``now_ns`` leaving ``depth_bytes`` in the shadow queue."""
        fields = dict.fromkeys(bpfmaps.STATE_FIELDS, 0) | {"depth_bytes": depth_bytes, "last_ns": now_ns}
        self.state_raw[self.index[intf]] = struct.pack(bpfmaps.STATE_FORMAT, *fields.values())

    def paused_flag(self, intf) -> int:
        return struct.unpack(bpfmaps.CFG_FORMAT, self.cfg_raw[self.index[intf]])[bpfmaps.CFG_PAUSED]

    def cfg_rate(self, intf) -> int:
        return bpfmaps.cfg_rate_bps(self.cfg_raw[self.index[intf]])


@pytest.fixture
def pfcd():
    """The default fabric's PFC process at D = 50000 on fake ports, a clock the test sets."""
    planned = planning.build(scenario.load("default", [f"dilation={D}"]))
    plan = PlanFile.from_dict(json.loads(json.dumps(planned.to_dict())))
    clock = {"now": T0}
    dp, out = FakePorts(plan), io.StringIO()
    daemon = Pfcd(plan, dp, out, clock=lambda: clock["now"])
    daemon.fake, daemon.out_text, daemon.clock_state = dp, out, clock
    return daemon


def events(daemon) -> list:
    return [json.loads(line) for line in daemon.out_text.getvalue().splitlines()]


def test_xoff_goes_out_of_every_feeder_is_refreshed_and_xon_follows(pfcd):
    dp, q = pfcd.fake, pfcd.ports["leaf1-eth1"]
    feeders = ["leaf1-eth2", "leaf1-eth3", "leaf1-eth4"]  # h5 on the same rail, both spines
    assert list(q.feeders) == feeders
    pause_emulated_ns = pfc.pause_ns(pfc.MAX_QUANTA, 400e9) * D  # 65535 x 512 bit at 400G, x D
    dp.depth("leaf1-eth1", q.pq.xoff_bytes + 1000, T0)
    pfcd.poll_queues(T0)
    assert [dp.socks[f].quanta_sent() for f in feeders] == [[pfc.MAX_QUANTA]] * 3
    assert dp.socks["leaf1-eth1"].sent == []  # the congested port itself pauses nobody
    # still above XOFF: no new frame until half the pause has run out, then a refresh
    dp.depth("leaf1-eth1", q.pq.xoff_bytes + 1000, T0 + 1000)
    pfcd.poll_queues(T0 + 1000)
    assert all(len(dp.socks[f].sent) == 1 for f in feeders)
    later = T0 + int(pause_emulated_ns / 2) + 1
    dp.depth("leaf1-eth1", q.pq.xoff_bytes + 1000, later)
    pfcd.poll_queues(later)
    assert [dp.socks[f].quanta_sent() for f in feeders] == [[pfc.MAX_QUANTA] * 2] * 3
    # drained to XON: quanta 0 to every feeder
    dp.depth("leaf1-eth1", q.pq.xon_bytes, later + 1000)
    pfcd.poll_queues(later + 1000)
    assert [dp.socks[f].quanta_sent()[-1] for f in feeders] == [0] * 3
    sent = [(e["event"], e["port"]) for e in events(pfcd) if e["event"] in ("xoff_sent", "xon_sent")]
    assert sent == [("xoff_sent", f) for f in feeders] * 2 + [("xon_sent", f) for f in feeders]
    assert dp.published[pfcd.ports["leaf1-eth3"].ifindex]["xoff_sent"] == 2


def test_a_feeder_stays_paused_while_another_congested_queue_needs_it(pfcd):
    dp = pfcd.fake
    # both GPU ports of leaf1 congested: both spines feed both of them
    for intf in ("leaf1-eth1", "leaf1-eth2"):
        dp.depth(intf, pfcd.ports[intf].pq.xoff_bytes + 1, T0)
    pfcd.poll_queues(T0)
    assert dp.socks["leaf1-eth3"].quanta_sent() == [pfc.MAX_QUANTA] * 2
    dp.depth("leaf1-eth1", 0, T0 + 1000)
    pfcd.poll_queues(T0 + 1000)
    assert dp.socks["leaf1-eth3"].quanta_sent() == [pfc.MAX_QUANTA] * 2  # leaf1-eth2 still needs the spine paused
    assert dp.socks["leaf1-eth2"].quanta_sent() == [pfc.MAX_QUANTA, 0]  # h5 fed only leaf1-eth1's queue
    dp.depth("leaf1-eth2", 0, T0 + 2000)
    pfcd.poll_queues(T0 + 2000)
    assert dp.socks["leaf1-eth3"].quanta_sent() == [pfc.MAX_QUANTA] * 2 + [0]


def test_a_received_pause_stops_the_data_class_for_its_quanta_at_the_dilated_real_rate(pfcd):
    dp, port = pfcd.fake, pfcd.ports["leaf1-eth3"]
    emulated = port.pq.emulated_rate_bps
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: 100}))
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame(port.mac, {pfc.LOSSLESS_PRIORITY: 100}))  # our own: ignored
    pfcd.receive(port, T0)
    assert dp.rates == [("leaf1-eth3", PAUSED_RATE_BPS)] and dp.paused_flag("leaf1-eth3") == 1
    assert port.frames_received == 1
    # 100 quanta = 51200 bit-times: 128 ns at 400G, 6.4 ms at D = 50000
    assert port.paused_until_ns == T0 + 6_400_000
    pfcd.expire(T0 + 6_399_999)
    assert port.paused_since_ns == T0
    pfcd.expire(T0 + 6_400_000)
    assert dp.rates[-1] == ("leaf1-eth3", emulated) and dp.paused_flag("leaf1-eth3") == 0
    assert len(dp.restarts["leaf1-eth3"].sent) == 1  # the TBF's watchdog restarted
    assert pfc.parse(dp.restarts["leaf1-eth3"].sent[0])[1] == {}  # a frame that pauses nothing
    assert port.paused_total_ns == 6_400_000
    # a resume (quanta 0) ends a pause at once
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: pfc.MAX_QUANTA}))
    pfcd.receive(port, T0 + 10 ** 7)
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: 0}))
    pfcd.receive(port, T0 + 10 ** 7 + 500)
    assert port.paused_since_ns is None and port.paused_total_ns == 6_400_000 + 500
    assert [e["event"] for e in events(pfcd)] == ["paused", "resumed", "paused", "resumed"]


def test_a_link_events_rate_waits_for_the_resume_and_sets_the_quanta_length(pfcd):
    dp, port = pfcd.fake, pfcd.ports["leaf1-eth3"]
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: pfc.MAX_QUANTA}))
    pfcd.receive(port, T0)
    pfcd.set_rate(100e9, ["leaf1-eth3"], T0 + 1)
    assert dp.rates == [("leaf1-eth3", PAUSED_RATE_BPS)]  # paused: the TBF keeps the paused rate
    assert dp.cfg_rate("leaf1-eth3") == 100e9 / D  # the shadow queue drains at the new rate
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: 0}))
    pfcd.receive(port, T0 + 2)
    assert dp.rates[-1] == ("leaf1-eth3", 100e9 / D)
    # 100 quanta at 100G: 512 ns real, 25.6 ms here
    dp.socks["leaf1-eth3"].inbox.append(pfc.frame("02:aa:00:00:00:01", {pfc.LOSSLESS_PRIORITY: 100}))
    pfcd.receive(port, T0 + 3)
    assert port.paused_until_ns == T0 + 3 + 25_600_000


def test_a_quiet_queue_is_not_read_until_it_could_reach_xoff(pfcd):
    dp, q = pfcd.fake, pfcd.ports["leaf1-eth1"]
    dp.depth("leaf1-eth1", 0, T0)
    pfcd.poll_queues(T0)
    # empty, fed by 3 ports at 400G / D (8 Mbit/s each): XOFF minus their buckets and OVS batches
    # away, at 24 Mbit/s
    room = q.pq.xoff_bytes - q.slack_bytes
    assert q.fill_bps == 3 * 8e6 and q.quiet_until_ns == T0 + int(room * 8 / 24e6 * 1e9)
    # a depth above XOFF before then (it cannot be) is not seen: the queue is not read
    dp.depth("leaf1-eth1", q.pq.xoff_bytes + 1, q.quiet_until_ns - 1)
    pfcd.poll_queues(q.quiet_until_ns - 1)
    assert dp.socks["leaf1-eth2"].sent == []
    pfcd.poll_queues(q.quiet_until_ns)
    assert dp.socks["leaf1-eth2"].quanta_sent() == [pfc.MAX_QUANTA]
