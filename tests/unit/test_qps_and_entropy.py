"""Queue pairs per connection and sender-chosen entropy (flow, spray, flowlet), on the
agent's loop with a fake clock and fake sockets: which QP and UDP source port each packet
takes, and when a split message's send and receive complete."""

import itertools

import pytest

from testbed.agent.transport import split_message
from testbed.wire import roce

from test_agent_loop import MTU, make_agent, op  # noqa: F401 (make_agent: a fixture)


@pytest.mark.parametrize("nbytes,qps", [(0, 4), (1, 4), (MTU, 4), (10 * MTU + 7, 4), (3 * MTU, 8), (64 * MTU, 8),
                                        (5 * MTU, 1)])
def test_a_split_message_keeps_its_bytes_and_its_packet_count(nbytes, qps):
    parts = split_message(nbytes, MTU, qps)
    packets = max(1, -(-nbytes // MTU))
    assert sum(b for _, b in parts) == nbytes
    assert sum(max(1, -(-b // MTU)) for _, b in parts) == packets  # no extra packet on the wire
    assert [qp for qp, _ in parts] == list(range(min(qps, packets)))  # the first QPs, each once
    sizes = [max(1, -(-b // MTU)) for _, b in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_qp_numbers_carry_the_qp_index_and_stay_unique():
    seen = set()
    for local, remote in ((1, 2), (2, 1), (1023, 1), (5, 1023)):
        for qp in range(8):
            for nv in (0, roce.NVLINK_QPN_BIT):
                n = roce.qpn(local, remote, qp) | nv
                assert n < 2 ** 24 and n not in seen
                seen.add(n)
                assert roce.split_qpn(n) == (local, remote, qp, bool(nv))
    assert roce.qpn(1, 2, 0) == roce.qpn(1, 2) == 1026  # one QP per connection: the numbers of before


@pytest.fixture
def agent_with(make_agent):
    def make(ops, **transport):
        agent, clock, rx, _ = make_agent(ops, **transport)
        return agent, clock, rx
    return make


def run_until_sent(agent, clock, packets, limit=10_000):
    nic = agent.nics["fabric"]
    for _ in range(limit):
        if len(nic.sent) >= packets:
            break
        clock.now = agent.step(clock.now)
    return nic.sent


def headers(frame):
    sport = int.from_bytes(frame[roce.OFF_UDP:roce.OFF_UDP + 2], "big")
    return sport, roce.parse(frame[roce.OFF_UDP + roce.UDP_LEN:])


def peer_frame(opcode, dqpn, psn, body, dscp=roce.DSCP_CONTROL):
    h2 = roce.Endpoint("02:01:00:00:02:01", "10.0.2.1")
    me = roce.Endpoint("02:01:00:00:01:01", "10.0.1.1")
    t = roce.FrameTemplate(h2, me, 0xC000, dqpn, len(body), dscp, 0)
    return (t.frame(opcode, psn, True, body)[roce.OFF_UDP + roce.UDP_LEN:], [], 0, None)


def ack(dqpn, psn):
    return peer_frame(roce.OP_ACK, dqpn, psn, bytes([roce.AETH_ACK, 0, 0, 1]))


def test_four_qps_stripe_a_message_and_the_send_waits_for_every_part(agent_with):
    agent, clock, rx = agent_with([op(0, "send", peer="h2", nbytes=8 * MTU)], qps_per_connection=4)
    sent = run_until_sent(agent, clock, 8)
    by_qp = {}
    for frame in sent:
        sport, p = headers(frame)
        by_qp.setdefault(p.dqpn, set()).add(sport)
    assert sorted(roce.split_qpn(q)[2] for q in by_qp) == [0, 1, 2, 3]  # two packets on each of 4 QPs
    assert all(len(s) == 1 for s in by_qp.values()) and len({s.pop() for s in by_qp.values()}) == 4
    # their QPs on h2 (the ACKs' destination) are ours with the roles swapped
    for qp in range(3):
        rx.queue.append(ack(roce.qpn(1, 2, qp), 1))
    agent.step(clock.now)
    assert agent.state[0] == "running"  # three of four parts acknowledged
    rx.queue.append(ack(roce.qpn(1, 2, 3), 1))
    agent.step(clock.now)
    assert agent.state[0] == "done"


def test_a_receive_completes_when_every_qp_delivered_its_part(agent_with):
    agent, clock, rx = agent_with([op(0, "recv", peer="h2", nbytes=3 * MTU), op(1, "recv", peer="h2", nbytes=MTU)],
                                  qps_per_connection=4)
    data = lambda qp, psn: peer_frame(roce.OP_SEND_ONLY, roce.qpn(1, 2, qp), psn, bytes(MTU), roce.DSCP_DATA)
    # message 0 uses QPs 0-2, message 1 only QP 0: QP 2 first, then QP 0's two parts
    rx.queue += [data(2, 0), data(0, 0), data(0, 1)]
    agent.step(clock.now)
    assert agent.state == {0: "running", 1: "running"}  # QP 1's part of message 0 is missing
    rx.queue.append(data(1, 0))
    clock.now += 1000
    agent.step(clock.now)
    assert agent.state == {0: "done", 1: "done"}


@pytest.mark.parametrize("balance,every", [("flow", None), ("spray", 1), ("spray", 4)])
def test_spray_moves_the_source_port_every_n_packets(agent_with, balance, every):
    extra = {"spray_packets": every} if every else {}
    n = roce.SPRAY_ENTROPY_VALUES * (every or 1) + 8
    agent, clock, _ = agent_with([op(0, "send", peer="h2", nbytes=n * MTU)], load_balancing=balance, **extra)
    ports = [headers(f)[0] for f in run_until_sent(agent, clock, n)]
    if balance == "flow":
        assert len(set(ports)) == 1
        return
    runs = [len(list(g)) for _, g in itertools.groupby(ports)]
    assert set(runs[:-1]) == {every}  # each port for exactly N packets, then the next
    distinct = ports[:roce.SPRAY_ENTROPY_VALUES * every:every]
    assert len(set(distinct)) >= roce.SPRAY_ENTROPY_VALUES - 2  # 14-bit hashes: a collision or two at most
    assert ports[roce.SPRAY_ENTROPY_VALUES * every] == ports[0]  # round robin over the set


def test_flowlet_keeps_the_port_within_a_burst_and_moves_after_a_gap(agent_with):
    gap_real_ns = 2_000
    agent, clock, rx = agent_with([op(0, "send", peer="h2", nbytes=20 * MTU), op(1, "compute", [0], duration_ns=5_000),
                                  op(2, "send", [1], peer="h2", nbytes=20 * MTU)],
                                 load_balancing="flowlet", flowlet_gap_ns=gap_real_ns)
    first = [headers(f)[0] for f in run_until_sent(agent, clock, 20)]
    assert len(set(first)) == 1  # back to back at line rate: one flowlet
    rx.queue.append(ack(roce.qpn(1, 2), 19))
    second = [headers(f)[0] for f in run_until_sent(agent, clock, 40)[20:]]
    assert len(set(second)) == 1 and second[0] != first[0]  # idle 5 us > 2 us: a new flowlet, a new port
