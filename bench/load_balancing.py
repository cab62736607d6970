"""Load balancing side by side (issue 14): the collision scenario (every ring hop crosses the
spines of a 1:1 leaf/spine fabric) with one QP per connection hashed by ECMP, with more QPs
per connection, with per-packet spraying and with flowlets, in one run of this script
(a benchmark, not a test).

    .venv/bin/python bench/load_balancing.py [--iterations 2] [--modes flow,qps4,spray,flowlet]   (as root)

Prints one line per mode: JCT ratio (step / analytical ideal), uplink-load MMR (max / mean
bytes on a leaf's uplinks, worst leaf) and Jain's index of those loads, the out-of-order
arrival ratio, retransmitted bytes, and the fidelity verdict. The transport is RoCE RC with
go-back-N and DCQCN in every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import run, units
from testbed.config import scenario

MODES = {
    "flow": (),
    "qps4": ("workload.transport.qps_per_connection=4",),
    "qps8": ("workload.transport.qps_per_connection=8",),
    "spray": ("workload.transport.load_balancing=spray",),
    "spray8": ("workload.transport.load_balancing=spray", "workload.transport.spray_packets=8"),
    "flowlet": ("workload.transport.load_balancing=flowlet",),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--modes", default="flow,qps4,spray,flowlet")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            sc = scenario.load("collisions", [f"workload.iterations={args.iterations}", *MODES[mode]])
            result = run.run(sc, run.RunOptions(results_dir=Path(tmp)))
            if result.status != "ok":
                print(f"{mode}: run failed: {result.reason}", file=sys.stderr)
                return 1
            s = json.loads((result.run_dir / "summary.json").read_text())
            t, e = s["transport"], s["ecmp"]
            rows.append((mode, s["jct"]["mean_ratio"], e["imbalance"], e["jain_min"], t["out_of_order_ratio"],
                         t["retransmitted_bytes"], s["fidelity"]["verdict"], s["run"]["dilation"]))
    print(f"collision scenario (2 leaves x 4 GPUs, 4 uplinks each, ring across the spines), RoCE + DCQCN, "
          f"{args.iterations} iterations")
    print(f"{'mode':>8} {'JCT ratio':>9} {'MMR':>5} {'Jain':>5} {'OOO':>6} {'retx bytes':>10}  verdict (dilation)")
    for mode, jct, mmr, jain, ooo, retx, verdict, d in rows:
        print(f"{mode:>8} {jct:>9.3f} {mmr:>5.2f} {jain:>5.3f} {100 * ooo:>5.1f}% {units.format_size(retx):>10}  "
              f"{verdict} ({d:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
