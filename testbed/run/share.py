"""One server's share of a cluster run: ``python -m testbed.run.share`` (started over ssh by
``apply.cluster.remote_share.RemoteShare``; docs/cluster.md).

It reads one JSON line on stdin: the run id, the resolved scenario, how the coordinator
built the plan (datapath, link delay, telemetry interval, the slowdown its speed probe
measured) and the digest of that plan, the
servers in placement order with their underlay addresses, which one this is, and the
controller's address and port. It builds the same plan from the same scenario (refusing
if the digest differs: the servers run different versions), places it as the coordinator
did, and brings up its share: its switches, GPUs, NVLink bridges and local links with
``apply.fabric.MininetFabric``, its crossing links as VXLAN tunnels to the other servers
(``apply.cluster.tunnel``), the egress queue of each of its switch ports (tunnel ends included:
shaper, FIFO and the ECN marker, ``apply.datapath.egress``), registered in this server's run registry so ``clean`` works here too.

It answers one JSON line on stdout (``{"event": "ready", ...}`` or ``{"event": "error",
...}``), then serves the coordinator's commands, one line each, until its stdin closes
(the coordinator is done, or its ssh session died: a dead coordinator leaves nothing up):

- ``t``: this machine's CLOCK_MONOTONIC in ns (the coordinator's clock samples, as the probe's);
- ``probe RESEND_S TIMEOUT_S``: its GPUs ping every GPU of the run (the all-pairs check,
  ``apply.reachability.probe``), answers ``{"event": "probed", "results": {GPU: {ADDR: TTL}}}``;
- ``agents``: starts the agent of each of its GPU servers with the run's plan, answers
  ``{"event": "agents"}`` once every GPU's sockets are open;
- ``train START_NS DEADLINE_NS HANG_S``: hands them the start time and deadline (this
  machine's clock: the coordinator shifted its own by the measured offset), answers
  ``{"event": "trained"}`` when every one has finished its ops (they linger, answering
  their peers on the other servers, until ``records``); the end of stdin while it waits
  ends the wait (``CoordinatorWatch``);
- ``records``: ends the agents and answers ``{"event": "records", "files": {NAME: TEXT}}``,
  their records as written here (in this machine's clock);
- ``telemetry``: one last poll, then ends the collector of its ports' queues (started with
  the share, every telemetry interval, as the controller's collector does on one machine)
  and its PFC process (when a port of its is lossless: one per share, for its ports) and
  answers ``{"event": "telemetry", "files": {"queues": TEXT, "polls": TEXT[, "pfc": TEXT]}}``.

A command that fails answers ``{"event": "error", "error": ...}`` and the share stays up.
Then it tears everything down in reverse order and answers ``{"event": "down"}``.
SIGTERM and SIGHUP unwind the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from testbed.errors import TestbedError


def plan_digest(plan_dict: dict) -> str:
    """What both ends compare: the plan as the controller gets it."""
    return hashlib.sha256(json.dumps(plan_dict, sort_keys=True).encode()).hexdigest()[:16]


def make_request(*, run_id: str, scenario: dict, plan, datapath: str, link_delay: bool,
                 telemetry_interval_real_ns: int, slowdown: float, machines, machine: str, underlay: dict, controller_address: str,
                 controller_port: int) -> dict:
    """The request line the coordinator sends server ``machine`` (the module docstring):
    ``scenario`` as resolved, and the digest of ``plan`` it must plan identically."""
    return {"run_id": run_id, "scenario": scenario, "datapath": datapath, "link_delay": link_delay,
            "telemetry_interval_real_ns": telemetry_interval_real_ns, "slowdown": slowdown, "plan_digest": plan_digest(plan.to_dict()),
            "machines": list(machines), "machine": machine, "underlay": underlay,
            "controller_address": controller_address, "controller_port": controller_port}


def _say(event: str, **fields):
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


class _Stop(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so every context manager tears down."""


def _stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise _Stop()


class Up:
    """What ``bring_up`` built: the plan, this server's Share, its fabric and run record."""

    def __init__(self, plan, share, fabric, record):
        self.plan, self.share, self.fabric, self.record = plan, share, fabric, record
        self.plan_path = None
        self.collector = None
        self.pfcd = None  # this share's PFC process, when a port of its is lossless
        self.pfc_stack = ExitStack()


def bring_up(stack: ExitStack, request: dict, work: Path) -> Up:
    """The share of ``request`` on this machine, entered on ``stack``."""
    import yaml

    from testbed.apply import registry
    from testbed.apply.fabric import MininetFabric
    from testbed.config import scenario
    from testbed.model import placement
    from testbed.model.plan import build

    source = work / "scenario.yaml"
    source.write_text(yaml.safe_dump(request["scenario"], sort_keys=False))
    plan = build(scenario.load(str(source)), request["datapath"], link_delay=request["link_delay"],
                 telemetry_interval_real_ns=request["telemetry_interval_real_ns"], slowdown=request["slowdown"])
    digest = plan_digest(plan.to_dict())
    if digest != request["plan_digest"]:
        raise TestbedError(f"this server plans the run differently (plan {digest}, the coordinator's "
                           f"{request['plan_digest']}): run the same version of the project on every server "
                           f"(testbed doctor --cluster names the one that differs)")
    machines = tuple(request["machines"])
    (share,) = [s for s in placement.shares(plan, placement.place(plan, machines)) if s.machine == request["machine"]]
    site = placement.Site(share, request["underlay"], request["controller_address"])
    record = stack.enter_context(registry.RunRecord(request["run_id"], str(work)))
    fabric = stack.enter_context(MininetFabric(plan, request["run_id"], request["datapath"], request["controller_port"],
                                               record, work, link_delay=request["link_delay"], site=site))
    from testbed.apply.datapath.egress import EgressQueues  # pyroute2 and the BPF marker

    egress = stack.enter_context(EgressQueues(plan, request["run_id"], link_delay=request["link_delay"], site=site))
    telemetry = work / "telemetry"
    telemetry.mkdir()
    up = Up(plan, share, fabric, record)
    up.plan_path = work / "plan.json"
    up.plan_path.write_text(json.dumps(plan.to_dict()))
    up.collector = stack.enter_context(QueueCollector(plan, telemetry, egress.marker.dir, share.switches))
    if any(pq.pfc for pq in share.queues):
        from testbed.apply.processes.pfc_daemon import PfcDaemon

        up.pfcd = up.pfc_stack.enter_context(PfcDaemon(up.plan_path, egress.marker.dir, telemetry, record, site=site))
        stack.push(up.pfc_stack.__exit__)  # whichever comes first: the telemetry command or the teardown
    return up


class QueueCollector:
    """This share's ports' queues read every telemetry interval in a thread, with the
    controller's ``Collector`` (the controller's own collector reads only the coordinator's
    ports). A failed read ends the thread and is told at ``stop`` (the run fails loudly)."""

    def __init__(self, plan, folder: Path, pins: Path, switches):
        import threading

        from testbed.controller.collector import Collector

        self.folder = folder
        self.collector = Collector(folder, plan, pins, switches)
        self.interval_ns = plan.telemetry.interval_emulated_ns
        self.done = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._loop, name="queue collector", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def _loop(self):
        from testbed.controller import telemetry

        try:
            poller = telemetry.Poller(self.interval_ns, time.monotonic_ns())
            while not self.done.is_set():
                now = time.monotonic_ns()
                if poller.due(now):
                    self.collector.poll_done(now, poller.skipped, self.collector.poll_queues(now))
                self.done.wait(poller.wait_s(time.monotonic_ns()))
            now = time.monotonic_ns()  # one last poll: the totals after the last packet
            self.collector.poll_done(now, poller.skipped, self.collector.poll_queues(now))
        except Exception as exc:  # noqa: BLE001 - told to the coordinator at stop
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> dict:
        """Ends the thread after its last poll; returns the files it wrote."""
        if not self.done.is_set():
            self.done.set()
            self.thread.join()
        if self.error:
            raise TestbedError(f"the queue collector failed: {self.error}")
        return {name: (self.folder / f"{name}.jsonl").read_text() for name in ("queues", "polls")}

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.collector.close()
        return False


class CoordinatorWatch:
    """Called about twice a second while this share's agents train: a coordinator that
    closed the session (it failed, or its ssh died) ends the wait at once, so the share
    tears down now rather than at the training's hang deadline. Only the end of stdin is
    looked at (``peek``): the coordinator sends no command while it waits for ``trained``."""

    def tick(self):
        import select

        readable, _, _ = select.select([sys.stdin.buffer], [], [], 0)
        if readable and sys.stdin.buffer.peek(1) == b"":
            raise TestbedError("the coordinator closed the session while this share trained")


class Commands:
    """The coordinator's commands once the share is up (the module docstring lists them)."""

    def __init__(self, up: Up, work: Path):
        self.up, self.work = up, work
        self.records_dir = work / "agents"
        self.agents_stack = ExitStack()
        self.agents = None

    def serve(self, lines):
        for line in lines:
            if not line.strip():
                continue
            word, *args = line.split()
            try:
                if word == "t":
                    sys.stdout.write(f"{time.monotonic_ns()}\n")
                    sys.stdout.flush()
                elif word == "probe" and len(args) == 2:
                    from testbed.apply import reachability

                    _say("probed", results=reachability.probe(self.up.fabric, self.up.plan, list(self.up.share.hosts),
                                                              (float(args[0]), float(args[1]))))
                elif word == "telemetry" and not self.up.collector.done.is_set():
                    files = self.up.collector.stop()
                    if self.up.pfcd is not None:
                        self.up.pfcd.check_alive()
                        self.up.pfc_stack.close()  # it writes its per-port totals as it exits
                        files["pfc"] = self.up.pfcd.events.read_text()
                    _say("telemetry", files=files)
                elif word == "agents":
                    self.start_agents()
                    _say("agents", gpus=self.gpus())
                elif word == "train" and len(args) == 3 and self.agents is not None:
                    start_ns, deadline_ns, hang_s = int(args[0]), int(args[1]), float(args[2])
                    self.agents.start(start_ns, deadline_ns)
                    self.agents.wait_done(time.monotonic() + hang_s, CoordinatorWatch())
                    _say("trained")
                elif word == "records":
                    self.agents_stack.close()
                    self.agents = None
                    _say("records", files={p.name: p.read_text() for p in sorted(self.records_dir.glob("*.jsonl"))})
                else:
                    _say("error", error=f"unknown command {line.strip()!r} (or train before agents)")
            except TestbedError as exc:
                _say("error", error=str(exc))
        self.agents_stack.close()

    def gpus(self) -> list:
        return [g for g in self.up.plan.training.ranks if g in self.up.share.hosts] if self.up.plan.training else []

    def start_agents(self):
        from testbed.apply.processes.agents import Agents

        if self.agents is not None:
            raise TestbedError("the agents are already started")
        gpus = self.gpus()
        if not gpus:
            raise TestbedError("this scenario has no workload: no agents to start")
        self.agents = self.agents_stack.enter_context(Agents(self.up.fabric, gpus, self.up.plan_path,
                                                             self.records_dir, self.up.record))


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    try:
        request = json.loads(sys.stdin.readline() or "null")
        if not isinstance(request, dict):
            _say("error", error="expected one JSON request line on stdin")
            return 2
        with ExitStack() as stack:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"testbed-share-{request['run_id']}-")))
            up = bring_up(stack, request, work)
            share = up.share
            _say("ready", pid=os.getpid(), machine=share.machine, switches=list(share.switches), hosts=list(share.hosts),
                 tunnels=[t.intf for t in share.tunnels])
            Commands(up, work).serve(iter(sys.stdin.readline, ""))  # until the coordinator closes our stdin
        _say("down")
        return 0
    except (TestbedError, _Stop, KeyboardInterrupt) as exc:
        _say("error", error=str(exc) or type(exc).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
