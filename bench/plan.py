"""Planning cost as fabrics grow: `testbed show` of 64, 256 and 1024 GPUs (rail-optimised,
16 GPUs per server, the default scenario's workload and queues), timed stage by stage
(plan without the workload, the plan with the workload's collectives, rendering `show`),
medians of 3, side by side; the last column is the time per GPU relative to 64 GPUs
(1.0 = linear). A second table does the same for a wide leaf-spine (4 GPUs per leaf,
64 spines, 256 uplinks per leaf, so every spine has one port per leaf: the shape where a
route search per leaf used to dominate), with `queues.pfc=off` because the PFC feeder
lists of egress queues grow with ports squared (issue 33 replaces them with ingress
priority groups). A benchmark, not a test (no root needed).

    .venv/bin/python bench/plan.py [--gpus 64,256,1024] [--leaves 16,64,250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.config import scenario  # noqa: E402
from testbed.model import plan as planning  # noqa: E402
from testbed.views import show  # noqa: E402


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="64,256,1024")
    ap.add_argument("--leaves", default="16,64,250")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    show.render(planning.build(scenario.load("default")))  # warm up (imports, caches) outside the timings
    table(args.repeat, "default", [(int(g), ["fabric.gpus_per_server=16", f"fabric.servers={int(g) // 16}"])
                                   for g in args.gpus.split(",")])
    print()
    wide = ["fabric.hosts_per_leaf=4", "fabric.spines=64", "fabric.uplinks.count=256", "queues.pfc=off"]
    table(args.repeat, "leaf-spine", [(4 * int(n), wide + [f"fabric.leaves={n}"]) for n in args.leaves.split(",")])
    return 0


def table(repeat: int, ref: str, rows: list[tuple[int, list[str]]]) -> None:
    """One line per fabric size: stage times of scenario ``ref`` with each row's overrides."""
    print(f"{ref}:")
    print(f"{'GPUs':>5} {'switches':>8} {'ports':>6} {'fabric plan':>12} {'+ workload':>11} {'show':>7} "
          f"{'total':>7} {'per GPU vs first':>16}")
    base = None
    for gpus, sets in rows:
        bare = scenario.load(ref, sets + ["workload=null"])
        full = scenario.load(ref, sets)
        t_fabric, p = timed(lambda: planning.build(bare), repeat)
        t_plan, p = timed(lambda: planning.build(full), repeat)
        t_show, _ = timed(lambda: show.render(p), repeat)
        total = t_plan + t_show
        base = base or total / gpus
        print(f"{gpus:>5} {len(p.switches):>8} {len(p.queues):>6} {t_fabric:>11.3f}s {t_plan:>10.3f}s "
              f"{t_show:>6.3f}s {total:>6.3f}s {total / gpus / base:>16.2f}")


if __name__ == "__main__":
    sys.exit(main())
