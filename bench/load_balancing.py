"""Load balancing side by side (issue 14): the collision scenario (every ring hop crosses the
spines of a 1:1 leaf/spine fabric) with one QP per connection hashed by ECMP, with more QPs
per connection, with per-packet spraying, with flowlets and with adaptive routing (switches
send each data packet to the least occupied port), in one run of this script (a benchmark,
not a test).

    .venv/bin/python bench/load_balancing.py [--iterations 2] [--modes flow,qps4,spray,flowlet,adaptive]
                                             [--transports roce,uet] [--set PATH=VALUE ...]   (as root)

Prints one line per mode: JCT ratio (step / analytical ideal), the worst switch queue's
maximum depth, uplink-load MMR (max / mean
bytes on a leaf's uplinks, worst leaf) and Jain's index of those loads, the out-of-order
arrival ratio, retransmitted bytes, trimmed packets and the fidelity verdict, for each
transport: RoCE RC (go-back-N, DCQCN) and the UET model (SACK, selective retransmission,
NSCC), with or without switch trimming. ``--set`` adds scenario overrides to every run
(e.g. ``queues.pfc=off queues.buffer=64KB`` for a lossy fabric).
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

BALANCE = {
    "flow": (),
    "qps4": ("workload.transport.qps_per_connection=4",),
    "qps8": ("workload.transport.qps_per_connection=8",),
    "spray": ("workload.transport.load_balancing=spray",),
    "spray8": ("workload.transport.load_balancing=spray", "workload.transport.spray_packets=8"),
    "flowlet": ("workload.transport.load_balancing=flowlet",),
    "adaptive": ("fabric.routing=adaptive",),
}
TRANSPORTS = {"roce": ("workload.transport.kind=roce",), "uet": ("workload.transport.kind=uet",),
              "uet+trim": ("workload.transport.kind=uet", "queues.trim=on")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--modes", default="flow,qps4,spray,flowlet,adaptive")
    ap.add_argument("--transports", default="roce,uet")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.transports.split(","):
            for mode in args.modes.split(","):
                sets = [f"workload.iterations={args.iterations}", *TRANSPORTS[kind], *BALANCE[mode], *args.sets]
                result = run.run(scenario.load("collisions", sets), run.RunOptions(results_dir=Path(tmp)))
                if result.status != "ok":
                    print(f"{kind} {mode}: run failed: {result.reason}", file=sys.stderr)
                    return 1
                s = json.loads((result.run_dir / "summary.json").read_text())
                t, e = s["transport"], s["ecmp"]
                rows.append((kind, mode, s["jct"]["mean_ratio"], s["queues"]["max_depth_bytes"], e["imbalance"],
                             e["jain_min"],
                             t["out_of_order_ratio"], t["retransmitted_bytes"], s["drops"].get("trimmed_packets", 0),
                             s["fidelity"]["verdict"], s["run"]["dilation"]))
    print(f"collision scenario (2 leaves x 4 GPUs, 4 uplinks each, ring across the spines), {args.iterations} "
          f"iterations{', ' + ' '.join(args.sets) if args.sets else ''}")
    print(f"{'transport':>9} {'mode':>8} {'JCT ratio':>9} {'max queue':>9} {'MMR':>5} {'Jain':>5} {'OOO':>6} "
          f"{'retx bytes':>10} {'trimmed':>7}  verdict (dilation)")
    for kind, mode, jct, depth, mmr, jain, ooo, retx, trim, verdict, d in rows:
        print(f"{kind:>9} {mode:>8} {jct:>9.3f} {units.format_size(depth):>9} {mmr:>5.2f} {jain:>5.3f} {100 * ooo:>5.1f}% "
              f"{units.format_size(retx):>10} {trim:>7}  {verdict} ({d:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
