"""One emulated GPU: runs its schedule with RoCEv2 on the wire, its sockets in its host's
namespace.

Its server's agent process (``python -m testbed.agent``, ``testbed.agent.server``) opens its
sockets, steps it from the shared start time (CLOCK_MONOTONIC ns, one clock for all
namespaces) whenever its next event is due or a socket of its is readable: it executes its
ops: compute as dilated timers, sends as
paced RoCE packets on a raw AF_PACKET socket per NIC (templates from ``testbed.wire.roce``),
receives on a UDP 4791 socket with IP_RECVTOS (so CE marks are seen without parsing
foreign traffic, and the kernel sends no port-unreachable). Records go to a JSONL file
as they happen: one line per op, DCQCN rate changes, pauses, and per-QP counters at the end.

A GPU has up to two NICs: ``fabric`` (to its leaf: DCQCN, PFC) and ``nvlink`` (the
server's NVLink segment, tensor-parallel and intra-server traffic). One reliable
connection exists per (peer, NIC), made of ``qps_per_connection`` queue pairs (each a
``Channel``: send QP, receive QP, DCQCN reaction point, its own UDP source port); a
message is split over them (``transport.split_message``) and is done when every part
is; NVLink QPNs carry ``roce.NVLINK_QPN_BIT``.

Time: the event loop runs on emulated monotonic time; DCQCN and the transport timers
run in real-fabric time (emulated / dilation), so their published real-time constants
apply unchanged.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections import defaultdict

from testbed.wire import pfc
from testbed.wire import roce
from testbed.agent.config import AgentConfig
from testbed.agent.dcqcn import Params
from testbed.agent.ops import OpGraph, peer_link
from testbed.agent.channel import CONTROL_OPCODES, BusyChannels, Channel, Connection, Nic, udp_receive_errors

RX_BUFFER_BYTES = 8 * 1024 * 1024
MAX_RX_BATCH = 256
IDLE_WAKE_NS = 50_000_000
# counter names (count, summed lateness, worst lateness) in the NIC record, for Agent.late
TX_LATE = ("tx_count", "tx_late_ns", "tx_late_max_ns")
TIMER_LATE = ("timer_count", "timer_late_ns", "timer_late_max_ns")
RX_LATE = ("rx_done_count", "rx_done_late_ns", "rx_done_late_max_ns")
# the kernel's receive time of each datagram (struct timespec, CLOCK_REALTIME): Linux's
# SO_TIMESTAMPNS, which Python's socket module does not name
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("@qq")
ANCILLARY_BYTES = socket.CMSG_SPACE(TIMESPEC.size) + socket.CMSG_SPACE(4)


def open_rx() -> socket.socket:
    """The UDP 4791 socket every RoCE datagram to this GPU arrives on (fabric and NVLink
    addresses), with the TOS of each (so CE marks are seen) and the time the kernel
    received it (so the loop knows how late it read what completed a message)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RX_BUFFER_BYTES)
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.bind(("0.0.0.0", roce.ROCE_UDP_PORT))
    rx.setblocking(False)
    return rx


class Agent:
    """The GPU's event loop, one ``step`` at a time. ``clock`` (CLOCK_MONOTONIC ns), ``wall``
    (CLOCK_REALTIME ns, the clock of the kernel's receive timestamps) and the socket openers
    are parameters so the loop runs against fake clocks and fake sockets in the unit tests."""

    def __init__(self, cfg: AgentConfig, clock=time.monotonic_ns, open_nic=Nic, open_rx=open_rx,
                 open_pause=pfc.open_socket, snmp_path: str = "/proc/net/snmp", wall=time.time_ns):
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.snmp_path = snmp_path  # the UDP counters of the GPU's namespace (/proc/PID/net/snmp)
        self.name, self.index = cfg.gpu, cfg.index
        self.d = cfg.dilation
        self.transport = t = cfg.transport
        self.mtu = t.mtu_bytes
        self.rto_real_ns = t.rto_ns
        self.ops = cfg.ops
        self.out = open(cfg.records, "w", buffering=1)
        self.payload = bytes(self.mtu)
        self.params = Params(**t.dcqcn_params)
        self.nics = {link: open_nic(link, spec) for link, spec in cfg.nics.items()}
        self.rx = open_rx()
        # PFC from the leaf: the fabric NIC stops the data class (control frames still go)
        self.pause = open_pause(cfg.nics["fabric"].intf)
        self.paused_until_ns = 0
        self.paused_since_ns = None
        self.nic_counters = defaultdict(int)
        self.resumed_ns = 0  # a paused NIC's packets are due from here, not from before the pause
        self.by_index = {p.index: name for name, p in cfg.peers.items()}
        self.qps = t.qps_per_connection
        self.balance = t.load_balancing
        self.spray_packets = t.spray_packets
        self.flowlet_gap_ns = int(self.d.duration_ns(t.flowlet_gap_ns))
        self.kind = t.kind  # the fabric NIC's transport; NVLink stays RoCE
        self.base_rtt_ns, self.trimming = t.base_rtt_ns, t.trim
        self.store_and_forward_ns = t.store_and_forward_ns
        self.conns: dict[tuple, Connection] = {}  # (peer, link) -> Connection
        for name, p in cfg.peers.items():
            for link, nic in self.nics.items():
                if link == "fabric" or p.nvlink_ip:
                    # NVLink is one bridge: nothing to spread over, one QP
                    self.conns[(name, link)] = Connection(self, name, p, nic, self.qps if link == "fabric" else 1)
        self.channels: dict[tuple, Channel] = {(ch.peer, ch.nic.link, ch.qp): ch for conn in self.conns.values()
                                               for ch in conn.channels}
        self.busy = BusyChannels(self.channels.values())  # what the loop's per-pass scans walk
        self.start_ns = 0

    # -- time and records ------------------------------------------------------------------
    def real_ns(self, now_ns: int) -> int:
        return int(self.d.real_duration_ns(now_ns - self.start_ns))

    def gap_ns(self, nbytes: int, real_bps: float) -> int:
        return int(nbytes * 8 / self.d.rate_bps(real_bps) * 1e9)

    def record(self, **fields):
        self.out.write(json.dumps({"gpu": self.name, **fields}) + "\n")

    def late(self, keys: tuple, late_ns: int):
        """Timer lateness (the fidelity guard's input): a packet sent (``TX_LATE``), a
        compute phase noticed as ended (``TIMER_LATE``), or a packet that completed a
        message read (``RX_LATE``), ``late_ns`` after it was due (after the kernel had it)."""
        count, total, worst = keys
        c = self.nic_counters
        c[count] += 1
        c[total] += late_ns
        if late_ns > c[worst]:
            c[worst] = late_ns

    def note_rate(self, ch: Channel, before: float, now: int):
        if ch.rp.rate_bps != before:
            self.record(type="rate", t_ns=now, peer=ch.peer, link=ch.nic.link, rate_bps=ch.rp.rate_bps,
                        alpha=ch.rp.alpha)

    # -- the run: one pass of the loop is ready ops, compute timers, receive, timers, transmit
    def prepare(self, start_ns: int):
        self.start_ns = start_ns
        self.graph = OpGraph(self.ops)
        self.state = {i: "waiting" for i in self.graph.by_id}
        self.ready_at, self.first_tx, self.compute_end = {}, {}, {}
        self.remaining = len(self.graph.by_id)
        self.rto_ns = int(self.d.duration_ns(self.rto_real_ns))

    def abort(self, reason: str, now: int):
        self.record(type="abort", reason=reason, t_ns=now,
                    waiting=[{"id": i, "kind": self.graph.by_id[i]["kind"], "peer": self.graph.by_id[i]["peer"]}
                             for i, s in self.state.items() if s != "done"][:20])

    def step(self, now: int) -> int:
        """One pass of the loop at ``now``; returns when the next thing is due. Ops that
        what just finished (a compute timer, an arrival, an ACK) unblocks start in the same
        pass: started on the next pass, they waited for a packet or the idle wake-up."""
        self.end_compute(now)
        self.receive(now)
        self.receive_pause(now)
        self.start_ready_ops(now)
        self.tick_timers(now)
        return self.transmit(now)

    def start_ready_ops(self, now: int):
        """Ops whose dependencies are done start (``ops.OpGraph``: a connection's messages in
        planned order). Ops that finish meanwhile (a posted receive whose data had arrived)
        make theirs ready in the same pass."""
        while (op := self.graph.pop_ready()) is not None:
            op_id = op["id"]
            self.ready_at[op_id] = now
            self.state[op_id] = "running"
            if op["kind"] == "compute":
                self.compute_end[op_id] = now + int(self.d.duration_ns(op["duration_ns"]))
                continue
            conn = self.conns[peer_link(op)]
            if op["kind"] == "send":
                conn.send(op_id, op["bytes"])
                for ch in conn.channels:
                    self.busy.add(ch)
            else:
                conn.receive(op_id, op["bytes"])
                self.match_recv(conn)

    def end_compute(self, now: int):
        for op_id, end in list(self.compute_end.items()):
            if now >= end:
                del self.compute_end[op_id]
                self.finish(op_id, end)
                self.late(TIMER_LATE, now - end)

    def tick_timers(self, now: int):
        """DCQCN (real time) and retransmission timeouts of the busy channels; a channel
        with no timer due costs a few attribute reads, not calls: the same tests ``tick``
        and ``check_timeout`` make."""
        real_now = self.real_ns(now)
        rto_ns = self.rto_ns
        for ch in self.busy.list:
            rp = ch.rp
            if rp.enabled and (real_now >= rp.next_alpha_ns or real_now >= rp.next_timer_ns):
                before = rp.rate_bps
                rp.tick(real_now)
                self.note_rate(ch, before, now)
            q = ch.sendq
            if q.last_progress_ns is not None and now - q.last_progress_ns >= rto_ns and q.check_timeout(now, rto_ns):
                self.record(type="timeout", t_ns=now, peer=ch.peer, link=ch.nic.link)

    def transmit(self, now: int) -> int:
        """One packet per eligible channel, each NIC at its line rate, each channel at its
        DCQCN rate; the fabric NIC holds data while the leaf pauses it (PFC). Returns the
        next wake: a packet, a compute end, a pause end, a retransmission or DCQCN timer."""
        next_wake = min(self.compute_end.values(), default=now + IDLE_WAKE_NS)
        paused = now < self.paused_until_ns
        if paused:
            next_wake = min(next_wake, self.paused_until_ns)
        else:
            self.resume(now)
        real_now = self.real_ns(now)
        for ch in self.busy.list:
            q = ch.sendq
            if not q.has_pending():
                ch.tx_since_ns = None
                continue
            if ch.tx_since_ns is None:
                ch.tx_since_ns = now  # packets are due from when there are any to send
            if paused and ch.nic.link == "fabric":
                continue
            ready_ns = max(ch.next_tx_ns, ch.nic.free_ns)
            if ready_ns > now:
                next_wake = min(next_wake, ready_ns)
                continue
            next_wake = min(next_wake, self.send_one(ch, now, ready_ns, real_now))
        self.busy.drop_idle()
        for ch in self.busy.list:
            if ch.sendq.unacked and ch.sendq.last_progress_ns is not None:
                next_wake = min(next_wake, ch.sendq.last_progress_ns + self.rto_ns)
            if ch.rp.active:
                next_wake = min(next_wake, self.start_ns + int(self.d.duration_ns(ch.rp.next_event_ns())))
        return next_wake

    def send_one(self, ch: Channel, now: int, ready_ns: int, real_now: int) -> int:
        """The channel's next packet; returns when its next one is due."""
        nic, q = ch.nic, ch.sendq
        pkt = q.peek()
        frame = ch.data_frame(pkt, self.payload, now)
        nic.send(frame)
        line_gap_ns = self.gap_ns(len(frame), nic.line_bps)
        due_from = max(ch.tx_since_ns, self.resumed_ns if nic.link == "fabric" else 0)
        self.late(TX_LATE, now - max(ready_ns, due_from))
        self.nic_counters["tx_gap_ns"] += line_gap_ns
        # what a wake-up later than the two-packet catch-up loses for good: the schedule slips
        self.nic_counters["tx_slip_ns"] += max(0, now - 2 * line_gap_ns - max(ch.next_tx_ns, due_from))
        q.sent(pkt, now)
        op_id = ch.send_ops.get(pkt.message)
        if op_id is not None:
            self.first_tx.setdefault(op_id, now)
        before = ch.rp.rate_bps
        ch.rp.on_sent(len(frame), real_now)
        self.note_rate(ch, before, now)
        # a late wake-up may catch up by at most two packets (a bounded burst), but never
        # on time from before the channel had anything to send
        since = max(now - 2 * line_gap_ns, ch.tx_since_ns)
        ch.next_tx_ns = max(ch.next_tx_ns, since) + self.gap_ns(len(frame), ch.rp.rate_bps)
        nic.free_ns = max(nic.free_ns, since) + line_gap_ns
        return max(ch.next_tx_ns, nic.free_ns)

    def finish(self, op_id: int, t: int):
        self.state[op_id] = "done"
        self.graph.finished(op_id)
        self.remaining -= 1
        op = self.graph.by_id[op_id]
        self.record(type="op", id=op_id, kind=op["kind"], iteration=op["iteration"], phase=op["phase"],
                    collective=op["collective"], step=op["step"], peer=op["peer"], link=op.get("link"),
                    bytes=op["bytes"], micro_batch=op.get("micro_batch", -1), ready_ns=self.ready_at[op_id],
                    start_ns=self.first_tx.get(op_id, self.ready_at[op_id]), end_ns=t)

    def match_recv(self, conn: Connection):
        for op_id, t in conn.delivered():
            self.finish(op_id, max(t, self.ready_at[op_id]))

    # -- PFC -------------------------------------------------------------------------------
    def receive_pause(self, now: int):
        for _src, by_priority in pfc.drain(self.pause):
            if pfc.LOSSLESS_PRIORITY not in by_priority:
                continue
            quanta = by_priority[pfc.LOSSLESS_PRIORITY]
            self.nic_counters["pause_frames_received"] += 1
            if quanta:
                line = self.nics["fabric"].line_bps
                self.paused_until_ns = now + int(self.d.duration_ns(pfc.pause_ns(quanta, line)))
                if self.paused_since_ns is None:
                    self.paused_since_ns = now
                    self.record(type="paused", t_ns=now)
            else:
                self.paused_until_ns = 0
                self.resume(now)

    def resume(self, now: int):
        if self.paused_since_ns is not None:
            self.nic_counters["paused_ns"] += now - self.paused_since_ns
            self.paused_since_ns = None
            self.resumed_ns = now
            self.record(type="resumed", t_ns=now)

    # -- receive ---------------------------------------------------------------------------
    def receive(self, now: int):
        for _ in range(MAX_RX_BATCH):
            try:
                data, anc, _flags, _addr = self.rx.recvmsg(self.mtu + 64, ANCILLARY_BYTES)
            except BlockingIOError:
                return
            pkt = roce.parse(data)
            if pkt is None:
                continue
            local, remote, qp, nvlink = roce.split_qpn(pkt.dqpn)
            ch = self.channels.get((self.by_index.get(remote), "nvlink" if nvlink else "fabric", qp))
            if ch is None or local != self.index:
                self.nic_counters["foreign"] += 1
                continue
            conn = self.conns[(ch.peer, ch.nic.link)]
            if pkt.opcode in CONTROL_OPCODES:
                before = ch.rp.rate_bps
                real_now = self.real_ns(now)
                ch.rp.tick(real_now)  # an idle channel's timers catch up before a CNP counts
                self.busy.add(ch)
                for msg in ch.on_control(pkt, now, real_now):
                    op_id = conn.acknowledged(ch, msg)
                    if op_id is not None:
                        self.finish(op_id, now)
                self.note_rate(ch, before, now)
            else:
                tos, stamp = 0, None
                for level, _kind, value in anc:
                    if level == socket.SOL_SOCKET:
                        stamp = value
                    else:
                        tos = value[0]
                if ch.on_data(pkt, tos, now):
                    if stamp is not None:
                        # the next op waited for this packet: how long it sat unread
                        sec, nsec = TIMESPEC.unpack(stamp)
                        self.late(RX_LATE, max(0, self.wall() - (sec * 1_000_000_000 + nsec)))
                    self.match_recv(conn)

    def report(self):
        for ch in self.channels.values():
            q, r, rp = ch.sendq, ch.recvq, ch.rp
            c = dict(ch.counters)
            if not (q.next_psn or r.expected or c):
                continue
            self.record(type="qp", peer=ch.peer, link=ch.nic.link, qp=ch.qp, packets_sent=q.sent_psn + q.retransmitted,
                        retransmitted=q.retransmitted, retransmitted_bytes=q.retransmitted_bytes,
                        entropy_changes=ch.entropy_changes, timeouts=q.timeouts, naks_received=q.naks,
                        **(ch.cc_report() if ch.uet else {}),
                        duplicates_received=r.duplicates, out_of_order_received=r.out_of_order,
                        bytes_received=r.bytes, dcqcn_cuts=rp.cuts, final_rate_bps=rp.rate_bps,
                        **{k: v for k, v in c.items() if k != "naks_received"})
        nic = dict(self.nic_counters)
        dropped = udp_receive_errors(self.snmp_path)
        if dropped:
            nic["udp_receive_errors"] = dropped
        for n in self.nics.values():
            if n.blocked:
                nic[f"{n.link}_tx_blocked"] = n.blocked
        if nic:
            self.record(type="nic", **nic)

