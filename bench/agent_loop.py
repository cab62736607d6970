"""The GPU agents' event loop on one core without the machine: a scenario's GPUs (the
default: 8 GPUs on 2 servers) run their planned training in one process, every frame a
NIC sends handed straight to the receiving GPU's socket queue, on a clock that jumps to
the next due event (no sleeping, no system calls, no other process). What is left is the
agents' own Python per packet: the floor under what a real run's agents spend (bench/scale.py
measures that, with the waits and the system calls). A benchmark, not a test; no root.

    .venv/bin/python bench/agent_loop.py [--scenario NAME] [--set PATH=VALUE ...] [--profile N]

Prints packets sent (data and control), loop passes (``Agent.step`` calls) per packet, the
CPU time per packet, and with ``--profile N`` the N functions with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from testbed.agent import server  # noqa: E402
from testbed.agent.config import from_plan  # noqa: E402
from testbed.agent.runner import Agent  # noqa: E402
from testbed.config import scenario  # noqa: E402
from testbed.model.plan import build  # noqa: E402
from testbed.model.plan_file import PlanFile  # noqa: E402
from testbed.wire import roce  # noqa: E402

from helpers.fakes import Clock, Inbox  # noqa: E402


class Wire:
    """Every NIC's frames to the GPU whose address they carry, as its UDP socket reads them."""

    def __init__(self):
        self.rx_by_ip: dict = {}
        self.frames = 0

    def nic(self, link, spec):
        wire = self

        class Nic:
            def __init__(self):
                self.link, self.intf, self.line_bps = link, spec.intf, spec.line_bps
                self.me = roce.Endpoint(spec.mac, spec.ip)
                self.free_ns, self.blocked = 0, 0

            def send(self, frame):
                wire.frames += 1
                dst = ".".join(str(b) for b in frame[roce.OFF_IP + 16:roce.OFF_IP + 20])
                tos = frame[roce.OFF_IP + 1]
                wire.rx_by_ip[dst].queue.append((frame[roce.OFF_BTH:], [(0, 0, bytes([tos]))], 0, None))

        return Nic()


def agents_of(name: str, sets: list, folder: Path, clock: Clock, wire: Wire) -> list:
    plan = PlanFile.from_dict(json.loads(json.dumps(build(scenario.load(name, sets), "user").to_dict())))
    agents = []
    for h in plan.hosts:
        cfg = from_plan(plan, h.name, str(folder / f"{h.name}.jsonl"))
        rx = Inbox()
        for spec in cfg.nics.values():
            wire.rx_by_ip[spec.ip] = rx
        agents.append(Agent(cfg, clock=clock, open_nic=wire.nic, open_rx=lambda rx=rx: rx,
                            open_pause=lambda intf: Inbox(), snmp_path="/nonexistent"))
    return agents


def measure(name: str, sets: list, profile_top: int) -> dict:
    clock, wire = Clock(), Wire()
    with tempfile.TemporaryDirectory() as tmp:
        agents = agents_of(name, sets, Path(tmp), clock, wire)

        def wait(socks, timeout_s):
            ready = [s for s in socks if s.queue]
            if not ready:
                clock.now += max(1, int(timeout_s * 1e9))
            return ready

        steps = {"n": 0}
        for a in agents:
            step = a.step

            def counted(now, *ready, step=step):
                steps["n"] += 1
                return step(now, *ready)
            a.step = counted
        profiler = cProfile.Profile() if profile_top else None
        t0, cpu0 = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        rc = server.serve(agents, clock.now, clock.now + 10**15, clock=clock, wait=wait)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        for a in agents:
            a.report()
            a.out.close()
    sent = sum(a.nic_counters["tx_count"] for a in agents)
    out = {"rc": rc, "gpus": len(agents), "data_packets": sent, "frames": wire.frames, "steps": steps["n"],
           "cpu_s": cpu, "wall_s": wall}
    if profiler:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(profile_top)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="PATH=VALUE")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N functions with most own time")
    args = ap.parse_args()
    r = measure(args.scenario, args.sets, args.profile)
    if r["rc"] != 0:
        print(f"the agents did not finish (serve returned {r['rc']})")
        return 1
    print(f"{args.scenario} {' '.join(args.sets)}: {r['gpus']} GPUs, {r['data_packets']} data packets, "
          f"{r['frames']} frames in all (data and control), {r['steps']} loop passes "
          f"({r['steps'] / r['data_packets']:.2f} per data packet)")
    print(f"CPU {r['cpu_s']:.2f} s: {r['cpu_s'] / r['data_packets'] * 1e6:.1f} us per data packet, "
          f"{r['cpu_s'] / r['frames'] * 1e6:.1f} us per frame")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
