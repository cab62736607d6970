"""The GPU agents of a run: one process per server, serving its GPUs (each GPU's sockets
opened in that GPU's namespace), started together, watched to the end.

``Agents`` is a context manager: it starts every server's agent process with the run's
``plan.json`` and its GPUs (each agent reads its ops, peers and transport settings there)
with the PID of each GPU's Mininet host (whose namespace it enters to open the sockets),
waits until every one has its sockets open, hands all of them the same start time (a little in the
future on CLOCK_MONOTONIC), and waits for every agent to finish its ops. On exit, normal
or not, it closes their stdin (their signal to stop) and ends any that remain, by PID.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from testbed.apply.process import Child, stop_all

READY_TIMEOUT_S = 120  # 8 GPUs' agents starting at once took ~1 min under QEMU software emulation
START_MARGIN_S = 0.5
EXIT_TIMEOUT_S = 10


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
                               popen=fabric.host(members[0]).popen)
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

    def train(self, timeout_s: float, progress=None, on_start=None) -> int:
        """Start every agent on one deadline and wait until all are done; returns the start
        time (CLOCK_MONOTONIC ns). ``progress``: a ``Progress`` to update while waiting;
        ``on_start(start_ns)``: called once the agents have their start time."""
        start_ns = time.monotonic_ns() + int(START_MARGIN_S * 1e9)
        self.start(start_ns, start_ns + int(timeout_s * 1e9))
        if on_start:
            on_start(start_ns)
        self.wait_done(time.monotonic() + timeout_s + START_MARGIN_S + 5, progress)
        return start_ns

    def start(self, start_ns: int, deadline_ns: int):
        """Hands every agent the start time and deadline (this machine's CLOCK_MONOTONIC ns;
        a cluster run's coordinator has shifted them by this server's measured offset)."""
        for child in self.children:
            child.send(f"{start_ns} {deadline_ns}")

    def wait_done(self, end: float, progress=None):
        """Until every agent has finished its ops (``end``: time.monotonic() hang deadline).
        They then linger, answering their peers, until exit."""
        for child in self.children:
            child.expect("done", end, f"{child.name} to finish its schedule", tick=progress.tick if progress else None)
        if progress:
            progress.tick()

    def __exit__(self, *exc):
        stop_all(self.children, EXIT_TIMEOUT_S)
        return False
