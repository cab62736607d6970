"""What the all-pairs check computes before it starts (each switch port's expected share of
one probe round, and the switches each pair crosses) at 32, 64 and 128 GPUs (rail-optimised,
8 GPUs per server, 8 spines above 32): ``plan.ecmp_shares`` against enumerating every
pair's ECMP paths (what it did before), medians of 3, side by side, same results checked.
A benchmark, not a test (no root needed).

    .venv/bin/python bench/all_pairs.py [--gpus 32,64,128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plan import timed  # noqa: E402  (bench/plan.py: median of N)
from testbed.config import scenario  # noqa: E402
from testbed.model import plan as planning  # noqa: E402


def enumerated(p, table):
    hops = {}
    for a in p.hosts:
        for b in p.hosts:
            if a is not b:
                hops[(a.name, b.name)] = len(p.ecmp_paths(a.name, b.name, table=table)[0]) - 2
    return hops


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="32,64,128")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'GPUs':>5} {'pairs':>6} {'every path':>11} {'shares':>8} {'ratio':>6}")
    for gpus in (int(g) for g in args.gpus.split(",")):
        sets = [f"fabric.servers={gpus // 8}"] + (["fabric.spines=8", "fabric.uplinks.count=8"] if gpus > 32 else [])
        p = planning.build(scenario.load("rail-32", sets), "user")
        table = p.route_table()
        t_paths, hops = timed(lambda: enumerated(p, table), args.repeat)
        t_shares, (_, switches) = timed(lambda: p.ecmp_shares(table), args.repeat)
        if switches != hops:
            raise SystemExit(f"{gpus} GPUs: the two disagree on the switches a pair crosses")
        print(f"{gpus:>5} {len(hops):>6} {t_paths:>10.3f}s {t_shares:>7.3f}s {t_paths / t_shares:>6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
