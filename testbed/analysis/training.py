"""The training's results from the agents' records: per iteration the step time (real-fabric
equivalent) against the plan's ideal, per collective its time, ideal and bus bandwidth,
and the transport's totals (``training.json``).

Only what finished counts: an iteration is complete when every GPU recorded every op the
plan gave it in that iteration, a collective when every member recorded every op of it.
An interrupted run's cut-short iteration and collective are listed as incomplete and stay
out of the step times and bandwidths (a half-done collective would otherwise show a bus
bandwidth above the line rate).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from testbed import units
from testbed.analysis import failures
from testbed.jsonlines import read_events
from testbed.model import collectives
from testbed.model.plan_file import TrainingFile
from testbed.wire import roce

QP_TOTALS = ("packets_sent", "retransmitted", "retransmitted_bytes", "timeouts", "naks_sent", "cnps_sent",
             "cnps_received", "ce_received", "dcqcn_cuts", "packets_received", "out_of_order_received",
             "entropy_changes", "nacks_sent", "nacks_received", "trimmed_received", "timeout_resends")


def load_records(records_dir: Path) -> list:
    """Every agent's records (a line cut short by an interrupted run is skipped)."""
    return [r for path in sorted(records_dir.glob("*.jsonl")) for r in read_events(path)]


def summarise(records: list, training: TrainingFile, dilation: units.Dilation) -> dict:
    """``training`` is the plan's training section (``plan.json``, typed)."""
    ops = [r for r in records if r.get("type") == "op"]
    planned_it, planned_c = Counter(), Counter()
    for gpu, lst in training.ops.items():
        for op in lst:
            planned_it[(gpu, op["iteration"])] += 1
            planned_c[op["collective"]] += 1
    done_it = Counter((o["gpu"], o["iteration"]) for o in ops)
    done_c = Counter(o["collective"] for o in ops)
    ideal = training.ideal
    iterations, incomplete = [], []
    for it in range(training.iterations):
        mine = [o for o in ops if o["iteration"] == it]
        if not mine:
            break
        if any(done_it[(gpu, it)] < planned_it[(gpu, it)] for gpu in training.ops):
            incomplete.append(it)
            continue
        t0, t1 = min(o["ready_ns"] for o in mine), max(o["end_ns"] for o in mine)
        step = dilation.real_duration_ns(t1 - t0)
        iterations.append({"iteration": it, "step_ns": step, "ideal_ns": ideal["iteration_ns"],
                           "ratio": step / ideal["iteration_ns"], "complete": True})
    by_collective: dict[int, list] = {}
    for o in ops:
        if o["collective"] >= 0:
            by_collective.setdefault(o["collective"], []).append(o)
    collectives = [_collective(c, by_collective[c["id"]], dilation, ideal["link_bps"])
                   for c in training.collectives if c["id"] in by_collective and done_c[c["id"]] >= planned_c[c["id"]]]
    return {"iterations": iterations, "incomplete_iterations": incomplete, "collectives": collectives,
            "incomplete_collectives": sum(1 for c in by_collective if done_c[c] < planned_c[c]),
            "transport": _transport(records, dilation), "ideal": ideal, "header_bytes_per_packet": roce.HEADER_BYTES}


def _collective(c: dict, got: list, dilation: units.Dilation, link_bps: float) -> dict:
    """Time from the moment every member had entered it to the last member leaving it."""
    entered = max(min(o["ready_ns"] for o in got if o["gpu"] == g) for g in c["gpus"])
    elapsed = dilation.real_duration_ns(max(o["end_ns"] for o in got) - entered)
    row = {k: c[k] for k in ("id", "iteration", "phase", "algorithm", "bytes", "ranks") if k in c}
    row.update({k: c[k] for k in ("bucket", "stage", "tp_rank", "micro_batch", "when") if k in c})
    row["time_ns"] = elapsed
    if c.get("ideal_ns"):
        row.update(ideal_ns=c["ideal_ns"], ratio=elapsed / c["ideal_ns"])
    if c["phase"] == "dp" and elapsed > 0:
        busbw = collectives.bus_bandwidth_bps(c["bytes"], c["ranks"], elapsed, c["algorithm"])
        row.update(busbw_bps=busbw, busbw_of_line=busbw / link_bps)
    return row


def _transport(records: list, dilation: units.Dilation) -> dict:
    qps = [r for r in records if r.get("type") == "qp"]
    totals = {k: sum(q.get(k, 0) for q in qps) for k in QP_TOTALS}
    totals["nvlink_packets_sent"] = sum(q.get("packets_sent", 0) for q in qps if q.get("link") == "nvlink")
    # out-of-order arrivals: data packets whose PSN was ahead of the one expected (reordered
    # by the paths, or after a loss), as a share of the data packets that arrived
    arrived = totals["packets_received"]
    totals["out_of_order_ratio"] = totals["out_of_order_received"] / arrived if arrived else 0.0
    nics = [r for r in records if r.get("type") == "nic"]
    totals["pause_frames_received"] = sum(n.get("pause_frames_received", 0) for n in nics)
    totals["paused_real_ns"] = dilation.real_duration_ns(sum(n.get("paused_ns", 0) for n in nics))
    return totals


def summarise_run(run_dir: Path, records: list, training: TrainingFile, dilation: units.Dilation) -> dict:
    """All of ``training.json``: ``summarise`` plus, for a run with several jobs, each job's
    own (``jobs``) and the link events with what they did (``link_events``). One place, so
    the run that writes it and the report that rereads a results folder agree."""
    summary = summarise(records, training, dilation)
    if training.jobs:
        summary["jobs"] = summarise_jobs(records, training, dilation)
    summary["link_events"] = failures.summarise(run_dir, records, summary["iterations"], dilation)
    return summary


def summarise_jobs(records: list, training: TrainingFile, dilation: units.Dilation) -> dict:
    """Per job of a run with several (``jobs:``): its own iterations, collectives and JCT
    (first op of its first iteration ready -> last op done, real-fabric time; a late
    start's wait is not in it), from its GPUs' records alone."""
    out = {}
    for name, job in training.jobs.items():
        gpus = set(job["gpus"])
        mine = [r for r in records if r.get("gpu") in gpus]
        s = summarise(mine, replace(training, ops={g: o for g, o in training.ops.items() if g in gpus},
                                    collectives=tuple(c for c in training.collectives if c.get("job") == name),
                                    ideal=job["ideal"], iterations=job["iterations"]), dilation)
        ops = [r for r in mine if r.get("type") == "op" and r["iteration"] >= 0]
        done = len(s["iterations"]) == job["iterations"]
        dp = [c["busbw_bps"] for c in s["collectives"] if c.get("busbw_bps")]
        steps = [i["step_ns"] for i in s["iterations"]]
        out[name] = {"gpus": job["gpus"], "start_ns": job["start_ns"], "traffic": job.get("traffic"),
                     "iterations": s["iterations"], "incomplete_iterations": s["incomplete_iterations"],
                     "jct_ns": dilation.real_duration_ns(max(o["end_ns"] for o in ops) - min(o["ready_ns"] for o in ops))
                     if done and ops else None,
                     "mean_step_ns": sum(steps) / len(steps) if steps else None,
                     "mean_ratio": sum(i["ratio"] for i in s["iterations"]) / len(steps) if steps else None,
                     "mean_busbw_bps": sum(dp) / len(dp) if dp else None, "collectives": len(s["collectives"])}
    return out
