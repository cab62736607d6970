"""The GPU agent's event loop on a fake clock and fake sockets (no root, no fabric): one
pass at a time, the loop starts ready ops, ends compute on its timer, paces packets at
line rate, completes a send on its ACK and holds data while PFC pauses the NIC."""

import copy
import json
import socket
import struct

import pytest

from testbed.agent.config import AgentConfig, NicSpec, Peer
from testbed.agent.runner import Agent
from testbed.model.training import Transport
from testbed.units import Dilation
from testbed.wire import pfc, roce

from helpers.fakes import Clock, Inbox

D = 1000  # dilation
LINE_BPS = 400e9
MTU = 1024


class FakeNic:
    def __init__(self, link, spec):
        self.link, self.intf, self.line_bps = link, spec.intf, spec.line_bps
        self.me = roce.Endpoint(spec.mac, spec.ip)
        self.free_ns, self.blocked, self.sent = 0, 0, []

    def send(self, frame):
        self.sent.append(frame)


def op(i, kind, deps=(), peer=None, nbytes=0, duration_ns=0):
    return {"id": i, "kind": kind, "iteration": 0, "phase": "dp" if peer else "forward", "collective": -1,
            "step": -1, "peer": peer, "bytes": nbytes, "duration_ns": duration_ns, "deps": list(deps),
            "link": "fabric", "micro_batch": -1}


def rc_transport(dcqcn=False, **fields) -> Transport:
    """The transport of these tests: RoCE at MTU, 128 us RTO, the defaults for the rest."""
    return Transport(mtu_bytes=MTU, dcqcn=dcqcn, dcqcn_params={}, rto_ns=128_000, fabric_line_bps=LINE_BPS,
                     nvlink_line_bps=LINE_BPS, **fields)


def gpu_config(i: int, peer: int, ops: list, transport: Transport, folder) -> AgentConfig:
    """GPU h<i> with one fabric NIC and one peer, h<peer>, on another server."""
    return AgentConfig(gpu=f"h{i}", index=i, server=i, dilation=Dilation(D), transport=transport, ops=ops,
                       records=str(folder / f"h{i}.jsonl"),
                       nics={"fabric": NicSpec(f"h{i}-eth0", f"02:01:00:00:0{i}:01", f"10.0.{i}.1", LINE_BPS)},
                       peers={f"h{peer}": Peer(peer, f"02:01:00:00:0{peer}:01", f"10.0.{peer}.1")})


WALL_NS = 1_700_000_000_000_000_000  # the fake CLOCK_REALTIME the agent reads its arrivals against


@pytest.fixture
def make_agent(tmp_path):
    def make(ops, dcqcn=False, **transport):
        clock, rx, pause = Clock(), Inbox(), Inbox()
        cfg = gpu_config(1, 2, ops, rc_transport(dcqcn=dcqcn, **transport), tmp_path)
        agent = Agent(cfg, clock=clock, open_nic=FakeNic, open_rx=lambda: rx,
                      open_pause=lambda intf: pause, wall=lambda: WALL_NS)
        agent.prepare(clock.now)
        return agent, clock, rx, pause
    return make


def records(agent):
    agent.out.flush()
    return [json.loads(line) for line in open(agent.cfg.records)]


def test_compute_ends_on_its_dilated_timer_then_the_next_op_starts(make_agent):
    agent, clock, _, _ = make_agent([op(0, "compute", duration_ns=5_000), op(1, "compute", [0], duration_ns=1_000)])
    t0 = clock.now
    assert agent.step(t0) == t0 + 5_000 * D  # wake exactly when the compute ends
    clock.now = t0 + 5_000 * D - 1
    agent.step(clock.now)
    assert agent.state[0] == "running"
    clock.now = t0 + 5_000 * D + 7  # woken 7 ns late
    assert agent.step(clock.now) == clock.now + 1_000 * D  # op 1 started in the same pass
    done = [r for r in records(agent) if r["type"] == "op"]
    assert done == [{**done[0], "id": 0, "ready_ns": t0, "end_ns": t0 + 5_000 * D}]  # ends when due, not when seen
    assert agent.nic_counters["timer_late_ns"] == 7


def test_packets_leave_at_line_rate_and_the_send_completes_on_its_ack(make_agent):
    agent, clock, rx, _ = make_agent([op(0, "send", peer="h2", nbytes=3 * MTU)])
    nic = agent.nics["fabric"]
    gap = int(roce.wire_bytes(MTU) * 8 / (LINE_BPS / D) * 1e9)
    t0 = clock.now
    wakes = [agent.step(t0)]
    for _ in range(2):
        clock.now = wakes[-1]
        wakes.append(agent.step(clock.now))
    # one packet per wake, a line-rate gap apart: no burst when a message starts
    assert len(nic.sent) == 3 and wakes[:2] == [t0 + gap, t0 + 2 * gap]
    parsed = [roce.parse(f[roce.OFF_UDP + roce.UDP_LEN:]) for f in nic.sent]
    assert [p.psn for p in parsed] == [0, 1, 2] and [p.opcode for p in parsed] == [
        roce.OP_SEND_FIRST, roce.OP_SEND_MIDDLE, roce.OP_SEND_LAST]
    assert agent.state[0] == "running"  # sent, not yet acknowledged
    ack = roce.FrameTemplate(roce.Endpoint("02:01:00:00:02:01", "10.0.2.1"), nic.me, 0xC000, roce.qpn(1, 2),
                             roce.AETH_LEN, roce.DSCP_CONTROL, 0).frame(roce.OP_ACK, 2, False, bytes([roce.AETH_ACK, 0, 0, 1]))
    rx.queue.append((ack[roce.OFF_UDP + roce.UDP_LEN:], [], 0, None))
    clock.now += 10 * gap
    agent.step(clock.now)
    assert agent.state[0] == "done" and agent.remaining == 0


def test_pfc_pause_holds_data_until_its_quanta_run_out(make_agent):
    agent, clock, _, pause = make_agent([op(0, "send", peer="h2", nbytes=4 * MTU)])
    nic = agent.nics["fabric"]
    t0 = clock.now
    pause.queue.append(pfc.frame("02:01:00:00:00:09", {pfc.LOSSLESS_PRIORITY: 100}))
    wake = agent.step(t0)
    pause_end = t0 + int(D * pfc.pause_ns(100, LINE_BPS))
    assert nic.sent == [] and wake == pause_end  # nothing leaves; wake when the pause runs out
    clock.now = pause_end
    agent.step(clock.now)
    assert len(nic.sent) == 1 and agent.nic_counters["pause_frames_received"] == 1
    assert agent.nic_counters["paused_ns"] == pause_end - t0
    assert [r["type"] for r in records(agent)] == ["paused", "resumed"]


def test_a_message_read_late_is_counted_from_the_kernels_arrival_time(make_agent):
    """The receive socket's ancillary data carries the kernel's arrival time
    (SO_TIMESTAMPNS) and the TOS; the packet that completes a message counts how long it sat
    unread (the fidelity guard's receive lateness), a packet that completes nothing does not,
    and a CE mark is still seen beside the timestamp."""
    agent, clock, rx, _ = make_agent([op(0, "recv", peer="h2", nbytes=2 * MTU)])
    nic = agent.nics["fabric"]
    data = roce.FrameTemplate(roce.Endpoint("02:01:00:00:02:01", "10.0.2.1"), nic.me, 0xC000, roce.qpn(1, 2),
                              MTU, roce.DSCP_DATA, roce.ECT0)

    def arrival(opcode, psn, sat_ns, tos):
        frame = data.frame(opcode, psn, opcode == roce.OP_SEND_LAST, bytes(MTU))
        stamp = divmod(WALL_NS - sat_ns, 10**9)
        return (frame[roce.OFF_UDP + roce.UDP_LEN:],
                [(socket.SOL_SOCKET, 35, struct.pack("@qq", *stamp)), (socket.IPPROTO_IP, socket.IP_TOS, bytes([tos]))],
                0, None)

    rx.queue += [arrival(roce.OP_SEND_FIRST, 0, 9_000, roce.DSCP_DATA << 2 | roce.CE),
                 arrival(roce.OP_SEND_LAST, 1, 2_500, roce.DSCP_DATA << 2 | roce.ECT0)]
    agent.step(clock.now)
    assert agent.state[0] == "done"
    c = agent.nic_counters
    assert (c["rx_done_count"], c["rx_done_late_ns"], c["rx_done_late_max_ns"]) == (1, 2_500, 2_500)
    (ch,) = agent.channels.values()
    assert ch.counters["ce_received"] == 1 and ch.counters["packets_received"] == 2


def control_frame(agent, opcode, psn, body):
    nic = agent.nics["fabric"]
    length = roce.CNP_PAD_LEN if opcode == roce.OP_CNP else roce.AETH_LEN
    frame = roce.FrameTemplate(roce.Endpoint("02:01:00:00:02:01", "10.0.2.1"), nic.me, 0xC000, roce.qpn(1, 2),
                               length, roce.DSCP_CONTROL, 0).frame(opcode, psn, False, body)
    return frame[roce.OFF_UDP + roce.UDP_LEN:], [], 0, None


def test_only_channels_with_work_are_scanned_and_an_idle_ones_dcqcn_catches_up(make_agent):
    """The loop's per-pass scans walk the busy channels only; a channel that went idle
    (everything acknowledged, DCQCN back at line rate) and then gets a CNP ends in the
    state of a reaction point whose timers ran all along (its alpha decayed while idle,
    and the CNP counts in the period it arrived in, not in one long past)."""
    agent, clock, rx, _ = make_agent([op(0, "send", peer="h2", nbytes=MTU)], dcqcn=True)
    (ch,) = agent.channels.values()
    assert agent.busy.list == []
    agent.step(clock.now)
    assert agent.busy.list == [ch] and ch.sendq.unacked
    rx.queue.append(control_frame(agent, roce.OP_CNP, 0, bytes(16)))
    rx.queue.append(control_frame(agent, roce.OP_ACK, 0, bytes([roce.AETH_ACK, 0, 0, 1])))
    clock.now += 1_000_000
    agent.step(clock.now)
    assert agent.state[0] == "done" and ch.rp.cuts == 1 and agent.busy.list == [ch]  # a cut rate has timers
    ref = copy.deepcopy(ch.rp)  # from here ticked at every pass, busy or not
    step_ns = ch.rp.p.alpha_period_ns * D // 3
    passes = 0
    while agent.busy.list:  # DCQCN recovers to line rate, then the channel leaves the list
        clock.now += step_ns
        ref.tick(agent.real_ns(clock.now))
        agent.step(clock.now)
        passes += 1
        assert passes < 100_000, "DCQCN never recovered"
    assert not ch.rp.active and ch.tx_since_ns is None
    for _ in range(150):  # 50 alpha periods idle: the agent does not run the channel's timers
        clock.now += step_ns
        ref.tick(agent.real_ns(clock.now))
        agent.step(clock.now)
    assert ch.rp.alpha > ref.alpha  # not caught up yet
    clock.now += step_ns
    rx.queue.append(control_frame(agent, roce.OP_CNP, 0, bytes(16)))
    agent.step(clock.now)
    ref.tick(agent.real_ns(clock.now))
    ref.on_cnp(agent.real_ns(clock.now))
    assert ch.rp.cuts == 2 and agent.busy.list == [ch]
    assert (ch.rp.alpha, ch.rp.rate_bps, ch.rp.next_alpha_ns, ch.rp.next_timer_ns) == (
        ref.alpha, ref.rate_bps, ref.next_alpha_ns, ref.next_timer_ns)


def test_fake_sockets_stand_in_for_the_real_ones():
    """The loop only uses what the fakes offer: recvmsg/recv raising BlockingIOError when empty."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recvmsg(64, 64)
