"""A reliable-unordered transport modelled on Ultra Ethernet 1.0 (PDS RUD, section 3.5), pure
(callers pass ``now``, emulated ns; the congestion control gets real-fabric ns).

Sender (``UetSendQP``): every packet has its own PSN; any packet may arrive in any order.
A SACK frees what it acknowledges (cumulative PSN + a 64-packet bitmap above it); a NACK
for a trimmed packet queues exactly that PSN for retransmission; a retransmission timeout
queues the packets sent longer than the RTO ago and still unacknowledged (selective: never
the ones already acknowledged). New packets and retransmissions are sent only while NSCC's
window allows (``nscc.Nscc.can_send``); a message is done once every one of its PSNs is
acknowledged.

Receiver (``UetRecvQP``): places every packet where it belongs whatever its order (the
bitmap of PSNs received above the cumulative one); a message completes when the cumulative
PSN passes its last packet. It answers with a SACK every ``ACK_EVERY`` new packets, on the
sender's ack request, at a message's end, and on a duplicate; the SACK carries Rcvd_Bytes
(3.6.13.8-9) and the M flag (a CE mark since the last SACK). A trimmed packet gets a NACK
at once.

Modelled: per-packet PSNs, out-of-order placement, SACK, selective retransmission, NACK
on trim, NSCC (``nscc``). Not modelled: the PDS wire format (see ``wire.roce``), PDC
establishment, the ROD/RUDI/UUD delivery modes, SACK-gap loss inference (a lost packet
that was not trimmed waits for the timeout), packet-rate entropy feedback (the sender
sprays round robin, ``channel``), RCCC and TFC.
"""

from __future__ import annotations

from collections import deque

from testbed.agent.transport import Packet, message_packets, unwrap
from testbed.wire import roce

ACK_EVERY = 4


class UetSendQP:
    def __init__(self, mtu_bytes: int, cc, dilation: float, rtt_missing_ns: float = 0.0):
        self.mtu, self.cc, self.d = mtu_bytes, cc, dilation
        self.rtt_missing_ns = rtt_missing_ns  # real-fabric RTT the emulated fabric does not take
        self.packets: dict[int, Packet] = {}  # posted, not yet acknowledged, in PSN order
        self.next_psn = 0  # next PSN a posted packet gets
        self.send_next = 0  # the lowest PSN never sent
        self.resend: deque = deque()  # PSNs to send again (NACKed or timed out), in order
        self.queued: set = set()
        self.tx: dict[int, tuple] = {}  # PSN -> (last send time, times retransmitted)
        self.ends: deque = deque()  # (last PSN, message number) of messages not yet done
        self.messages = self.acked_messages = 0
        self.retransmitted = self.retransmitted_bytes = 0
        self.naks = self.timeouts = 0
        self.timed_out: set = set()  # PSNs a timeout queued again (not a NACK)
        self.timeout_resends = 0  # of the retransmissions, those a timeout queued
        self.last_progress_ns = None

    # the interface the agent's loop shares with transport.SendQP
    @property
    def unacked(self) -> bool:
        return bool(self.packets)

    @property
    def sent_psn(self) -> int:
        return self.send_next

    def post(self, nbytes: int) -> int:
        msg = self.messages
        self.messages += 1
        for pkt in message_packets(nbytes, self.mtu, self.next_psn, msg):
            self.packets[pkt.psn] = pkt
        self.next_psn = pkt.psn + 1
        self.ends.append((pkt.psn, msg))
        return msg

    def _next(self):
        while self.resend and self.resend[0] not in self.packets:  # acknowledged since it was queued
            self.queued.discard(self.resend.popleft())
        if self.resend:
            return self.packets[self.resend[0]]
        return self.packets.get(self.send_next) if self.send_next < self.next_psn else None

    def has_pending(self) -> bool:
        return self._next() is not None and self.cc.can_send()

    def peek(self) -> Packet:
        pkt = self._next()
        if self.cc.ack_request(roce.wire_bytes(pkt.payload)):
            pkt.ackreq = True
        return pkt

    def sent(self, pkt: Packet, now_ns: int):
        size = roce.wire_bytes(pkt.payload)
        if self.resend and self.resend[0] == pkt.psn:
            self.queued.discard(self.resend.popleft())
            if pkt.psn in self.timed_out:
                self.timed_out.discard(pkt.psn)
                self.timeout_resends += 1
            self.retransmitted += 1
            self.retransmitted_bytes += size
            self.tx[pkt.psn] = (now_ns, self.tx[pkt.psn][1] + 1)
        else:
            self.send_next += 1
            self.tx[pkt.psn] = (now_ns, 0)
        self.cc.on_send(size)
        if self.last_progress_ns is None:
            self.last_progress_ns = now_ns

    def on_sack(self, wire_psn: int, body: bytes, now_ns: int) -> list:
        """A SACK (``wire.roce.SACK`` body) triggered by PSN ``wire_psn``; returns the
        message numbers now fully acknowledged."""
        ref = next(iter(self.packets), self.send_next)
        cack_wire, bitmap, _rcvd, flags = roce.SACK.unpack(body[:roce.SACK.size])
        cack = unwrap(cack_wire & roce.PSN_MASK, ref)
        sent_at = self.tx.get(unwrap(wire_psn, ref))  # before the packet's record goes with its ACK
        newly = 0
        for psn in [p for p in self.packets if p < cack]:
            newly += self._acked(psn)
        base = cack + 1
        while bitmap:
            low = bitmap & -bitmap
            psn = base + low.bit_length() - 1
            if psn in self.packets:
                newly += self._acked(psn)
            bitmap ^= low
        # an RTT only from a packet sent once: its ACK cannot be for another copy (3.6.13.1)
        rtt = self._rtt(sent_at, now_ns)
        if newly:
            self.last_progress_ns = now_ns if self.packets else None
        self.cc.on_ack(newly, bool(flags & roce.SACK_FLAG_M), rtt, self.d.real_duration_ns(now_ns))
        done, una = [], next(iter(self.packets), self.next_psn)
        while self.ends and self.ends[0][0] < una:
            done.append(self.ends.popleft()[1])
            self.acked_messages += 1
        return done

    def _rtt(self, sent_at, now_ns: int):
        """Real-fabric RTT of a packet's ACK (or NACK), None when ambiguous; the switches'
        store-and-forward serialisation, which the emulation does not take, is added."""
        if not sent_at or sent_at[1]:
            return None
        return self.d.real_duration_ns(now_ns - sent_at[0]) + self.rtt_missing_ns

    def _acked(self, psn: int) -> int:
        pkt = self.packets.pop(psn)
        self.tx.pop(psn, None)
        self.timed_out.discard(psn)
        return roce.wire_bytes(pkt.payload)

    def on_nack(self, wire_psn: int, now_ns: int):
        """The switch trimmed packet ``wire_psn``: send exactly it again."""
        self.naks += 1
        psn = unwrap(wire_psn, next(iter(self.packets), self.send_next))
        pkt = self.packets.get(psn)
        if pkt is None or psn in self.queued:
            self.timed_out.discard(psn)  # queued by the timer, but trimmed: the resend answers this NACK
            return
        self.resend.append(psn)
        self.queued.add(psn)
        rtt = self._rtt(self.tx.get(psn), now_ns)
        self.cc.on_nack(roce.wire_bytes(pkt.payload), rtt, self.d.real_duration_ns(now_ns))

    def check_timeout(self, now_ns: int, rto_ns: int) -> bool:
        """Queue again every sent, unacknowledged packet last sent ``rto_ns`` ago or more."""
        if not self.packets or self.last_progress_ns is None or now_ns - self.last_progress_ns < rto_ns:
            return False
        expired = [psn for psn in self.packets if psn < self.send_next and psn not in self.queued
                   and now_ns - self.tx[psn][0] >= rto_ns]
        for psn in expired:
            self.resend.append(psn)
            self.queued.add(psn)
            self.timed_out.add(psn)
            self.cc.on_inferred_loss(roce.wire_bytes(self.packets[psn].payload))
        self.last_progress_ns = now_ns
        if expired:
            self.timeouts += 1
        return bool(expired)


class UetRecvQP:
    def __init__(self):
        self.expected = 0  # every PSN below it arrived (the cumulative PSN of the SACKs)
        self.above: dict[int, tuple] = {}  # PSN -> (payload, last of a message) arrived above it
        self.message_bytes = 0
        self.messages = []  # completed message sizes, in order
        self.bytes = 0
        self.rcvd_bytes = 0  # new data bytes, nominal (3.6.13.8)
        self.since_ack = 0
        self.marked = False  # a CE mark since the last SACK
        self.duplicates = self.out_of_order = self.trimmed = self.naks_sent = 0

    def on_data(self, wire_psn: int, opcode: int, payload: int, ackreq: bool, ce: bool) -> tuple:
        """Returns (reply, completed): reply is a SACK body to send (``roce.SACK``) or None;
        completed the sizes of the messages this packet finished."""
        psn = unwrap(wire_psn, self.expected)
        self.marked |= ce
        if psn < self.expected or psn in self.above:
            self.duplicates += 1
            return self.sack(), []
        last = opcode in (roce.OP_SEND_LAST, roce.OP_SEND_ONLY)
        self.rcvd_bytes += roce.wire_bytes(payload)
        self.since_ack += 1
        completed = []
        if psn > self.expected:
            self.out_of_order += 1
            self.above[psn] = (payload, last)
        else:
            self._place(payload, last, completed)
            while self.expected in self.above:
                self._place(*self.above.pop(self.expected), completed)
        if ackreq or completed or self.since_ack >= ACK_EVERY:
            return self.sack(), completed
        return None, completed

    def _place(self, payload: int, last: bool, completed: list):
        self.expected += 1
        self.bytes += payload
        self.message_bytes += payload
        if last:
            completed.append(self.message_bytes)
            self.messages.append(self.message_bytes)
            self.message_bytes = 0

    def sack(self) -> bytes:
        bitmap = 0
        for psn in self.above:
            if psn - self.expected - 1 < roce.SACK_BITS:
                bitmap |= 1 << (psn - self.expected - 1)
        flags = roce.SACK_FLAG_M if self.marked else 0
        self.since_ack, self.marked = 0, False
        return roce.SACK.pack(self.expected & 0xFFFFFFFF, bitmap, ((self.rcvd_bytes + 255) >> 8) & 0xFFFFFFFF, flags)

    def on_trimmed(self, wire_psn: int) -> bool:
        """A trimmed packet arrived: True if a NACK should go back (not a duplicate)."""
        psn = unwrap(wire_psn, self.expected)
        self.trimmed += 1
        if psn < self.expected or psn in self.above:
            return False
        self.naks_sent += 1
        return True
