"""Scenario events on the live fabric: links pulled, plugged and slowed while the GPUs train.

``LinkEvents`` is a context manager around the training. ``start(start_ns)`` (the agents'
common start, CLOCK_MONOTONIC) arms a timer thread that, at each event's time (its real
fabric time x dilation after the start), sets the link's leaf-end interface down or up
with ``ip link``, the way a cable is pulled: the leaf's port goes down and the spine's end
loses its carrier, both switches tell the controller (OpenFlow port status), and it
reroutes (``controller.routing``). A slow link gets its new rate on both ends' ports through
``set_rate`` (the PFC process's, which owns the data class's rate) and nothing else: no
port goes down and the controller is not told. What was done and when goes to
``link-events.jsonl`` in the run folder. On exit the timer is stopped, an ``end`` record closes the file and every
link still down is brought back up (the fabric's teardown follows).
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from pathlib import Path

LOG = logging.getLogger(__name__)
IP_TIMEOUT_S = 10


def set_link(intf: str, up: bool):
    subprocess.run(["ip", "link", "set", "dev", intf, "up" if up else "down"], check=True, timeout=IP_TIMEOUT_S,
                   capture_output=True)


class LinkEvents:
    def __init__(self, events, dilation, run_dir: Path, set_rate=None):
        self.events, self.dilation, self.set_rate = events, dilation, set_rate
        self.path = run_dir / "link-events.jsonl"
        self.stop = threading.Event()
        self.thread = None
        self.down: set = set()
        self.error: BaseException | None = None

    def __enter__(self):
        return self

    def start(self, start_ns: int):
        if not self.events or self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run, args=(start_ns,), name="link-events", daemon=True)
        self.thread.start()

    def _run(self, start_ns: int):
        try:
            with open(self.path, "a", buffering=1) as out:
                for e in self.events:
                    due_ns = start_ns + int(self.dilation.duration_ns(e.at_ns))
                    if self.stop.wait(max(0.0, (due_ns - time.monotonic_ns()) / 1e9)):
                        return  # the run is ending
                    t_ns = time.monotonic_ns()
                    rec = {"event": f"link_{e.action}", "link": e.name, "intfs": list(e.intfs),
                           "peers": list(e.peers), "at_real_ns": e.at_ns, "due_ns": due_ns, "t_ns": t_ns,
                           "late_ns": t_ns - due_ns}
                    if e.rate_bps:
                        rec.update(rate_bps=e.rate_bps,
                                   rate_set_ns=self.set_rate(e.rate_bps, [*e.intfs, *e.peers]))
                    if e.action != "slow":
                        for intf in e.intfs:
                            set_link(intf, e.action == "up")
                            (self.down.discard if e.action == "up" else self.down.add)(intf)
                    out.write(json.dumps(rec) + "\n")
                    LOG.info("link %s %s%s (%s after the start, real time)", e.name, e.action,
                             f" to {e.rate_bps / 1e9:g} Gbit/s" if e.rate_bps else "", f"{e.at_ns / 1000:g}us")
        except BaseException as exc:  # noqa: BLE001 - reported by check(), the run fails loudly
            self.error = exc

    def check(self):
        """Raises what the timer thread hit (an ``ip link`` that failed)."""
        if self.error is not None:
            raise self.error

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=IP_TIMEOUT_S * 2)
            # the end of the events' time: what the controller does after it (links put back
            # here, the fabric's teardown) is not the last event's doing
            with open(self.path, "a") as out:
                out.write(json.dumps({"event": "end", "t_ns": time.monotonic_ns(),
                                      "restored": sorted(self.down)}) + "\n")
        for intf in sorted(self.down):
            try:
                set_link(intf, True)
            except (subprocess.SubprocessError, OSError) as err:
                LOG.warning("could not bring %s back up: %s", intf, err)
        return False
