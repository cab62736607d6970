"""PFC pause reaction time: from the moment a switch decides its queue passed XOFF (and
sends the 802.1Qbb frame) to the moment the upstream sender has stopped, in emulated and
in real-fabric-equivalent units (a benchmark, not a test).

    .venv/bin/python bench/pfc.py [--repeat 2]   (as root)

It runs a congested training scenario (leaf/spine with one uplink per spine, 2:1
oversubscribed, a ring whose every hop crosses the spines, PFC on, ECN off), so the
leaves' uplink queues pass XOFF and pause their GPUs. From the run's records:
- ``pfc.jsonl``: when the leaf sent XOFF out of the port facing a GPU (``xoff_sent``);
- the GPU agent's records: when its NIC stopped the data class (``paused``).
Reaction = paused - xoff_sent, for every pause that started a paused period. The
detection lag before the frame (the queue is polled every ``model.pfc.poll_period_ns(dilation)``) is added as
its worst case. Printed beside the PFC headroom budget of the real fabric: the
"peer response time" the headroom formula allows (``queues.PFC_RESPONSE_NS``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.model.pfc import poll_period_ns
from testbed.model import queues
from testbed import run
from testbed.config import scenario
from testbed.analysis.training import load_records


def congested(tmp: Path) -> Path:
    path = tmp / "congested.yaml"
    path.write_text(yaml.safe_dump({
        "name": "pfc-bench", "topology": "leaf-spine", "traffic": "dp-ring",
        "fabric": {"uplinks": {"count": 2}},
        "workload": {"iterations": 1, "mapping": ["h1", "h5", "h2", "h6", "h3", "h7", "h4", "h8"],
                     "transport": {"dcqcn": "off"}},
        "queues": {"buffer": "400KB", "ecn": "off", "pfc": {}}}))
    return path


def reactions(run_dir: Path) -> list:
    plan = json.loads((run_dir / "plan.json").read_text())
    port_to_host = {f"{h['leaf']}-eth{h['leaf_port']}": h["name"] for h in plan["hosts"]}
    events = [json.loads(line) for line in (run_dir / "pfc.jsonl").read_text().splitlines() if line.strip()]
    xoffs = {}
    for e in events:
        if e.get("event") == "xoff_sent" and e["port"] in port_to_host:
            xoffs.setdefault(port_to_host[e["port"]], []).append(e["t_ns"])
    out = []
    for r in load_records(run_dir / "agents"):
        if r.get("type") != "paused":
            continue
        before = [t for t in xoffs.get(r["gpu"], []) if t <= r["t_ns"]]
        if before:
            out.append(r["t_ns"] - before[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    samples, dilation = [], None
    with tempfile.TemporaryDirectory() as tmp:
        sc = scenario.load(str(congested(Path(tmp))))
        for _ in range(args.repeat):
            result = run.run(sc, run.RunOptions(results_dir=Path(tmp) / "results"))
            if result.status != "ok":
                print(f"run failed: {result.reason}", file=sys.stderr)
                return 1
            samples += reactions(result.run_dir)
            dilation = result.manifest["dilation"]
    if not samples:
        print("no pause started a paused period: the scenario did not congest", file=sys.stderr)
        return 1
    poll_ns = poll_period_ns(dilation)
    q = statistics.quantiles(samples, n=20)
    print(f"GPU NIC pause reaction over {len(samples)} pauses (dilation {dilation:g}):")
    print(f"{'':28} {'emulated':>10} {'real-fabric':>12}")
    for name, v in (("frame -> stopped, median", statistics.median(samples)), ("frame -> stopped, p95", q[-1]),
                    ("+ detection (poll), worst", poll_ns)):
        print(f"{name:28} {v / 1e6:>8.3f}ms {v / dilation:>10.1f}ns")
    worst = q[-1] + poll_ns
    print(f"{'XOFF crossing -> stopped, p95':28} {worst / 1e6:>8.3f}ms {worst / dilation:>10.1f}ns")
    print(f"headroom formula's peer response time: {queues.PFC_RESPONSE_NS} ns real; "
          f"ratio (p95 reaction / budget) = {worst / dilation / queues.PFC_RESPONSE_NS:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
