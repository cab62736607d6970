"""One server's agents in one event loop (testbed.agent.server.serve) on a fake clock: each
agent is stepped when its own next event is due, none waits for another's, and the
deadline ends them all with their unfinished ops recorded."""

import json

from testbed.agent import server
from testbed.agent.runner import Agent

from helpers.fakes import Clock, Inbox
from test_agent_loop import D, MTU, FakeNic, gpu_config, op, rc_transport


def agents_on(clock, tmp_path, schedules):
    out = []
    for i, ops in enumerate(schedules, start=1):
        peer = 2 if i == 1 else 1
        cfg = gpu_config(i, peer, ops, rc_transport(), tmp_path)
        out.append(Agent(cfg, clock=clock, open_nic=FakeNic, open_rx=Inbox, open_pause=lambda intf: Inbox()))
    return out


def records(agent):
    agent.out.flush()
    return [json.loads(line) for line in open(agent.cfg.records)]


def sleeping(clock, woken=()):
    def wait(socks, timeout_s):
        clock.now += int(timeout_s * 1e9)  # nothing arrives: the timeout passes
        return list(woken)
    return wait


def test_each_agent_is_stepped_when_its_own_timer_is_due(tmp_path):
    clock = Clock()
    a, b = agents_on(clock, tmp_path, [[op(0, "compute", duration_ns=30), op(1, "compute", [0], duration_ns=10)],
                                       [op(0, "compute", duration_ns=5)]])
    t0 = clock.now
    assert server.serve([a, b], t0, t0 + 10**12, clock=clock, wait=sleeping(clock)) == 0
    ends = {(r["gpu"], r["id"]): r["end_ns"] - t0 for ag in (a, b) for r in records(ag) if r["type"] == "op"}
    assert ends == {("h1", 0): 30 * D, ("h1", 1): 40 * D, ("h2", 0): 5 * D}
    # each compute phase was noticed on time: b's short timer did not wait behind a's
    assert a.nic_counters["timer_late_ns"] < 0.001 * 40 * D and b.nic_counters["timer_late_ns"] < 0.001 * 5 * D


def test_the_deadline_ends_every_agent_still_running(tmp_path):
    clock = Clock()
    a, b = agents_on(clock, tmp_path, [[op(0, "compute", duration_ns=5)], [op(0, "compute", duration_ns=10**6)]])
    t0 = clock.now
    assert server.serve([a, b], t0, t0 + 100 * D, clock=clock, wait=sleeping(clock)) == 4
    assert [r["type"] for r in records(a)] == ["op"]  # a finished before the deadline
    (abort,) = [r for r in records(b) if r["type"] == "abort"]
    assert abort["reason"] == "deadline" and abort["waiting"][0]["id"] == 0


def test_a_gpu_done_before_the_others_of_its_server_still_answers_its_peers(tmp_path):
    """h1 has nothing to do; h2 computes. A retransmitted packet for h1 (its ACK was lost)
    arrives while h2 still runs: h1 answers it then, not once the whole server is done."""
    from testbed.wire import roce
    clock = Clock()
    a, b = agents_on(clock, tmp_path, [[], [op(0, "compute", duration_ns=1000)]])
    peer = roce.Endpoint("02:01:00:00:02:01", "10.0.2.1")
    data = roce.FrameTemplate(peer, a.nics["fabric"].me, 0xC000, roce.qpn(1, 2), 0, roce.DSCP_DATA, 0)
    frame = data.frame(roce.OP_SEND_ONLY, 0, True, bytes(MTU))
    sent_at = []
    a.nics["fabric"].send = lambda f: sent_at.append((clock.now, roce.parse(f[roce.OFF_UDP + roce.UDP_LEN:])))
    t0 = clock.now

    def wait(socks, timeout_s):
        clock.now += min(int(timeout_s * 1e9), 10 * D)
        if clock.now == t0 + 10 * D:  # the first wait: the packet arrives
            a.rx.queue.append((frame[roce.OFF_UDP + roce.UDP_LEN:], [], 0, None))
            return [a.rx]
        return []

    assert server.serve([a, b], t0, t0 + 10**12, clock=clock, wait=wait) == 0
    assert [(t, p.opcode) for t, p in sent_at] == [(t0 + 10 * D, roce.OP_ACK)]  # answered on arrival
    assert b.state[0] == "done"  # h2 computed until t0 + 1000 D, long after
