"""A GPU's NICs and its reliable connections: a ``Nic`` sends frames on a raw packet socket
(its serializer's busy-until time paces them at line rate); a ``Channel`` is the reliable
connection to one peer over one NIC (send QP, receive QP, DCQCN reaction point, frame
templates)."""

from __future__ import annotations

import socket
from collections import defaultdict, deque

from testbed.agent.dcqcn import ReactionPoint
from testbed.agent.transport import RecvQP, SendQP
from testbed.wire import roce

TX_BUFFER_BYTES = 4 * 1024 * 1024


class Nic:
    def __init__(self, link: str, spec: dict):
        self.link, self.intf, self.line_bps = link, spec["intf"], spec["line_bps"]
        self.me = roce.Endpoint(spec["mac"], spec["ip"])
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TX_BUFFER_BYTES)
        self.sock.bind((spec["intf"], 0))
        self.free_ns = 0  # the NIC's serializer is busy until then (emulated)
        self.blocked = 0

    def send(self, frame: bytes):
        try:
            self.sock.send(frame)
        except BlockingIOError:
            self.blocked += 1


class Channel:
    """The reliable connection to one peer over one NIC."""

    def __init__(self, agent, peer: str, p: dict, nic: Nic):
        self.peer, self.nic = peer, nic
        bit = roce.NVLINK_QPN_BIT if nic.link == "nvlink" else 0
        mine, theirs = roce.qpn(agent.index, p["index"]) | bit, roce.qpn(p["index"], agent.index) | bit
        addr = p if nic.link == "fabric" else {"mac": p["nvlink_mac"], "ip": p["nvlink_ip"]}
        self.remote = roce.Endpoint(addr["mac"], addr["ip"])
        self.sport, self.dqpn = roce.udp_source_port(mine, theirs), theirs
        self.data = {}  # payload length -> FrameTemplate
        self.ack = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, roce.AETH_LEN, roce.DSCP_CONTROL, 0)
        self.cnp = roce.FrameTemplate(nic.me, self.remote, self.sport, theirs, roce.CNP_PAD_LEN, roce.DSCP_CNP, 0)
        self.sendq, self.recvq = SendQP(agent.mtu), RecvQP()
        self.rp = ReactionPoint(nic.line_bps, 0, agent.params, enabled=agent.cfg["dcqcn"] and nic.link == "fabric")
        self.next_tx_ns = 0
        self.tx_since_ns = None  # when this channel last went from nothing to send to something
        self.last_cnp_ns = None
        self.counters = defaultdict(int)
        self.recv_ops = deque()  # posted receives (op ids), in order
        self.arrivals = deque()  # arrival times of messages no receive has taken yet
        self.send_ops = {}  # message number -> op id

    def data_frame(self, pkt, payload: bytes) -> bytes:
        tmpl = self.data.get(pkt.payload)
        if tmpl is None:
            tmpl = self.data[pkt.payload] = roce.FrameTemplate(self.nic.me, self.remote, self.sport, self.dqpn,
                                                               pkt.payload, roce.DSCP_DATA, roce.ECT0)
        body = payload if pkt.payload == len(payload) else payload[:pkt.payload]
        return tmpl.frame(pkt.opcode, pkt.psn & roce.PSN_MASK, pkt.ackreq, body)


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
