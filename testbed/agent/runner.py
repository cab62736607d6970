"""One emulated GPU: runs its schedule with RoCEv2 on the wire, in its host's namespace.

Started by the run (``python -m testbed.agent CONFIG``); prints ``ready`` once its
sockets are open, reads the shared start time (CLOCK_MONOTONIC ns, one clock for all
namespaces) from stdin, then executes its ops: compute as dilated timers, sends as
paced RoCE packets on a raw AF_PACKET socket (templates from ``testbed.roce``),
receives on a UDP 4791 socket with IP_RECVTOS (so CE marks are seen without parsing
foreign traffic, and the kernel sends no port-unreachable). Records go to a JSONL file
as they happen: one line per op, DCQCN rate changes, and per-QP counters at the end.

Time: the event loop runs on emulated monotonic time; DCQCN and the transport timers
run in real-fabric time (emulated / dilation), so their published real-time constants
apply unchanged.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import sys
import time
from collections import defaultdict, deque

from .. import pfc, roce
from ..units import Dilation
from .dcqcn import Params, ReactionPoint
from .transport import RecvQP, SendQP

LOG = logging.getLogger(__name__)
RX_BUFFER_BYTES = 8 * 1024 * 1024
TX_BUFFER_BYTES = 4 * 1024 * 1024
MAX_RX_BATCH = 256


class Agent:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.name, self.index = cfg["gpu"], cfg["index"]
        self.d = Dilation(cfg["dilation"])
        self.mtu = cfg["mtu_bytes"]
        self.line_bps = cfg["line_bps"]  # real
        self.rto_real_ns = cfg["rto_ns"]
        self.me = roce.Endpoint(cfg["mac"], cfg["ip"])
        self.peers = {name: p for name, p in cfg["peers"].items()}
        self.by_index = {p["index"]: name for name, p in self.peers.items()}
        self.ops = cfg["ops"]
        self.out = open(cfg["records"], "w", buffering=1)
        self.payload = bytes(self.mtu)
        self.params = Params()
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TX_BUFFER_BYTES)
        self.tx.bind((cfg["intf"], 0))
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RX_BUFFER_BYTES)
        self.rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        self.rx.bind((cfg["ip"], roce.ROCE_UDP_PORT))
        self.rx.setblocking(False)
        # PFC from the leaf: the NIC stops the data class (control frames still go)
        self.pause = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(pfc.ETH_TYPE_MAC_CONTROL))
        self.pause.bind((cfg["intf"], pfc.ETH_TYPE_MAC_CONTROL))
        self.pause.setblocking(False)
        self.paused_until_ns = 0
        self.paused_since_ns = None
        self.sendq, self.recvq, self.rp, self.tmpl = {}, {}, {}, {}
        self.next_tx_ns, self.last_cnp_ns = {}, {}
        for name, p in self.peers.items():
            mine, theirs = roce.qpn(self.index, p["index"]), roce.qpn(p["index"], self.index)
            peer = roce.Endpoint(p["mac"], p["ip"])
            sport = roce.udp_source_port(mine, theirs)
            self.tmpl[name] = {
                "data": {}, "peer": peer, "sport": sport, "dqpn": theirs,
                "ack": roce.FrameTemplate(self.me, peer, sport, theirs, roce.AETH_LEN, roce.DSCP_CONTROL, 0),
                "cnp": roce.FrameTemplate(self.me, peer, sport, theirs, roce.CNP_PAD_LEN, roce.DSCP_CNP, 0),
            }
            self.sendq[name], self.recvq[name] = SendQP(self.mtu), RecvQP()
            self.next_tx_ns[name] = 0
            self.last_cnp_ns[name] = None
        self.nic_free_ns = 0
        self.counters = defaultdict(lambda: defaultdict(int))

    # -- time ------------------------------------------------------------------------------
    def real_ns(self, now_ns: int) -> int:
        return int(self.d.real_duration_ns(now_ns - self.start_ns))

    def emulated_gap_ns(self, nbytes: int, real_bps: float) -> int:
        return int(nbytes * 8 / self.d.rate_bps(real_bps) * 1e9)

    # -- records ---------------------------------------------------------------------------
    def record(self, **fields):
        self.out.write(json.dumps({"gpu": self.name, **fields}) + "\n")

    # -- wire ------------------------------------------------------------------------------
    def data_frame(self, peer: str, pkt) -> bytes:
        t = self.tmpl[peer]
        tmpl = t["data"].get(pkt.payload)
        if tmpl is None:
            tmpl = t["data"][pkt.payload] = roce.FrameTemplate(self.me, t["peer"], t["sport"], t["dqpn"], pkt.payload,
                                                               roce.DSCP_DATA, roce.ECT0)
        body = self.payload if pkt.payload == self.mtu else self.payload[:pkt.payload]
        return tmpl.frame(pkt.opcode, pkt.psn & roce.PSN_MASK, pkt.ackreq, body)

    def send_frame(self, frame: bytes):
        try:
            self.tx.send(frame)
        except BlockingIOError:
            self.counters["nic"]["tx_blocked"] += 1

    # -- the run ---------------------------------------------------------------------------
    def run(self, start_ns: int, deadline_ns: int) -> int:
        self.start_ns = start_ns
        now = time.monotonic_ns()
        for name in self.peers:
            self.rp[name] = ReactionPoint(self.line_bps, 0, self.params, enabled=self.cfg["dcqcn"])
        state = {op["id"]: "waiting" for op in self.ops}
        done_at = {}
        ready_at = {}
        compute_end = {}  # op id -> emulated ns
        send_msg = {}  # (peer, message number) -> op id
        recv_ops = defaultdict(deque)  # peer -> op ids of posted receives, in order
        arrivals = defaultdict(deque)  # peer -> arrival times of messages not yet matched
        pending = deque(op["id"] for op in self.ops)
        remaining = len(self.ops)
        ops = {op["id"]: op for op in self.ops}
        first_tx = {}
        while time.monotonic_ns() < start_ns:
            time.sleep(max(0.0, (start_ns - time.monotonic_ns()) / 1e9))

        def finish(op_id, t):
            nonlocal remaining
            state[op_id] = "done"
            done_at[op_id] = t
            remaining -= 1
            op = ops[op_id]
            self.record(type="op", id=op_id, kind=op["kind"], iteration=op["iteration"], phase=op["phase"],
                        collective=op["collective"], step=op["step"], peer=op["peer"], bytes=op["bytes"],
                        ready_ns=ready_at[op_id], start_ns=first_tx.get(op_id, ready_at[op_id]), end_ns=t)

        def match_recv(peer):
            while recv_ops[peer] and arrivals[peer]:
                op_id, t = recv_ops[peer].popleft(), arrivals[peer].popleft()
                finish(op_id, max(t, ready_at[op_id]))

        while remaining:
            now = time.monotonic_ns()
            if now > deadline_ns:
                self.record(type="abort", reason="deadline", t_ns=now,
                            waiting=[{"id": i, "kind": ops[i]["kind"], "peer": ops[i]["peer"]}
                                     for i, s in state.items() if s != "done"][:20])
                return 4
            # 1. ops whose dependencies are done start
            progressed = True
            while progressed:
                progressed = False
                for _ in range(len(pending)):
                    op_id = pending.popleft()
                    op = ops[op_id]
                    if not all(state[d] == "done" for d in op["deps"]):
                        pending.append(op_id)
                        continue
                    ready_at[op_id] = now
                    progressed = True
                    if op["kind"] == "compute":
                        state[op_id] = "running"
                        compute_end[op_id] = now + int(self.d.duration_ns(op["duration_ns"]))
                    elif op["kind"] == "send":
                        state[op_id] = "running"
                        send_msg[(op["peer"], self.sendq[op["peer"]].post(op["bytes"]))] = op_id
                    else:
                        state[op_id] = "running"
                        recv_ops[op["peer"]].append(op_id)
                        match_recv(op["peer"])
                    break
            for op_id, end in list(compute_end.items()):
                if now >= end:
                    del compute_end[op_id]
                    finish(op_id, end)
            # 2. receive
            self.receive(now, send_msg, arrivals, match_recv, finish)
            # 3. timers: DCQCN (real time) and retransmission
            real_now = self.real_ns(now)
            for name, rp in self.rp.items():
                before = rp.rate_bps
                rp.tick(real_now)
                if rp.rate_bps != before:
                    self.record(type="rate", t_ns=now, peer=name, rate_bps=rp.rate_bps, alpha=rp.alpha)
                q = self.sendq[name]
                if q.check_timeout(now, int(self.d.duration_ns(self.rto_real_ns))):
                    self.record(type="timeout", t_ns=now, peer=name)
            # 4. transmit: one packet per eligible QP per pass, the NIC at line rate, unless
            # the leaf has paused the data class (PFC)
            next_wake = min(compute_end.values(), default=now + 50_000_000)
            self.receive_pause(now)
            if now < self.paused_until_ns:
                next_wake = min(next_wake, self.paused_until_ns)
            else:
                self.resume(now)
            line_gap = self.emulated_gap_ns(roce.wire_bytes(self.mtu), self.line_bps)
            slack = 2 * line_gap
            for name, q in self.sendq.items():
                if not q.has_pending() or now < self.paused_until_ns:
                    continue
                ready_ns = max(self.next_tx_ns[name], self.nic_free_ns)
                if ready_ns > now:
                    next_wake = min(next_wake, ready_ns)
                    continue
                pkt = q.peek()
                frame = self.data_frame(name, pkt)
                self.send_frame(frame)
                q.sent(pkt, now)
                op_id = send_msg.get((name, pkt.message))
                if op_id is not None:
                    first_tx.setdefault(op_id, now)
                rp = self.rp[name]
                before = rp.rate_bps
                rp.on_sent(len(frame), real_now)
                if rp.rate_bps != before:
                    self.record(type="rate", t_ns=now, peer=name, rate_bps=rp.rate_bps, alpha=rp.alpha)
                self.next_tx_ns[name] = max(self.next_tx_ns[name], now - slack) + \
                    self.emulated_gap_ns(len(frame), rp.rate_bps)
                self.nic_free_ns = max(self.nic_free_ns, now - slack) + self.emulated_gap_ns(len(frame), self.line_bps)
                next_wake = min(next_wake, max(self.next_tx_ns[name], self.nic_free_ns))
            for q in self.sendq.values():
                if q.unacked and q.last_progress_ns is not None:
                    next_wake = min(next_wake, q.last_progress_ns + int(self.d.duration_ns(self.rto_real_ns)))
            if self.cfg["dcqcn"]:
                active = [rp.next_event_ns() for rp in self.rp.values() if rp.active]
                if active:
                    next_wake = min(next_wake, self.start_ns + int(self.d.duration_ns(min(active))))
            timeout = max(0.0, (next_wake - time.monotonic_ns()) / 1e9)
            if timeout > 0:
                select.select([self.rx, self.pause], [], [], min(timeout, 0.05))
        self._rx_state = (send_msg, arrivals, match_recv, finish)
        return 0

    def receive_pause(self, now: int):
        while True:
            try:
                data = self.pause.recv(256)
            except BlockingIOError:
                return
            parsed = pfc.parse(data)
            if parsed is None or pfc.LOSSLESS_PRIORITY not in parsed[1]:
                continue
            quanta = parsed[1][pfc.LOSSLESS_PRIORITY]
            self.counters["nic"]["pause_frames_received"] += 1
            if quanta:
                self.paused_until_ns = now + int(self.d.duration_ns(pfc.pause_ns(quanta, self.line_bps)))
                if self.paused_since_ns is None:
                    self.paused_since_ns = now
                    self.record(type="paused", t_ns=now)
            else:
                self.paused_until_ns = 0
                self.resume(now)

    def resume(self, now: int):
        if self.paused_since_ns is not None:
            self.counters["nic"]["paused_ns"] += now - self.paused_since_ns
            self.paused_since_ns = None
            self.record(type="resumed", t_ns=now)

    def linger(self, control):
        """Every op is done; peers may still retransmit into us (a lost ACK): keep answering
        until the run closes our stdin, which it does once every agent is done."""
        while True:
            readable, _, _ = select.select([self.rx, control], [], [], 1.0)
            if self.rx in readable:
                self.receive(time.monotonic_ns(), *self._rx_state)
            if control in readable and not control.readline():
                return

    def receive(self, now, send_msg, arrivals, match_recv, finish):
        for _ in range(MAX_RX_BATCH):
            try:
                data, anc, _flags, addr = self.rx.recvmsg(self.mtu + 64, 64)
            except BlockingIOError:
                return
            pkt = roce.parse(data)
            if pkt is None:
                continue
            remote = self.by_index.get(pkt.dqpn & 0x3FF)
            if remote is None or (pkt.dqpn >> 10) != self.index:
                self.counters["nic"]["foreign"] += 1
                continue
            tos = anc[0][2][0] if anc else 0
            c = self.counters[remote]
            if pkt.opcode == roce.OP_ACK:
                q = self.sendq[remote]
                if pkt.syndrome == roce.AETH_NAK_SEQ:
                    c["naks_received"] += 1
                    done = q.on_nak(pkt.psn, now)
                else:
                    done = q.on_ack(pkt.psn, now)
                for msg in done:
                    op_id = send_msg.pop((remote, msg), None)
                    if op_id is not None:
                        finish(op_id, now)
            elif pkt.opcode == roce.OP_CNP:
                c["cnps_received"] += 1
                rp = self.rp[remote]
                before = rp.rate_bps
                rp.on_cnp(self.real_ns(now))
                if rp.rate_bps != before:
                    self.record(type="rate", t_ns=now, peer=remote, rate_bps=rp.rate_bps, alpha=rp.alpha)
            else:
                c["packets_received"] += 1
                ce = (tos & 0b11) == roce.CE
                if ce:
                    c["ce_received"] += 1
                    last = self.last_cnp_ns[remote]
                    if last is None or now - last >= self.d.duration_ns(self.params.cnp_interval_ns):
                        self.last_cnp_ns[remote] = now
                        c["cnps_sent"] += 1
                        self.send_frame(self.tmpl[remote]["cnp"].frame(roce.OP_CNP, 0, False, bytes(16)))
                reply, completed = self.recvq[remote].on_data(pkt.psn, pkt.opcode, pkt.payload_len, pkt.ackreq)
                if reply is not None:
                    kind, psn = reply
                    syndrome = roce.AETH_NAK_SEQ if kind == "nak" else roce.AETH_ACK
                    msn = len(self.recvq[remote].messages) & roce.PSN_MASK
                    body = bytes([syndrome]) + msn.to_bytes(3, "big")
                    self.send_frame(self.tmpl[remote]["ack"].frame(roce.OP_ACK, psn, False, body))
                    c["naks_sent" if kind == "nak" else "acks_sent"] += 1
                if completed is not None:
                    arrivals[remote].append(now)
                    match_recv(remote)

    def report(self):
        for name in self.peers:
            q, r, rp = self.sendq[name], self.recvq[name], self.rp[name]
            c = dict(self.counters[name])
            if not (q.next_psn or r.expected or c):
                continue
            self.record(type="qp", peer=name, packets_sent=q.sent_psn + q.retransmitted, retransmitted=q.retransmitted,
                        timeouts=q.timeouts, naks_received=q.naks, duplicates_received=r.duplicates,
                        out_of_order_received=r.out_of_order, bytes_received=r.bytes, dcqcn_cuts=rp.cuts,
                        final_rate_bps=rp.rate_bps, **{k: v for k, v in c.items() if k != "naks_received"})
        if self.counters["nic"]:
            self.record(type="nic", **self.counters["nic"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    agent = Agent(cfg)
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 3  # the run went away before starting us
    start_ns, deadline_ns = (int(x) for x in line.split())
    try:
        rc = agent.run(start_ns, deadline_ns)
        if rc == 0:
            print("done", flush=True)
            agent.linger(sys.stdin)
        return rc
    finally:
        agent.report()
        agent.out.close()
