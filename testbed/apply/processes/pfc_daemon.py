"""The run's side of the PFC process (``testbed.apply.processes.pfcd``): start it once the switch
ports exist, hand it a link event's rate, end it on exit, and sum the totals it wrote."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from testbed.apply.processes.child import Child
from testbed.errors import RunError
from testbed.jsonlines import read_events
from testbed.model.placement import WHOLE, Site


class PfcDaemon:
    """Context manager: the run's PFC process, started once its ports exist, ended (by
    closing its stdin, then by PID) on exit. ``set_rate`` hands it a link event's rate."""

    READY_TIMEOUT_S = 30
    EXIT_TIMEOUT_S = 10
    RATE_TIMEOUT_S = 10

    def __init__(self, plan_path: Path, pins: Path, run_dir: Path, record, site: Site = WHOLE):
        """It serves the ports of ``site``'s switches (all, or a cluster run's share)."""
        switches = site.switches
        self.run_dir, self.record = run_dir, record
        self.events = run_dir / "pfc.jsonl"
        argv = [sys.executable, "-m", "testbed.apply.processes.pfcd", str(plan_path), str(pins), str(self.events)]
        if switches is not None:
            argv.append(",".join(switches))
        self.child = Child("the PFC process", argv, log=run_dir / "pfcd.log")

    def __enter__(self):
        self.child.start()
        self.record.add(processes=[self.child.pid])
        try:
            self.child.expect("ready", time.monotonic() + self.READY_TIMEOUT_S, "the PFC process to start")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def set_rate(self, real_rate_bps: int, intfs) -> int:
        """Ports' data class to ``real_rate_bps`` (x dilation here); returns when the process
        has done it (CLOCK_MONOTONIC ns). Called from one thread (the link events')."""
        self.child.send(f"rate {int(real_rate_bps)} {' '.join(intfs)}")
        self.child.expect("rate ok", time.monotonic() + self.RATE_TIMEOUT_S,
                          f"the PFC process to set {', '.join(intfs)} to {real_rate_bps} bit/s")
        return time.monotonic_ns()

    def check_alive(self):
        if not self.child.alive():
            raise RunError(f"the PFC process ended ({self.child.last_words()})")

    def __exit__(self, *exc):
        self.child.close_stdin()
        self.child.end(self.EXIT_TIMEOUT_S)
        return False

    def totals(self) -> dict:
        return totals(self.events)


def totals(events: Path) -> dict:
    """Per-port counters the PFC processes wrote at exit, summed, the ports that paused, and
    their reaction (the events of every server's process in a cluster run: XOFF decisions
    summed, the worst detection and pause-application times)."""
    records = list(read_events(events))
    ports = [r for r in records if r.get("event") == "port"]
    keys = ("frames_sent", "xoff_sent", "frames_received", "paused_ns", "drops")
    out = {k: sum(p[k] for p in ports) for k in keys}
    out["paused_ports"] = sorted(p["port"] for p in ports if p["frames_received"])
    out["headroom_high_water_bytes"] = max((p["headroom_high_water_bytes"] for p in ports), default=0)
    for r in records:
        if r.get("event") == "reaction":
            for k, v in r.items():
                if k == "xoff_polls":
                    out[k] = out.get(k, 0) + v
                elif k != "event":
                    out[k] = max(out.get(k, 0), v)
    return out
