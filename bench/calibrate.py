"""The fidelity guard against the truth it stands for: each case runs at the dilation ``auto``
picks and at five times it, side by side, and the numbers a user reads are compared (issue
31: "trusted" must mean within 3 % of a five-times-slower run). A benchmark, not a test.

    .venv/bin/python bench/calibrate.py [--case NAME ...] [--factor 5] [--out FILE]   (as root)

Per case: the automatic dilation and why, the verdict there (and the check that failed),
and per number the value at auto, at FACTOR x auto, and their difference: mean step time,
mean collective time, mean bus bandwidth (of the link), the worst port's p95 and maximum
queue depth. Step and collective times and busbw are compared relatively; queue depths
within 3 % or one frame (the marker's shadow queue counts whole packets: 4.5 KB against
6 KB is one frame, not 33 %). A row is "agrees" when every number does. A case whose auto
run is not trusted is also run at the dilation the guard suggests (what a user does), and
that run is the one compared. The last lines: how often the automatic dilation was trusted
at once, and whether every trusted row agreed. ``--out`` writes the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import run as runs  # noqa: E402
from testbed.config import scenario  # noqa: E402
from testbed.model import queues  # noqa: E402

TOLERANCE = 0.03
# (name, scenario, --set overrides): the shipped scenarios, small-MTU and 200G/800G variants,
# an incast and a congested lossless (PFC) case. Iterations kept small: the 5x run is long.
CASES = {
    "default": ("default", ["workload.iterations=2"]),
    "default-mtu2048": ("default", ["workload.iterations=2", "workload.transport.mtu=2048"]),
    "default-mtu1024": ("default", ["workload.iterations=1", "workload.transport.mtu=1024"]),
    "default-200G": ("default", ["workload.iterations=2", "fabric.host_link.rate=200G", "fabric.uplinks.rate=200G"]),
    "default-800G": ("default", ["workload.iterations=2", "fabric.host_link.rate=800G", "fabric.uplinks.rate=800G"]),
    "leaf-spine": ("leaf-spine", ["workload.iterations=2"]),
    "collisions": ("collisions", ["workload.iterations=1"]),
    "incast": ("incast", []),
    "congested-pfc": ("collisions", ["workload.iterations=1", "fabric.uplinks.count=2", "queues.ecn=off",
                                     "queues.buffer=400KB", "workload.transport.dcqcn=off"]),
    "rail-32": ("rail-32", ["workload.iterations=1"]),
}


def numbers(run_dir: Path) -> dict:
    """What a user reads off a run: mean step and collective time (real ns), mean busbw (of the
    link), the worst port's p95 and maximum queue depth (bytes); and the verdict."""
    s = json.loads((run_dir / "summary.json").read_text())
    t = json.loads((run_dir / "training.json").read_text())
    its = [i["step_ns"] for i in t["iterations"] if i.get("complete", True)]
    coll = [c for c in t["collectives"] if c.get("phase", "dp") == "dp"]
    q = s.get("queues") or {}
    return {"dilation": s["run"]["dilation"], "status": s["run"]["status"], "verdict": s["fidelity"]["verdict"],
            "failed": [c["name"] for c in s["fidelity"]["checks"] if not c["ok"]],
            "suggested": s["fidelity"].get("suggested_dilation"),
            "step_ns": statistics.mean(its) if its else None,
            "collective_ns": statistics.mean(c["time_ns"] for c in coll) if coll else None,
            "busbw_of_line": statistics.mean(c["busbw_of_line"] for c in coll) if coll else None,
            "p95_depth_bytes": q.get("p95_depth_bytes"), "max_depth_bytes": q.get("max_depth_bytes")}


def one_run(ref: str, sets: list, dilation, folder: Path) -> dict:
    extra = [] if dilation is None else [f"dilation={dilation}"]
    t0 = time.monotonic()
    try:
        result = runs.run(scenario.load(ref, [*sets, *extra]), runs.RunOptions(results_dir=folder))
    except Exception as exc:  # noqa: BLE001 - a benchmark row says what failed and goes on
        return {"status": "failed", "reason": str(exc), "wall_s": round(time.monotonic() - t0, 1)}
    out = numbers(result.run_dir)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def difference(key: str, a, b):
    """(relative difference, agrees) of one number at auto (a) and at the slower run (b)."""
    if a is None or b is None:
        return None, True
    rel = (a - b) / b if b else (0.0 if a == b else float("inf"))
    if key.endswith("depth_bytes"):
        return rel, abs(a - b) <= max(TOLERANCE * b, queues.MTU_BYTES)
    return rel, abs(rel) <= TOLERANCE


KEYS = ("step_ns", "collective_ns", "busbw_of_line", "p95_depth_bytes", "max_depth_bytes")


def calibrate(name: str, factor: float, folder: Path) -> dict:
    ref, sets = CASES[name]
    auto = one_run(ref, sets, None, folder)
    row = {"case": name, "auto": auto, "trusted_at_once": auto.get("verdict") == "trusted"}
    judged = auto
    if auto.get("status") == "ok" and auto["verdict"] == "not trusted" and auto.get("suggested"):
        judged = row["rerun"] = one_run(ref, sets, auto["suggested"], folder)
    if judged.get("status") != "ok":
        return row
    slow = row["slow"] = one_run(ref, sets, int(judged["dilation"] * factor), folder)
    if slow.get("status") != "ok":
        return row
    row["diff"] = {k: difference(k, judged[k], slow[k]) for k in KEYS}
    row["agrees"] = all(ok for _, ok in row["diff"].values())
    return row


def show(row: dict) -> str:
    a, judged = row["auto"], row.get("rerun", row["auto"])
    head = f"{row['case']:16} auto D={a.get('dilation', '?'):<8g} {a.get('verdict', a.get('status')):12}" \
        if "dilation" in a else f"{row['case']:16} {a.get('status')}: {a.get('reason', '')}"
    if a.get("failed"):
        head += f" ({', '.join(a['failed'])}; rerun at {judged.get('dilation', '?'):g}: {judged.get('verdict')})"
    if "diff" not in row:
        return head + "  (no comparison: a run failed)"
    slow = row["slow"]
    cells = []
    for k in KEYS:
        rel, ok = row["diff"][k]
        if rel is None:
            continue
        cells.append(f"{k} {judged[k]:.4g}/{slow[k]:.4g} {rel:+.1%}{'' if ok else ' !'}")
    return (f"{head} vs D={slow['dilation']:g} ({judged['wall_s']:.0f}s / {slow['wall_s']:.0f}s): "
            f"{'agrees' if row['agrees'] else 'DIFFERS'}; " + "; ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="a case (default: all)")
    ap.add_argument("--factor", type=float, default=5.0, help="how much slower the reference run is (5)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON lines here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        for name in args.case or list(CASES):
            row = calibrate(name, args.factor, Path(tmp))
            rows.append(row)
            print(show(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    trusted = [r for r in rows if r.get("rerun", r["auto"]).get("verdict") == "trusted" and "diff" in r]
    print(f"auto trusted at once: {sum(r['trusted_at_once'] for r in rows)} of {len(rows)} cases")
    print(f"trusted rows within {TOLERANCE:.0%} of the {args.factor:g}x slower run: "
          f"{sum(r['agrees'] for r in trusted)} of {len(trusted)}")
    return 0 if all(r["agrees"] for r in trusted) else 1


if __name__ == "__main__":
    sys.exit(main())
