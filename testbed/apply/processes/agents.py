"""The GPU agents of a run: one process per server, serving its GPUs (each GPU's sockets
opened in that GPU's namespace), started together, watched to the end.

``Agents`` is a context manager: it starts every server's agent process with the run's
``plan.json`` and its GPUs (each agent reads its ops, peers and transport settings there)
with the PID of each GPU's Mininet host (whose namespace it enters to open the sockets),
waits until every one has its sockets open, hands all of them the same start time (a little in the
future on CLOCK_MONOTONIC), and waits for every agent to finish its ops: as long as the
training makes progress (a starved machine trains late, and the fidelity guard says so),
until no op has ended for the hang guard's time. Each agent process's stderr is kept in the
run folder (``agents-serverN.log``): one that ends without finishing is reported with how
it ended and its last lines. On exit, normal or not, it closes their stdin (their signal to
stop) and ends any that remain, by PID.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from testbed.apply.processes.child import Child, stop_all
from testbed.errors import RunError

READY_TIMEOUT_S = 120  # 8 GPUs' agents starting at once took ~1 min under QEMU software emulation
START_MARGIN_S = 0.5
EXIT_TIMEOUT_S = 10
AGENT_DEADLINE_STALLS = 10  # the agents' own deadline, in hang-guard times: only if the run stops watching


class StallGuard:
    """The hang deadline of a training: ``stall_s`` after the last op any of this server's
    GPUs finished (read by ``progress``), so a slow but moving training is never cut short,
    and a stuck one ends after ``stall_s``. Without a progress, a fixed deadline."""

    def __init__(self, stall_s: float, progress=None, clock=time.monotonic):
        self.stall_s, self.progress, self.clock = stall_s, progress, clock
        self.seen = -1
        self.end = clock() + stall_s

    def tick(self):
        if self.progress is None:
            return
        self.progress.tick()
        if self.progress.done != self.seen:
            self.seen, self.end = self.progress.done, self.clock() + self.stall_s

    def deadline(self) -> float:
        return self.end

    def explain(self) -> str:
        if self.progress is None:
            return f"hang guard {self.stall_s:.0f}s"
        return f"no op ended for {self.stall_s:.0f}s; {self.progress.done} of {self.progress.total} ops done"


class Agents:
    def __init__(self, fabric, gpus, plan_path: Path, records_dir: Path, record):
        self.records_dir, self.record = records_dir, record
        server_of = {h.name: h.server for h in fabric.plan.hosts}
        servers = {}
        for gpu in gpus:
            servers.setdefault(server_of[gpu], []).append(gpu)
        self.children = [Child(f"the agents of server {server} ({', '.join(members)})",
                               [sys.executable, "-m", "testbed.agent", str(plan_path), str(records_dir),
                                *(f"{gpu}={fabric.host(gpu).pid}" for gpu in members)],
                               popen=fabric.host(members[0]).popen,
                               log=records_dir.parent / f"agents-server{server}.log")
                         for server, members in servers.items()]

    def __enter__(self):
        self.records_dir.mkdir(exist_ok=True)
        try:
            for child in self.children:
                child.start()
                self.record.add(processes=[child.pid])
            deadline = time.monotonic() + READY_TIMEOUT_S
            for child in self.children:
                child.expect("ready", deadline, f"{child.name} to open its sockets")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def train(self, stall_s: float, progress=None, on_start=None, total_s: float = 0.0) -> int:
        """Start every agent on one deadline and wait until all are done, or until no op has
        ended for ``stall_s`` (with a ``progress``; without one, ``stall_s`` bounds the whole
        training); returns the start time (CLOCK_MONOTONIC ns). ``progress``: a ``Progress``
        to update while waiting; ``on_start(start_ns)``: called once the agents have their
        start time. The agents' own deadline (``AGENT_DEADLINE_STALLS`` stalls, at least
        ``total_s``: a long training of many short steps) only ends them if this process
        stops watching."""
        start_ns = time.monotonic_ns() + int(START_MARGIN_S * 1e9)
        self.start(start_ns, start_ns + int(max(AGENT_DEADLINE_STALLS * stall_s, total_s) * 1e9))
        if on_start:
            on_start(start_ns)
        guard = StallGuard(stall_s + START_MARGIN_S, progress)
        self.wait_done(guard.deadline, progress, guard=guard)
        return start_ns

    def start(self, start_ns: int, deadline_ns: int):
        """Hands every agent the start time and deadline (this machine's CLOCK_MONOTONIC ns;
        a cluster run's coordinator has shifted them by this server's measured offset)."""
        for child in self.children:
            child.send(f"{start_ns} {deadline_ns}")

    def wait_done(self, end, progress=None, guard=None):
        """Until every agent has finished its ops (``end``: time.monotonic() hang deadline, or
        a callable returning it). They then linger, answering their peers, until exit."""
        watch = guard.tick if guard else (progress.tick if progress else None)

        def tick():  # an agent exits only once told to: any that has, while we wait, failed
            if watch is not None:
                watch()
            for other in self.children:
                if other.proc.poll() is not None:
                    raise RunError(f"{other.name} ended before its schedule was done ({other.last_words()})")

        for child in self.children:
            try:
                child.expect("done", end, f"{child.name} to finish its schedule", tick=tick)
            except RunError as exc:
                if guard is not None and time.monotonic() >= guard.deadline():
                    raise RunError(f"{exc}: {guard.explain()}") from None
                raise
        if progress:
            progress.tick()

    def __exit__(self, *exc):
        stop_all(self.children, EXIT_TIMEOUT_S)
        return False
