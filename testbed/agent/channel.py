"""A GPU's NICs and its reliable connections: a ``Nic`` sends frames on a raw packet socket
(its serializer's busy-until time paces them at line rate); a ``Channel`` is one queue pair
of the connection to one peer over one NIC (send QP, receive QP, DCQCN reaction point,
frame templates, the UDP source port its packets carry). A connection has
``qps_per_connection`` channels.

Entropy (the UDP source port the switches' ECMP groups hash): ``flow`` keeps the QP's one
port, as RoCE NICs do; ``spray`` moves to the next of ``roce.SPRAY_ENTROPY_VALUES`` ports
every ``spray_packets`` packets (round robin: each port, hence each path the hash gives
it, carries an equal share), as an Ultra Ethernet sender varies its entropy value per
packet; ``flowlet`` moves to the next port when the QP was idle longer than the flowlet
gap (a burst after a gap may take another path without overtaking the one before)."""

from __future__ import annotations

import socket
from collections import defaultdict, deque

from testbed.agent.config import NicSpec, Peer
from testbed.agent.dcqcn import ReactionPoint
from testbed.agent.nscc import Nscc
from testbed.agent.transport import RecvQP, SendQP, split_message
from testbed.agent.uet import UetRecvQP, UetSendQP
from testbed.wire import roce

TX_BUFFER_BYTES = 4 * 1024 * 1024
CONTROL_OPCODES = (roce.OP_ACK, roce.OP_CNP, roce.OP_UET_SACK, roce.OP_UET_NACK)


class Nic:
    def __init__(self, link: str, spec: NicSpec):
        self.link, self.intf, self.line_bps = link, spec.intf, spec.line_bps
        self.me = roce.Endpoint(spec.mac, spec.ip)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TX_BUFFER_BYTES)
        self.sock.bind((spec.intf, 0))
        self.free_ns = 0  # the NIC's serializer is busy until then (emulated)
        self.blocked = 0

    def send(self, frame: bytes):
        try:
            self.sock.send(frame)
        except BlockingIOError:
            self.blocked += 1


class Channel:
    """The reliable connection to one peer over one NIC."""

    def __init__(self, agent, peer: str, p: Peer, nic: Nic, qp: int = 0):
        self.peer, self.nic, self.qp = peer, nic, qp
        bit = roce.NVLINK_QPN_BIT if nic.link == "nvlink" else 0
        mine, theirs = roce.qpn(agent.index, p.index, qp) | bit, roce.qpn(p.index, agent.index, qp) | bit
        self.remote = roce.Endpoint(*p.address(nic.link))
        self.sport, self.dqpn, self.mine = roce.udp_source_port(mine, theirs), theirs, mine
        # NVLink is one bridge: no paths to choose, its QPs keep their port
        self.balance = agent.balance if nic.link == "fabric" else "flow"
        self.spray_packets, self.flowlet_gap_ns = agent.spray_packets, agent.flowlet_gap_ns
        self.entropy = 0  # index of the source port in use (0: the QP's own)
        self.entropy_sent = 0  # packets sent with it
        self.entropy_changes = 0
        self.last_tx_ns = None
        self.data = {}  # (entropy, payload length) -> FrameTemplate
        self.ack = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, roce.AETH_LEN, roce.DSCP_CONTROL, 0)
        self.cnp = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, roce.CNP_PAD_LEN, roce.DSCP_CNP, 0)
        self.uet = agent.kind == "uet" and nic.link == "fabric"
        if self.uet:  # NSCC instead of DCQCN
            cc = Nscc(agent.mtu, nic.line_bps, agent.base_rtt_ns, agent.trimming, 0)
            self.sendq = UetSendQP(agent.mtu, cc, agent.d, agent.store_and_forward_ns)
            self.recvq = UetRecvQP()
            self.sack = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, roce.SACK.size,
                                           roce.DSCP_CONTROL, 0)
            self.nack = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, 4, roce.DSCP_CONTROL, 0)
        else:
            self.sendq, self.recvq = SendQP(agent.mtu), RecvQP()
        self.rp = ReactionPoint(nic.line_bps, 0, agent.params,
                                enabled=agent.transport.dcqcn and nic.link == "fabric" and not self.uet)
        self.cnp_interval_ns = int(agent.d.duration_ns(agent.params.cnp_interval_ns))
        self.next_tx_ns = 0
        self.tx_since_ns = None  # when this channel last went from nothing to send to something
        self.last_cnp_ns = None
        self.counters = defaultdict(int)
        self.arrivals = deque()  # arrival times of messages no receive has taken yet
        self.send_ops = {}  # message number -> op id

    def next_entropy(self, now_ns: int) -> int:
        """The entropy index the next data packet carries (``now_ns``: emulated time)."""
        if self.balance == "spray":
            if self.entropy_sent >= self.spray_packets:
                self.entropy = (self.entropy + 1) % roce.SPRAY_ENTROPY_VALUES
                self.entropy_sent = 0
                self.entropy_changes += 1
        elif self.balance == "flowlet":
            if self.last_tx_ns is not None and now_ns - self.last_tx_ns > self.flowlet_gap_ns:
                self.entropy = (self.entropy + 1) % roce.SPRAY_ENTROPY_VALUES
                self.entropy_changes += 1
        self.entropy_sent += 1
        self.last_tx_ns = now_ns
        return self.entropy

    def data_frame(self, pkt, payload: bytes, now_ns: int = 0) -> bytes:
        key = (self.next_entropy(now_ns) if self.balance != "flow" else 0, pkt.payload)
        tmpl = self.data.get(key)
        if tmpl is None:
            sport = roce.udp_source_port(self.mine, self.dqpn, key[0])
            tmpl = self.data[key] = roce.FrameTemplate(self.nic.me, self.remote, sport, self.dqpn,
                                                       pkt.payload, roce.DSCP_DATA, roce.ECT0)
        body = payload if pkt.payload == len(payload) else payload[:pkt.payload]
        return tmpl.frame(pkt.opcode, pkt.psn & roce.PSN_MASK, pkt.ackreq, body)

    def cc_report(self) -> dict:
        """NSCC's state at the end (UET QPs): window, base RTT measured, what its ACKs did."""
        cc, r = self.sendq.cc, self.recvq
        return {"nscc_cwnd_bytes": cc.cwnd, "nscc_base_rtt_ns": cc.base_rtt_ns, "nscc_avg_delay_ns": cc.avg_delay_ns,
                **{f"nscc_{k}": v for k, v in cc.counts.items()}, "trimmed_received": r.trimmed,
                "timeout_resends": self.sendq.timeout_resends}

    def on_control(self, pkt, now: int, real_now: int) -> list:
        """An ACK, NAK, SACK, NACK or CNP for this QP; returns the message numbers of the
        send QP now fully acknowledged."""
        c = self.counters
        if pkt.opcode == roce.OP_CNP:
            c["cnps_received"] += 1
            self.rp.on_cnp(real_now)
            return []
        if pkt.opcode == roce.OP_UET_SACK and self.uet:
            return self.sendq.on_sack(pkt.psn, pkt.body, now)
        if pkt.opcode == roce.OP_UET_NACK and self.uet:
            c["nacks_received"] += 1
            self.sendq.on_nack(pkt.psn, now)
            return []
        if pkt.opcode == roce.OP_ACK and not self.uet:
            if pkt.syndrome == roce.AETH_NAK_SEQ:
                c["naks_received"] += 1
                return self.sendq.on_nak(pkt.psn, now)
            return self.sendq.on_ack(pkt.psn, now)
        c["foreign"] += 1
        return []

    def on_data(self, pkt, tos: int, now: int) -> int:
        """A data packet for this QP (``tos``: its IP TOS byte); answers it (ACK/NAK, SACK/NACK,
        CNP) and returns how many messages it completed (their arrival times queued)."""
        c = self.counters
        ce = (tos & 0b11) == roce.CE
        if ce:
            c["ce_received"] += 1
            if not self.uet and (self.last_cnp_ns is None or now - self.last_cnp_ns >= self.cnp_interval_ns):
                self.last_cnp_ns = now
                c["cnps_sent"] += 1
                self.nic.send(self.cnp.frame(roce.OP_CNP, 0, False, bytes(16)))
        if self.uet:
            if tos >> 2 == roce.DSCP_TRIMMED:
                if self.recvq.on_trimmed(pkt.psn):
                    c["nacks_sent"] += 1
                    self.nic.send(self.nack.frame(roce.OP_UET_NACK, pkt.psn, False, bytes([roce.NACK_TRIMMED, 0, 0, 0])))
                return 0
            c["packets_received"] += 1
            sack, completed = self.recvq.on_data(pkt.psn, pkt.opcode, pkt.payload_len, pkt.ackreq, ce)
            if sack is not None:
                c["acks_sent"] += 1
                self.nic.send(self.sack.frame(roce.OP_UET_SACK, pkt.psn, False, sack))
            self.arrivals.extend([now] * len(completed))
            return len(completed)
        c["packets_received"] += 1
        reply, completed = self.recvq.on_data(pkt.psn, pkt.opcode, pkt.payload_len, pkt.ackreq)
        if reply is not None:
            kind, psn = reply
            syndrome = roce.AETH_NAK_SEQ if kind == "nak" else roce.AETH_ACK
            msn = len(self.recvq.messages) & roce.PSN_MASK
            self.nic.send(self.ack.frame(roce.OP_ACK, psn, False, bytes([syndrome]) + msn.to_bytes(3, "big")))
            c["naks_sent" if kind == "nak" else "acks_sent"] += 1
        if completed is None:
            return 0
        self.arrivals.append(now)
        return 1


class Connection:
    """The reliable connection to one peer over one NIC: its QPs (``Channel``), and the
    messages split over them (``transport.split_message``, which sender and receiver both
    derive from the size). A send is done when every part is acknowledged; a posted
    receive when every QP its message uses delivered its part (each QP delivers its
    parts in order, so the k-th part a QP delivers belongs to the k-th message that uses
    that QP)."""

    def __init__(self, agent, peer: str, p: Peer, nic: Nic, qps: int):
        self.mtu = agent.mtu
        self.channels = [Channel(agent, peer, p, nic, qp) for qp in range(qps)]
        self.posted = deque()  # posted receives: (op id, the QPs its message uses)
        self.parts_left = {}  # send op id -> parts not yet acknowledged

    def send(self, op_id: int, nbytes: int):
        parts = split_message(nbytes, self.mtu, len(self.channels))
        self.parts_left[op_id] = len(parts)
        for qp, part in parts:
            ch = self.channels[qp]
            ch.send_ops[ch.sendq.post(part)] = op_id

    def acknowledged(self, ch: Channel, msg: int):
        """Message ``msg`` of QP ``ch`` was acknowledged: the send op it completes, or None."""
        op_id = ch.send_ops.pop(msg, None)
        if op_id is None:
            return None
        self.parts_left[op_id] -= 1
        if self.parts_left[op_id]:
            return None
        del self.parts_left[op_id]
        return op_id

    def receive(self, op_id: int, nbytes: int):
        self.posted.append((op_id, [qp for qp, _ in split_message(nbytes, self.mtu, len(self.channels))]))

    def delivered(self) -> list:
        """[(receive op id, arrival time of its last part), ...] that are now complete."""
        out, chans = [], self.channels
        while self.posted and all(chans[qp].arrivals for qp in self.posted[0][1]):
            op_id, qps = self.posted.popleft()
            out.append((op_id, max(chans[qp].arrivals.popleft() for qp in qps)))
        return out


class BusyChannels:
    """The channels with something to do (data to send or acknowledge, a DCQCN rate below
    line rate), in the agent's channel order (the order the loop has always served them):
    its per-pass scans walk ``list``, not every channel (a GPU of a 32-GPU ring has ~40, of
    which a ring step uses one to four). An idle channel's DCQCN alpha timer catches up when
    it is next used (the agent ticks it before a CNP counts, and every pass once busy)."""

    def __init__(self, channels):
        self.order = {ch: i for i, ch in enumerate(channels)}
        self.members: set = set()
        self.list: list = []

    def add(self, ch: Channel):
        if ch not in self.members:
            self.members.add(ch)
            self.list = sorted(self.members, key=self.order.__getitem__)

    def drop_idle(self):
        idle = [ch for ch in self.list if not (ch.sendq.has_pending() or ch.sendq.unacked or ch.rp.active)]
        if idle:
            for ch in idle:
                ch.tx_since_ns = None  # nothing due: its packets are due from when it has some again
                self.members.discard(ch)
            self.list = [ch for ch in self.list if ch in self.members]


def udp_receive_errors(path: str = "/proc/net/snmp") -> int:
    """Datagrams this GPU's namespace dropped on receive (a full socket buffer: the agent did
    not read in time). Such a loss is the host's, not the fabric's: the fidelity guard says so."""
    try:
        lines = [line.split() for line in open(path) if line.startswith("Udp:")]
    except OSError:
        return 0
    if len(lines) < 2:
        return 0
    row = dict(zip(lines[0][1:], lines[1][1:]))
    return int(row.get("RcvbufErrors", 0)) + int(row.get("InErrors", 0))
