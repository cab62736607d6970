"""Where a 2:1 incast's queue sits: the shipped `incast` scenario (both leaf uplinks take
two ring flows at every step) with ECN + DCQCN at a few Kmin values and without ECN, side
by side in the same session (a benchmark, not a test).

    .venv/bin/python bench/incast.py [--kmin 50KB,100KB,200KB] [--repeat 1]   (as root)

Kmax is 4 x Kmin, pmax 0.2; queues are sampled every 1 us (real). One line per setting
and uplink: the median depth at the polls that ended a backlogged interval, p95 and max
of the per-poll maximum, the run's CE marks and DCQCN cuts (all ports), the AllReduce
time over its non-blocking ideal (x2.0 is the fair share of the 2:1 uplink), and the
fidelity verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import run
from testbed.config import scenario
from testbed import units

UPLINKS = ("leaf1-eth5", "leaf2-eth5")


def one(tmp: Path, sets: list[str]) -> dict:
    result = run.run(scenario.load("incast", sets),
                     run.RunOptions(results_dir=tmp, telemetry_interval_real_ns=1000))
    if result.status != "ok":
        raise SystemExit(f"{sets}: run failed: {result.reason}")
    return json.loads((result.run_dir / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kmin", default="50KB,100KB,200KB")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    settings = [(f"ECN Kmin {k}", [f"queues.ecn={{kmin: {k}, kmax: {4 * units.parse_size_bytes(k)}, pmax: 0.2}}"])
                for k in args.kmin.split(",")] + [("ECN off", ["queues.ecn=off"])]
    fmt = units.format_size
    print(f"{'setting':<18} {'uplink':<11} {'median backlogged':>17} {'p95':>8} {'max':>8} {'CE':>5} "
          f"{'cuts':>5} {'x ideal':>7}  fidelity")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for name, sets in settings:
                s = one(Path(tmp), sets)
                for intf in UPLINKS:
                    q = s["queues"]["per_port"][intf]
                    print(f"{name:<18} {intf:<11} {fmt(q['median_backlogged_depth_bytes']):>17} "
                          f"{fmt(q['p95_depth_bytes']):>8} {fmt(q['max_depth_bytes']):>8} "
                          f"{s['ecn'].get('marked_packets', 0):>5} {s['transport'].get('dcqcn_cuts', 0):>5} "
                          f"{s['collectives']['dp']['mean_ratio']:>7.2f}  {s['fidelity']['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
