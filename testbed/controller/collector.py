"""The collector's I/O, used by the controller process every telemetry interval: append
records to the run folder's JSON-lines files (line-buffered, so an interrupted run keeps
every poll so far) and read the switch ports' queues (the marker's pinned maps and the
data class TBFs). What is recorded, and its format, is ``telemetry``'s."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from testbed.wire import bpfmaps
from testbed.apply.datapath import bpfmap
from testbed.controller import telemetry
from testbed.apply.datapath.marker import Counters
from testbed.apply.datapath.qdiscstat import QdiscReader

FILES = ("ports", "ecn", "queues", "polls")
OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")


class Collector:
    def __init__(self, folder: str | Path, plan, pins: str | Path | None, switches=None):
        """``plan``: the run's plan, typed (``PlanFile``, or the ``Plan`` itself: its queues);
        ``switches``: the switches whose queues are on this machine (a cluster run's share;
        each server's share collects its own), None for all of the plan's."""
        self.folder = Path(folder)
        self.files = {name: open(self.folder / f"{name}.jsonl", "a", buffering=1) for name in FILES}
        self.queues = [q for q in plan.queues if switches is None or q.switch in switches]
        self.pins = Path(pins) if pins else None
        self.counters: Counters | None = None
        self.pfc: bpfmap.Map | None = None  # the PFC process's per-port counters
        self.cfg: bpfmap.Map | None = None  # the marker's per-port config: the rate in force
        self.qdiscs: QdiscReader | None = None
        self.ifindex: dict[str, int] = {}
        self.polls = 0
        self.cpu = telemetry.CpuMeter(os.sysconf("SC_CLK_TCK"))
        self.ovs_pid = _read_pid(OVS_PIDFILE)

    def close(self):
        for f in self.files.values():
            f.close()
        if self.counters is not None:
            self.counters.close()
        for m in (self.pfc, self.cfg):
            if m is not None:
                m.close()
        if self.qdiscs is not None:
            self.qdiscs.close()

    def write(self, name: str, records: list):
        if records:
            self.files[name].write("".join(json.dumps(r) + "\n" for r in records))

    def _open_queues(self) -> bool:
        """The marker's maps and the ports appear once the run has set up the queues
        (possibly after the fabric is programmed): until then there is nothing to read."""
        if self.counters is not None:
            return True
        if self.pins is None or not self.queues:
            return False
        try:
            ifindex = {pq.intf: socket.if_nametoindex(pq.intf) for pq in self.queues}
            self.counters = Counters(self.pins)
            self.pfc = bpfmap.Map(str(self.pins / "testbed_pfc"), bpfmaps.PFC_SIZE)
            self.cfg = bpfmap.Map(str(self.pins / "testbed_cfg"), bpfmaps.CFG_SIZE)
        except OSError:
            for m in (self.counters, self.pfc):
                if m is not None:
                    m.close()
            self.counters = self.pfc = None
            return False
        self.ifindex = ifindex
        self.qdiscs = QdiscReader()
        return True

    def poll_queues(self, now_ns: int) -> int:
        """Read and record every switch port's queue; returns how many were read. Ports
        that vanish (the fabric being torn down) are left out, not fatal."""
        if not self._open_queues():
            return 0
        try:
            states = self.counters.read(self.ifindex.values())
        except OSError:
            return 0
        records = []
        for pq in self.queues:
            idx = self.ifindex[pq.intf]
            try:
                tbf = self.qdiscs.read(idx)
            except OSError:
                continue
            raw = self.pfc.lookup(idx)
            pfc = bpfmaps.pfc_counters(raw) if raw else None
            cfg = self.cfg.lookup(idx)
            rate = bpfmaps.cfg_rate_bps(cfg) if cfg else pq.emulated_rate_bps
            records.append(telemetry.queue_record(now_ns, pq, states.get(idx), tbf, pfc, rate))
        self.write("queues", records)
        return len(records)

    def poll_done(self, started_ns: int, skipped: int, queues: int):
        self.polls += 1
        rec = {"t_ns": started_ns, "poll": self.polls, "read_ns": time.monotonic_ns() - started_ns,
               "skipped_total": skipped, "queues": queues}
        rec.update(self.cpu.sample(started_ns, telemetry.host_cpu_ticks(Path("/proc/stat").read_text()),
                                   self._ovs_ticks()))
        self.write("polls", [rec])

    def _ovs_ticks(self) -> int | None:
        if self.ovs_pid is None:
            return None
        try:
            return telemetry.process_cpu_ticks(Path(f"/proc/{self.ovs_pid}/stat").read_text())
        except OSError:
            return None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
