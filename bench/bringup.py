"""Bring-up and teardown time of the testbed's fabric vs a plain Mininet bring-up of the
same graph, measured side by side in one run (a benchmark, not a test).

    .venv/bin/python bench/bringup.py [--repeat 3] [--gpus N ...] [SCENARIO ...]   (as root)

For each scenario (default: the 8-GPU default and the 32-GPU rail-32) and each ``--gpus N``
(rail-32 grown to N / 8 servers under 8 spines, as docs/measurements.md's scale rows):
- testbed: MininetFabric up (hosts, OVS bridges, links, tags, host configuration) and every
  switch port's queue (TBF + marker) until the controller confirmed every switch's flows,
  then teardown;
- plain Mininet: the same Topo (same switches, ports, hosts) with OVSSwitch, no
  controller, no host configuration: Mininet's own start() and stop().
Prints medians and the ratio testbed / plain Mininet. The whole testbed run (with the
all-pairs reachability check) is timed separately in each run's manifest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mininet.log import setLogLevel  # noqa: E402
from mininet.net import Mininet  # noqa: E402
from mininet.node import OVSSwitch  # noqa: E402

from testbed.apply import capabilities, registry
from testbed.model import plan as planning
from testbed.config import scenario
from testbed.apply.datapath.egress import EgressQueues
from testbed.apply.fabric import MininetFabric, build_topo
from testbed.apply.processes.controller import Controller
from testbed.apply.processes.child import free_tcp_port


def time_testbed(p, datapath, work: Path) -> tuple[float, float]:
    plan_path = work / "plan.json"
    plan_path.write_text(__import__("json").dumps(p.to_dict()))
    port = free_tcp_port()
    with registry.RunRecord(f"bench-{time.time_ns()}", str(work)) as record, \
            Controller(plan_path, work, port) as ctl:
        ctl.wait_listening(30)
        t0 = time.monotonic()
        fab = MininetFabric(p, record.data["run_id"], datapath, port, record, work)
        fab.__enter__()
        egress = None
        try:
            egress = EgressQueues(p, record.data["run_id"]).__enter__()
            ctl.wait_fabric_ready(len(p.switches), 60)
            up = time.monotonic() - t0
        finally:
            t1 = time.monotonic()
            if egress is not None:
                egress.__exit__(None, None, None)
            fab.__exit__(None, None, None)
            down = time.monotonic() - t1
    (work / "controller-events.jsonl").unlink()
    return up, down


def time_plain_mininet(p, datapath) -> tuple[float, float]:
    setLogLevel("error")
    t0 = time.monotonic()
    net = Mininet(topo=build_topo(p, datapath), switch=OVSSwitch, controller=None, waitConnected=False)
    try:
        net.start()
        up = time.monotonic() - t0
    finally:
        t1 = time.monotonic()
        net.stop()
        down = time.monotonic() - t1
    return up, down


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="*", default=["default", "rail-32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gpus", type=int, action="append", default=[], help="rail-32 grown to N GPUs (a multiple of 8)")
    args = ap.parse_args()
    if not capabilities.is_root():
        sys.exit("bench/bringup.py needs root")
    datapath = capabilities.choose_datapath("auto")
    print(f"datapath {datapath}; medians of {args.repeat} runs, testbed and plain Mininet alternated")
    print(f"{'scenario':10} {'GPUs':>4} {'switches':>8}  {'testbed up':>10} {'mininet up':>10} {'ratio':>6}"
          f"  {'testbed down':>12} {'mininet down':>12} {'ratio':>6}")
    cases = [(ref, []) for ref in args.scenarios] + [
        ("rail-32", [f"fabric.servers={n // 8}", "fabric.spines=8", "fabric.uplinks.count=8"]) for n in args.gpus]
    for ref, sets in cases:
        p = planning.build(scenario.load(ref, sets), datapath)
        tb, mn = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                tb.append(time_testbed(p, datapath, Path(tmp)))
                mn.append(time_plain_mininet(p, datapath))
        tb_up, tb_down = (statistics.median(x) for x in zip(*tb))
        mn_up, mn_down = (statistics.median(x) for x in zip(*mn))
        print(f"{ref:10} {len(p.hosts):>4} {len(p.switches):>8}  {tb_up:>9.2f}s {mn_up:>9.2f}s {tb_up / mn_up:>6.2f}"
              f"  {tb_down:>11.2f}s {mn_down:>11.2f}s {tb_down / mn_down:>6.2f}")


if __name__ == "__main__":
    main()
