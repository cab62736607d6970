"""Ring AllReduce fidelity on an uncongested non-blocking fabric: measured time vs the
analytical ideal 2(n-1)/n x S/B (+ per-step latency where link delay is emulated), and bus
bandwidth vs the emulated line rate, for a few message sizes (a benchmark, not a test).

    .venv/bin/python bench/allreduce.py [--sizes 512KB,2MB,8MB] [--iterations 3]   (as root)

Uses the default scenario (8 GPUs, rail-optimised, rail-aware ring, PFC and ECN on) and
prints one line per size: median time, ideal, ratio, busbw and its share of the link.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import run
from testbed.config import scenario
from testbed import units


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512KB,2MB,8MB")
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            sc = scenario.load("default", [f"workload.collective.bytes={size}",
                                           f"workload.iterations={args.iterations}"])
            result = run.run(sc, run.RunOptions(results_dir=Path(tmp)))
            if result.status != "ok":
                print(f"{size}: run failed: {result.reason}", file=sys.stderr)
                return 1
            cols = [c for c in json.loads((result.run_dir / "training.json").read_text())["collectives"]
                    if c["phase"] == "dp"]
            rows.append((size, statistics.median(c["time_ns"] for c in cols), cols[0]["ideal_ns"],
                         statistics.median(c["ratio"] for c in cols), statistics.median(c["busbw_bps"] for c in cols),
                         statistics.median(c["busbw_of_line"] for c in cols), result.manifest["dilation"]))
    print(f"ring AllReduce, 8 GPUs, default scenario, median of {args.iterations} (real-fabric units)")
    print(f"{'size':>6} {'time':>9} {'ideal':>9} {'ratio':>6} {'busbw':>7} {'of line':>7}  dilation")
    for size, t, ideal, ratio, busbw, share, d in rows:
        print(f"{size:>6} {units.format_duration(t):>9} {units.format_duration(ideal):>9} {ratio:>6.3f} "
              f"{units.format_rate(busbw):>7} {100 * share:>6.1f}%  {d:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
