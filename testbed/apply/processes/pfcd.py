"""The switches' PFC: real 802.1Qbb frames between switch ports, pausing the data class.

One process per run in the root namespace (where every switch port lives; in a cluster
run one per server, for that server's ports: run/share.py), started by
``apply.processes.pfc_daemon.PfcDaemon`` with the run's ``plan.json`` (each port's queue settings and the ports its
PFC pauses) and the run's BPF pin folder. Every ``model.pfc.poll_period_ns(dilation)`` (50 ns of fabric time, at least 1 ms) it reads each switch port's shadow queue (the marker's
map) and runs the XOFF/XON hysteresis (``pfc.Hysteresis``) on it; a queue far below XOFF is
not read again until it could have reached it at its feeders' line rates
(``pfc.quiet_until_ns``), so an idle fabric costs a few reads, not one per port per poll. Ingress accounting is
approximated per egress queue: when an egress queue passes XOFF, the switch sends a PFC
frame (priority 3, quanta 0xFFFF, refreshed before they run out) out of every port that
feeds that queue (``pfc.feeders``: the ingress ports whose routed traffic can leave by
it, planned in ``testbed.model.pfc``), so the upstream neighbours stop sending the data class on those links; a feeder
port is resumed (quanta 0) once no congested queue needs it paused. A paused neighbour
may be a GPU (its agent stops sending data) or another switch port, which then fills
and pauses its own feeders: pause spreads hop by hop.

Every switch port also listens for PFC frames (an AF_PACKET socket for EtherType
0x8808; OVS drops them in OpenFlow so they never reach a bridge's forwarding): on one,
the port's data class stops (its TBF turns down to a few kbit/s, the marker's shadow
stops draining) until quanta 0 arrives or the quanta run out (quanta x 512 bit-times at
the real rate, x dilation). On resume the TBF gets its rate back and one ignorable
MAC-control frame (``pfc.restart_frame``) through the qdisc: Linux's TBF keeps the
watchdog it set at the paused rate (seconds for one frame at a few kbit/s) across a rate
change, so without it a backlog with no new arrival behind it would sit out that wait. The control class (CNPs, ACKs) keeps flowing. Frames are
sent with PACKET_QDISC_BYPASS, so they do not wait behind the data they are meant to stop.

The process owns the data class's rate, since pausing changes it: a link event that slows a
link (``rate BPS INTF...`` on its stdin, real bit/s; answered ``rate ok`` once done) sets
the ports' rate in the marker's config (where the shadow queue drains, and where the
collector reads it) and, unless the port is paused, in its TBF; a resume restores the
rate in force, and pause quanta last 512 bit-times at it.

Records (``pfc.jsonl`` in the run folder, as they happen): frames sent and received,
pauses and resumes; at the end, per port: frames, paused time, headroom high-water
(shadow depth above XOFF seen while polling) and the marker's drops.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from testbed.apply.datapath.bpfmap import Map
from testbed.apply.datapath.tc import PAUSED_RATE_BPS, PortTc
from testbed.model.pfc import OVS_BATCH_PACKETS, Hysteresis, poll_period_ns, quiet_until_ns
from testbed.model.plan_file import PlanFile
from testbed.model.queues import MTU_BYTES, PortQueue
from testbed.wire import bpfmaps, pfc


@dataclass
class Port:
    pq: PortQueue  # the plan's settings for this port
    rate_bps: float  # the data class's emulated rate in force (the plan's until a link event slows it)
    real_rate_bps: float  # the same on the real fabric
    ifindex: int
    mac: str
    sock: socket.socket
    restart: socket.socket  # through the qdiscs: restarts the TBF on resume (pfc.restart_frame)
    feeders: tuple  # interface names on the same switch
    hyst: Hysteresis | None
    paused_until_ns: int = 0  # our data class is paused by the neighbour until then
    paused_since_ns: int | None = None
    paused_total_ns: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    xoff_sent: int = 0
    headroom_high_water_bytes: float = 0.0
    wanted_by: set = field(default_factory=set)  # congested egress queues that need this port's peer paused
    fill_bps: float = 0.0  # the fastest its queue can grow (emulated): its feeders' line rates
    slack_bytes: float = 0.0  # what its feeders can deliver at once beyond that (model.pfc.quiet_until_ns)
    quiet_until_ns: int = 0  # its queue cannot pass XOFF before then: not read until then


class SwitchPorts:
    """What the PFC process touches on this machine: each switch port's PFC and restart
    sockets and its TBF, and the run's marker maps (the shadow queues, the marker's config,
    our counters for the collector). Pfcd gets it (or a fake, in the unit tests) as ``dp``;
    everything it opened closes on exit."""

    drain = staticmethod(pfc.drain)

    def __init__(self, pins: str):
        self.pins = pins

    def __enter__(self):
        self.stack = ExitStack()
        try:
            self.tc = self.stack.enter_context(PortTc())
            self.cfg_map = self.stack.enter_context(Map(self.pins + "/testbed_cfg", bpfmaps.CFG_SIZE))
            self.state_map = self.stack.enter_context(Map(self.pins + "/testbed_state", bpfmaps.STATE_SIZE))
            self.pfc_map = self.stack.enter_context(Map(self.pins + "/testbed_pfc", bpfmaps.PFC_SIZE))
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self.stack.close()
        return False

    def open_port(self, intf: str) -> tuple:
        """(ifindex, MAC, PFC socket, restart socket) of a switch port."""
        mac = Path(f"/sys/class/net/{intf}/address").read_text().strip()
        sock = self.stack.enter_context(pfc.open_socket(intf))
        restart = self.stack.enter_context(pfc.open_restart_socket(intf))
        return socket.if_nametoindex(intf), mac, sock, restart

    def state(self, ifindex: int) -> bytes | None:
        return self.state_map.lookup(ifindex, lock=True)

    def cfg(self, ifindex: int) -> bytes | None:
        return self.cfg_map.lookup(ifindex)

    def set_cfg(self, ifindex: int, raw: bytes):
        self.cfg_map.update(ifindex, raw)

    def publish(self, ifindex: int, raw: bytes):
        self.pfc_map.update(ifindex, raw)

    def set_rate(self, intf: str, rate_bps: float, burst_bytes: int, limit_bytes: int):
        self.tc.set_rate(intf, rate_bps, burst_bytes, limit_bytes)


class Pfcd:
    """The PFC decisions of one process, on the clock and ports it is given (``dp``:
    SwitchPorts, or a fake; ``clock``: CLOCK_MONOTONIC ns, the BPF clock; ``out``: where
    its records go), so the unit tests run it on a fake clock and fake ports."""

    def __init__(self, plan: PlanFile, dp, out, clock=time.monotonic_ns, switches=None):
        """``switches``: the switches whose ports are on this machine (a cluster run's share:
        each server's PFC process serves its own ports; a pause for a feeder at a tunnel end
        crosses to the other server's process like any frame), None for all."""
        self.d = plan.dilation
        self.dp, self.out, self.clock = dp, out, clock
        self.ports: dict[str, Port] = {}
        self.poll_ns = poll_period_ns(self.d)
        # the emulation's own share of the pause reaction (the fidelity guard's input): the
        # longest a queue's crossing of XOFF could have gone unseen (the gap since the poll
        # before the one that sent the XOFF), and the longest a received pause took to apply
        self.reaction = {"xoff_polls": 0, "xoff_detect_max_ns": 0, "pause_apply_max_ns": 0}
        for pq in plan.queues:
            if switches is not None and pq.switch not in switches:
                continue
            intf = pq.intf
            ifindex, mac, sock, restart = dp.open_port(intf)
            pause_ns = self.d.duration_ns(pfc.pause_ns(pfc.MAX_QUANTA, pq.rate_bps))
            hyst = Hysteresis(pq.xoff_bytes, pq.xon_bytes, pause_ns) if pq.pfc else None
            self.ports[intf] = Port(pq=pq, rate_bps=pq.emulated_rate_bps, real_rate_bps=pq.rate_bps,
                                    ifindex=ifindex, mac=mac, sock=sock, restart=restart,
                                    feeders=pq.feeders, hyst=hyst)
        # a queue grows at most as fast as its feeders' links deliver (their plan rates: a link
        # event only slows one), plus their shapers' buckets and one OVS batch each
        for port in self.ports.values():
            fed = [self.ports[f].pq for f in port.feeders if f in self.ports]
            port.fill_bps = sum(f.emulated_rate_bps for f in fed)
            port.slack_bytes = sum(f.burst_bytes + OVS_BATCH_PACKETS * MTU_BYTES for f in fed)
        self.reads = {"queue_reads": 0, "queue_reads_skipped": 0}  # how much reading the quiet ports saves

    def record(self, **fields):
        self.out.write(json.dumps(fields) + "\n")

    def publish(self, port: Port):
        """A port's counters into the run's testbed_pfc map, where the collector reads them."""
        self.dp.publish(port.ifindex, bpfmaps.pack_pfc_counters(
            frames_sent=port.frames_sent, xoff_sent=port.xoff_sent, frames_received=port.frames_received,
            paused_ns=port.paused_total_ns, paused_since_ns=port.paused_since_ns or 0,
            headroom_high_water_bytes=port.headroom_high_water_bytes))

    # -- sending ---------------------------------------------------------------------------
    def send(self, port: Port, quanta: int, now: int, why: str):
        try:
            port.sock.send(pfc.frame(port.mac, {pfc.LOSSLESS_PRIORITY: quanta}))
        except OSError as exc:
            if exc.errno not in pfc.LINK_GONE_ERRNOS:
                raise
            # the link is down (a link event): the frame is lost with it, as on a cable
            self.record(t_ns=now, event="send_failed_link_down", port=port.pq.intf, quanta=quanta, why=why)
            return
        port.frames_sent += 1
        if quanta:
            port.xoff_sent += 1
        self.record(t_ns=now, event="xoff_sent" if quanta else "xon_sent", port=port.pq.intf, quanta=quanta,
                    why=why)
        self.publish(port)

    def poll_queues(self, now: int, since_last_ns: int = 0):
        for intf, port in self.ports.items():
            if port.hyst is None:
                continue
            if now < port.quiet_until_ns:
                self.reads["queue_reads_skipped"] += 1
                continue
            self.reads["queue_reads"] += 1
            raw = self.dp.state(port.ifindex)
            if raw is None:
                continue
            state = bpfmaps.marker_state(raw)
            rate = 0.0 if port.paused_since_ns is not None else port.rate_bps
            depth = bpfmaps.shadow_depth_now(state, rate, now)
            if depth - port.pq.xoff_bytes > port.headroom_high_water_bytes:
                port.headroom_high_water_bytes = depth - port.pq.xoff_bytes
                self.publish(port)
            action = port.hyst.update(depth, now)
            if now >= port.hyst.paused_until_ns:  # not pausing its feeders: quiet until it could pass XOFF
                port.quiet_until_ns = quiet_until_ns(depth, port.pq.xoff_bytes, port.fill_bps, port.slack_bytes,
                                                     now)
            if action == "xoff":
                self.reaction["xoff_polls"] += 1
                self.reaction["xoff_detect_max_ns"] = max(self.reaction["xoff_detect_max_ns"], since_last_ns)
                for name in port.feeders:
                    feeder = self.ports[name]
                    feeder.wanted_by.add(intf)
                    self.send(feeder, pfc.MAX_QUANTA, now, f"{intf} at {int(depth)} B > XOFF")
            elif action == "xon":
                for name in port.feeders:
                    feeder = self.ports[name]
                    feeder.wanted_by.discard(intf)
                    if not feeder.wanted_by:
                        self.send(feeder, 0, now, f"{intf} at {int(depth)} B <= XON")

    # -- receiving -------------------------------------------------------------------------
    def set_paused(self, port: Port, paused: bool, now: int):
        pq = port.pq
        if paused == (port.paused_since_ns is not None):
            return
        rate = PAUSED_RATE_BPS if paused else port.rate_bps
        self.dp.set_rate(pq.intf, rate, pq.burst_bytes, pq.fifo_limit_bytes)
        if not paused:
            try:  # the TBF still waits on the watchdog it set at the paused rate: restart it now
                port.restart.send(pfc.restart_frame(port.mac))
            except OSError as exc:
                self.record(t_ns=now, event="restart_failed", port=pq.intf, error=str(exc))
        if paused:
            took = self.clock() - now
            self.reaction["pause_apply_max_ns"] = max(self.reaction["pause_apply_max_ns"], took)
        self.update_cfg(port, bpfmaps.CFG_PAUSED, int(paused))
        if paused:
            port.paused_since_ns = now
        else:
            port.paused_total_ns += now - port.paused_since_ns
            port.paused_since_ns = None
        self.record(t_ns=now, event="paused" if paused else "resumed", port=pq.intf)
        self.publish(port)

    def update_cfg(self, port: Port, index: int, value: int):
        """One field of the port's marker config (the run wrote the rest)."""
        raw = self.dp.cfg(port.ifindex)
        if raw is not None:
            fields = list(struct.unpack(bpfmaps.CFG_FORMAT, raw))
            fields[index] = value
            self.dp.set_cfg(port.ifindex, struct.pack(bpfmaps.CFG_FORMAT, *fields))

    def set_rate(self, real_rate_bps: float, intfs: list, now: int):
        """A link event's new rate on ports (both ends of the links): the marker's shadow
        drains at it from now, the TBF sends at it unless the port is paused (then the
        resume does)."""
        for intf in intfs:
            port = self.ports[intf]
            port.real_rate_bps = real_rate_bps
            port.rate_bps = self.d.rate_bps(real_rate_bps)
            self.update_cfg(port, bpfmaps.CFG_RATE, int(port.rate_bps))
            if port.paused_since_ns is None:
                pq = port.pq
                self.dp.set_rate(intf, port.rate_bps, pq.burst_bytes, pq.fifo_limit_bytes)
                try:  # a TBF keeps the watchdog it set at the old rate: restart it at the new one
                    port.restart.send(pfc.restart_frame(port.mac))
                except OSError as exc:
                    self.record(t_ns=now, event="restart_failed", port=intf, error=str(exc))
            self.record(t_ns=now, event="rate_set", port=intf, rate_bps=real_rate_bps,
                        emulated_rate_bps=port.rate_bps, paused=port.paused_since_ns is not None)

    def command(self, line: str, now: int):
        """A line from the run on stdin (``rate BPS INTF...``), answered on stdout."""
        real_rate_bps, intfs = parse_rate_command(line, self.ports)
        self.set_rate(real_rate_bps, intfs, now)
        print("rate ok", flush=True)

    def receive(self, port: Port, now: int):
        for src, quanta in self.dp.drain(port.sock):
            if src == port.mac:
                continue  # our own frame, seen on the way out
            if pfc.LOSSLESS_PRIORITY not in quanta:
                continue
            port.frames_received += 1
            self.publish(port)
            q = quanta[pfc.LOSSLESS_PRIORITY]
            if q:
                port.paused_until_ns = now + int(self.d.duration_ns(pfc.pause_ns(q, port.real_rate_bps)))
                self.set_paused(port, True, now)
            else:
                port.paused_until_ns = 0
                self.set_paused(port, False, now)

    def expire(self, now: int):
        for port in self.ports.values():
            if port.paused_since_ns is not None and now >= port.paused_until_ns:
                self.set_paused(port, False, now)

    # -- loop ------------------------------------------------------------------------------
    def run(self, control):
        socks = {p.sock.fileno(): p for p in self.ports.values()}
        next_poll = last_poll = self.clock()
        while True:
            timeout = max(0.0, (next_poll - self.clock()) / 1e9)
            readable, _, _ = select.select(list(socks) + [control], [], [], timeout)
            now = self.clock()
            for fd in readable:
                if fd is control:
                    line = control.readline()
                    if not line:
                        return
                    self.command(line, now)
                else:
                    self.receive(socks[fd], now)
            if now >= next_poll:
                self.expire(now)
                self.poll_queues(now, now - last_poll)
                last_poll = now
                next_poll = max(next_poll + self.poll_ns, now)

    def report(self):
        now = self.clock()
        for port in self.ports.values():
            paused = port.paused_total_ns + (now - port.paused_since_ns if port.paused_since_ns else 0)
            raw = self.dp.state(port.ifindex)
            drops = bpfmaps.marker_state(raw)["drops"] if raw else 0
            self.record(event="port", port=port.pq.intf, frames_sent=port.frames_sent,
                        xoff_sent=port.xoff_sent, frames_received=port.frames_received, paused_ns=paused,
                        paused_real_ns=self.d.real_duration_ns(paused),
                        headroom_high_water_bytes=round(port.headroom_high_water_bytes),
                        headroom_bytes=port.pq.headroom_bytes, drops=drops)
        self.record(event="reaction", **self.reaction)
        self.record(event="polling", **self.reads)


def parse_rate_command(line: str, ports) -> tuple[float, list]:
    """``rate BPS INTF...`` -> (real bit/s, interfaces); ValueError for anything else (the
    run and this process are one program: a bad line is a bug, and ends the process)."""
    words = line.split()
    if len(words) < 3 or words[0] != "rate" or not words[1].isdigit() or int(words[1]) <= 0:
        raise ValueError(f"expected 'rate BPS INTF...', got {line.strip()!r}")
    unknown = [w for w in words[2:] if w not in ports]
    if unknown:
        raise ValueError(f"not a switch port of this run: {', '.join(unknown)}")
    return float(words[1]), words[2:]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan_path, pins, events = args[:3]
    switches = args[3].split(",") if len(args) > 3 else None
    plan = PlanFile.load(plan_path)
    with SwitchPorts(pins) as dp, open(events, "a", buffering=1) as out:
        daemon = Pfcd(plan, dp, out, switches=switches)
        print("ready", flush=True)
        try:
            daemon.run(sys.stdin)
        finally:
            daemon.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
