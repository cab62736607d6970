"""Link failures side by side (issue 15): the collision scenario trained without failures and
with one uplink failure per iteration (leaf1's links to spine1 pulled during the AllReduce,
plugged back before the next), in one run of this script (a benchmark, not a test).

    .venv/bin/python bench/failures.py [--iterations 3] [--slow RATE] [--set PATH=VALUE ...]   (as root)

``--slow 100G``: the links are slowed to that rate instead of pulled (a link that trained
down to fewer lanes), back at the planned rate at the same time.

Prints, per event, the time from the cable pulled to the first port status at the
controller and to the last switch confirming its new routes: on this machine (emulated
time, wall clock) and what that is on the real fabric (/ dilation); then the step time and
JCT ratio of both runs side by side, retransmissions and timeouts.
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


def one(sets, tmp):
    result = run.run(scenario.load("collisions", sets), run.RunOptions(results_dir=Path(tmp)))
    if result.status != "ok":
        raise SystemExit(f"run failed: {result.reason}")
    return json.loads((result.run_dir / "summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--slow", metavar="RATE", help="slow leaf1-spine1 to RATE (100G) instead of pulling it")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    base_sets = [f"workload.iterations={args.iterations}", *args.sets]
    with tempfile.TemporaryDirectory() as tmp:
        base = one(base_sets, tmp)
        step = base["jct"]["mean_step_ns"]
        events = []
        hit = f"action: slow, rate: {args.slow}" if args.slow else "action: down"
        for k in range(args.iterations):  # pulled 100 us into an iteration's time, back at 70 % of it
            events += [f"{{at: {int((k * step + 100_000) / 1000)}us, {hit}, link: leaf1-spine1}}",
                       f"{{at: {int((k * step + 0.7 * step) / 1000)}us, action: up, link: leaf1-spine1}}"]
        failed = one([*base_sets, f"events=[{', '.join(events)}]"], tmp)
    fmt = units.format_duration
    what = f"leaf1-spine1 (2 links) slowed to {args.slow}" if args.slow else "one failure of leaf1-spine1 (2 links)"
    print(f"collision scenario, {args.iterations} iterations, {what} per iteration"
          f"{', ' + ' '.join(args.sets) if args.sets else ''}; dilation {failed['run']['dilation']:g}")
    print(f"{'event':>10} {'iteration':>9} {'detect here':>12} {'reroute here':>12} {'reroute (fabric)':>16} "
          f"{'switches':>8} {'stretch':>7}")
    for e in failed["link_events"]:
        it = "-" if e["iteration"] is None else str(e["iteration"] + 1)
        stretch = f"{e['stretch']:.2f}" if e["stretch"] else "-"  # every iteration hit: no calm one to compare
        here = lambda ns: f"{ns / 1e6:.1f}ms" if ns is not None else "-"  # noqa: E731
        print(f"{e['event']:>10} {it:>9} {here(e['detect_emulated_ns']):>12} {here(e['reroute_emulated_ns']):>12} "
              f"{fmt(e['reroute_real_ns']) if e['reroute_real_ns'] is not None else '-':>16} "
              f"{len(e['rerouted_switches']):>8} {stretch:>7}")
    print(f"{'run':>12} {'mean step':>10} {'JCT ratio':>9} {'retransmitted':>13} {'timeouts':>8}  verdict")
    for name, s in (("no failure", base), ("failures", failed)):
        t = s["transport"]
        print(f"{name:>12} {fmt(s['jct']['mean_step_ns']):>10} {s['jct']['mean_ratio']:>9.3f} "
              f"{t.get('retransmitted', 0):>13} {t.get('timeouts', 0):>8}  {s['fidelity']['verdict']}")
    print(f"JCT cost of one {'slowdown' if args.slow else 'failure'} per iteration: x{failed['jct']['mean_step_ns'] / base['jct']['mean_step_ns']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
