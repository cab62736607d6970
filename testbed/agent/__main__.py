"""``python -m testbed.agent PLAN_JSON RECORDS_DIR GPU=PID [GPU=PID ...]``: the emulated GPUs of
one server, started by the run in the first GPU's namespace. Opens each GPU's sockets in
that GPU's namespace (the one of process PID, its Mininet host), prints ``ready``, reads
the shared start time and deadline from stdin, runs every GPU's ops in one event loop
(``server.serve``), prints ``done``, and answers its peers until the run closes stdin
(closed earlier, during the ops: it stops). Each GPU's records go to RECORDS_DIR/GPU.jsonl.
Why it stopped early (the run closed stdin, its deadline passed, SIGTERM) goes to stderr,
which the run keeps in its folder.

With ``TESTBED_AGENT_PROFILE=DIR`` in the environment (``bench/scale.py --profile DIR``), the
event loop runs under cProfile, timed by the process's CPU clock (a wait counts what the
system call cost, not how long it slept), and its statistics go to DIR/agents-FIRSTGPU.prof:
where the agents' CPU per packet goes, measured in a real run."""

import os
import signal
import sys
import time
from pathlib import Path

from testbed.agent import netns, server
from testbed.agent.config import from_plan
from testbed.model.plan_file import PlanFile
from testbed.agent.runner import Agent


STOPPED = {3: "stopped: the run closed our stdin", 4: "stopped: the run's deadline passed"}


class Terminated(Exception):
    """SIGTERM: end the ops, write what we have, say so."""


def _terminated(signum, frame):
    raise Terminated()


def _say(why: str, agents: list, total: int):
    left = sum(getattr(a, "remaining", len(a.ops)) for a in agents)  # before prepare: none started
    print(f"agents {', '.join(a.name for a in agents)}: {why}, {total - left} of {total} ops done", file=sys.stderr,
          flush=True)


def _serve(agents: list, start_ns: int, deadline_ns: int) -> int:
    profile_dir = os.environ.get("TESTBED_AGENT_PROFILE")
    if not profile_dir:
        return server.serve(agents, start_ns, deadline_ns, control=sys.stdin)
    import cProfile

    profiler = cProfile.Profile(time.process_time_ns, 1e-9)
    try:
        return profiler.runcall(server.serve, agents, start_ns, deadline_ns, control=sys.stdin)
    finally:
        profiler.dump_stats(str(Path(profile_dir) / f"agents-{agents[0].name}.prof"))


def main(argv=None) -> int:
    plan_path, records_dir, *members = sys.argv[1:] if argv is None else argv
    plan = PlanFile.load(plan_path)
    agents = []
    for member in members:
        gpu, pid = member.split("=")
        cfg = from_plan(plan, gpu, str(Path(records_dir) / f"{gpu}.jsonl"))
        with netns.entered(int(pid)):
            agents.append(Agent(cfg, snmp_path=f"/proc/{pid}/net/snmp"))
    # One CPU per server process (servers spread over the CPUs): a sender that hops between
    # CPUs leaves its packets in two CPUs' receive backlogs of the veth, which can deliver
    # them out of order, and a NIC never reorders one flow. Seen as go-back-N
    # retransmissions on a non-blocking fabric in CI.
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[agents[0].cfg.server % len(cpus)]})
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 3  # the run went away before starting us
    start_ns, deadline_ns = (int(x) for x in line.split())
    signal.signal(signal.SIGTERM, _terminated)
    total = sum(len(a.ops) for a in agents)
    try:
        rc = _serve(agents, start_ns, deadline_ns)
        if rc == 0:
            print("done", flush=True)
            server.linger(agents, sys.stdin)
        elif rc in STOPPED:
            _say(f"{STOPPED[rc]} {(time.monotonic_ns() - start_ns) / 1e9:.1f}s after the start", agents, total)
        return rc
    except Terminated:
        _say(f"ended by SIGTERM {(time.monotonic_ns() - start_ns) / 1e9:.1f}s after the start", agents, total)
        return 128 + signal.SIGTERM
    finally:
        for a in agents:
            a.report()
            a.out.close()


sys.exit(main())
