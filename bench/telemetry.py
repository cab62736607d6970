"""Does collection disturb the emulation? The default run with telemetry at its default
interval (10 us of the real fabric) and at a tenth of it, side by side: wall time of the
training phase, JCT ratio, bus bandwidth, the collector's own poll time and the share of
CPU it leaves, and the ratio of each (a benchmark, not a test).

    .venv/bin/python bench/telemetry.py [--rounds 2]   (as root)

Rounds alternate the two settings so machine noise hits both alike; medians are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.analysis import results
from testbed import run
from testbed.config import scenario
from testbed.controller import telemetry
from testbed import units


def one(tmp: Path, interval_real_ns: int) -> dict:
    result = run.run(scenario.load("default"), run.RunOptions(results_dir=tmp,
                                                              telemetry_interval_real_ns=interval_real_ns))
    if result.status != "ok":
        raise SystemExit(f"run failed: {result.reason}")
    s = json.loads((result.run_dir / "summary.json").read_text())
    polls = results.load(result.run_dir).polls
    return {"training_s": result.manifest["timings_s"]["training"], "jct_ratio": s["jct"]["mean_ratio"],
            "busbw_bps": s["collectives"]["dp"]["mean_busbw_bps"], "polls": len(polls),
            "poll_read_ms": polls.read_ns.median() / 1e6, "skipped": int(polls.skipped_total.max()),
            "fidelity": s["fidelity"]["verdict"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    default = telemetry.DEFAULT_INTERVAL_REAL_NS
    settings = {"default": default, "tenth": default // 10}
    got: dict[str, list] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, interval in settings.items():
                got[name].append(one(Path(tmp), interval))

    def med(name, key):
        return statistics.median(r[key] for r in got[name])

    print(f"default scenario, {args.rounds} rounds each, medians; telemetry interval in real-fabric time")
    print(f"{'interval':>10} {'polls':>6} {'poll read':>9} {'skipped':>7} {'training wall':>13} {'JCT ratio':>9} "
          f"{'busbw':>7}  fidelity")
    for name, interval in settings.items():
        print(f"{units.format_duration(interval):>10} {med(name, 'polls'):>6.0f} {med(name, 'poll_read_ms'):>7.2f}ms "
              f"{med(name, 'skipped'):>7.0f} {med(name, 'training_s'):>12.2f}s {med(name, 'jct_ratio'):>9.3f} "
              f"{units.format_rate(med(name, 'busbw_bps')):>7}  {', '.join(r['fidelity'] for r in got[name])}")
    print(f"tenth / default: training wall x{med('tenth', 'training_s') / med('default', 'training_s'):.3f}, "
          f"JCT ratio x{med('tenth', 'jct_ratio') / med('default', 'jct_ratio'):.3f}, "
          f"busbw x{med('tenth', 'busbw_bps') / med('default', 'busbw_bps'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
