"""Reliable-connected QP state machines, pure (no sockets, no clocks: callers pass ``now``).

Requester (``SendQP``): messages are cut into MTU packets with consecutive PSNs
(SEND_FIRST / MIDDLE / LAST, or ONLY); the ack-request bit is set on a message's last
packet and every ``ACKREQ_EVERY`` packets. A cumulative ACK frees everything up to its
PSN; a NAK (PSN sequence error) or a retransmission timeout goes back to the oldest
unacknowledged packet (go-back-N, as RoCE NICs without selective repeat do).

Responder (``RecvQP``): accepts only the expected PSN; coalesces ACKs (one per
``ACK_EVERY`` packets, or when asked, or at a message's end); on a gap it sends one NAK
for the expected PSN and drops until that PSN arrives; duplicates are re-ACKed.
Internally PSNs are unbounded integers; on the wire they are 24 bits, and ``unwrap``
maps a wire PSN back near a reference.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from testbed.wire import roce

ACKREQ_EVERY = 8
ACK_EVERY = 4


def unwrap(wire_psn: int, reference: int) -> int:
    """The unbounded PSN closest to ``reference`` whose low 24 bits are ``wire_psn``."""
    delta = (wire_psn - reference) & roce.PSN_MASK
    if delta >= 1 << 23:
        delta -= 1 << 24
    return reference + delta


@dataclass
class Packet:
    psn: int
    opcode: int
    payload: int
    ackreq: bool
    message: int  # message sequence number on this QP (0-based)
    last: bool


def split_message(nbytes: int, mtu_bytes: int, qps: int) -> list:
    """[(QP index, bytes), ...]: a message striped over a connection's ``qps`` queue pairs
    as NCCL does with NCCL_IB_QPS_PER_CONNECTION > 1 and NCCL_IB_SPLIT_DATA_ON_QPS=1, in
    whole MTU packets (so the packet count is that of the unsplit message), the first QPs
    taking one more packet when they do not divide evenly; a message of fewer packets
    than QPs uses only the first ones. Sender and receiver both derive it from the size."""
    packets = max(1, -(-nbytes // mtu_bytes))
    k = min(qps, packets)
    base, extra = divmod(packets, k)
    out, left = [], nbytes
    for i in range(k):
        b = left if i == k - 1 else min(left, (base + (i < extra)) * mtu_bytes)
        out.append((i, b))
        left -= b
    return out


def message_packets(nbytes: int, mtu_bytes: int, first_psn: int, msg: int) -> list:
    """A message cut into MTU packets with consecutive PSNs from ``first_psn``: SEND_FIRST /
    MIDDLE / LAST (or ONLY); the ack-request bit on the last and every ``ACKREQ_EVERY``."""
    count = max(1, -(-nbytes // mtu_bytes))
    out = []
    for i in range(count):
        payload = min(mtu_bytes, nbytes - i * mtu_bytes) if nbytes else 0
        if count == 1:
            op = roce.OP_SEND_ONLY
        else:
            op = roce.OP_SEND_FIRST if i == 0 else roce.OP_SEND_LAST if i == count - 1 else roce.OP_SEND_MIDDLE
        psn, last = first_psn + i, i == count - 1
        out.append(Packet(psn, op, payload, last or (psn + 1) % ACKREQ_EVERY == 0, msg, last))
    return out


class SendQP:
    def __init__(self, mtu_bytes: int):
        self.mtu = mtu_bytes
        self.unacked = deque()  # Packets posted and not yet acknowledged, in PSN order
        self.next_index = 0  # index into unacked of the next packet to (re)transmit
        self.next_psn = 0
        self.messages = 0
        self.acked_messages = 0
        self.retransmitted = 0
        self.retransmitted_bytes = 0  # on the wire (headers included)
        self.naks = 0
        self.timeouts = 0
        self.sent_psn = 0  # one past the highest PSN ever transmitted
        self.last_progress_ns = None

    def post(self, nbytes: int) -> int:
        """Queue a message; returns its sequence number on this QP."""
        msg = self.messages
        self.messages += 1
        packets = message_packets(nbytes, self.mtu, self.next_psn, msg)
        self.unacked.extend(packets)
        self.next_psn += len(packets)
        return msg

    def has_pending(self) -> bool:
        return self.next_index < len(self.unacked)

    def peek(self) -> Packet | None:
        return self.unacked[self.next_index] if self.has_pending() else None

    def sent(self, packet: Packet, now_ns: int):
        """The packet returned by ``peek`` went on the wire."""
        if packet.psn < self.sent_psn:
            self.retransmitted += 1
            self.retransmitted_bytes += roce.wire_bytes(packet.payload)
        self.sent_psn = max(self.sent_psn, packet.psn + 1)
        self.next_index += 1
        if self.last_progress_ns is None:
            self.last_progress_ns = now_ns

    def on_ack(self, wire_psn: int, now_ns: int) -> list:
        """Cumulative ACK up to and including ``wire_psn``; returns the message numbers now
        fully acknowledged."""
        if not self.unacked:
            return []
        psn = unwrap(wire_psn, self.unacked[0].psn)
        done = []
        while self.unacked and self.unacked[0].psn <= psn and self.unacked[0].psn < self.sent_psn:
            p = self.unacked.popleft()
            self.next_index = max(0, self.next_index - 1)
            if p.last:
                done.append(p.message)
                self.acked_messages += 1
            self.last_progress_ns = now_ns
        if not self.unacked:
            self.last_progress_ns = None
        return done

    def on_nak(self, wire_psn: int, now_ns: int) -> list:
        """NAK(PSN sequence error): everything before ``wire_psn`` arrived; resend from it."""
        self.naks += 1
        done = self.on_ack((wire_psn - 1) & roce.PSN_MASK, now_ns) if self.unacked else []
        self.next_index = 0
        return done

    def check_timeout(self, now_ns: int, rto_ns: int) -> bool:
        """Go back N when the oldest sent packet has waited ``rto_ns`` without progress."""
        if self.unacked and self.next_index > 0 and self.last_progress_ns is not None \
                and now_ns - self.last_progress_ns >= rto_ns:
            self.timeouts += 1
            self.next_index = 0
            self.last_progress_ns = now_ns
            return True
        return False


class RecvQP:
    def __init__(self):
        self.expected = 0
        self.since_ack = 0
        self.nak_sent_for = None
        self.message_bytes = 0
        self.messages = []  # completed message sizes, in order
        self.naks_sent = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.bytes = 0

    def on_data(self, wire_psn: int, opcode: int, payload: int, ackreq: bool) -> tuple:
        """Returns (reply, completed): reply is ("ack", wire_psn), ("nak", wire_psn) or None;
        completed is the size of a message this packet finished, or None."""
        psn = unwrap(wire_psn, self.expected)
        if psn < self.expected:
            self.duplicates += 1
            return ("ack", (self.expected - 1) & roce.PSN_MASK), None
        if psn > self.expected:
            self.out_of_order += 1
            if self.nak_sent_for != self.expected:
                self.nak_sent_for = self.expected
                self.naks_sent += 1
                return ("nak", self.expected & roce.PSN_MASK), None
            return None, None
        self.expected += 1
        self.since_ack += 1
        self.bytes += payload
        self.message_bytes += payload
        completed = None
        if opcode in (roce.OP_SEND_LAST, roce.OP_SEND_ONLY):
            completed, self.message_bytes = self.message_bytes, 0
            self.messages.append(completed)
        if ackreq or completed is not None or self.since_ack >= ACK_EVERY:
            self.since_ack = 0
            return ("ack", psn & roce.PSN_MASK), completed
        return None, completed
