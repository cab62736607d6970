"""The train stage: the plan's workload on the GPU agents, with progress on the terminal,
and the training's results (``training.json``) from their records."""

from __future__ import annotations

import json
import logging
import time

from testbed import units
from testbed.analysis.training import load_records, summarise_run
from testbed.apply.processes.agents import Agents
from testbed.apply.events import LinkEvents
from testbed.model.plan_file import TrainingFile
from testbed.views.progress import Progress

LOG = logging.getLogger(__name__)
HANG_GUARD_RATIO = 20  # a hang: no op ended for 20x an iteration's ideal, at least HANG_GUARD_MIN_S (a guard, not a bound)
HANG_GUARD_MIN_S = 120.0


def train(fab, plan, plan_path, run_dir, record, timings: dict, set_rate=None, far=(), cluster: dict | None = None) -> dict:
    """Runs the training to the end; writes training.json and returns its headline.
    ``set_rate(real_bps, intfs)``: how link events slow a link (the PFC process's).
    ``far``: a cluster run's other servers' shares, whose GPUs train from there on the same
    deadline (``run.coordination.train_across``); ``cluster`` gets their clocks and the start."""
    tp, wl = plan.training, plan.scenario.workload
    t0 = time.monotonic()
    records_dir = run_dir / "agents"
    ideal_emulated_s = tp.iterations * plan.dilation.duration_ns(tp.ideal["iteration_ns"]) / 1e9
    progress = None
    try:
        with LinkEvents(plan.events, plan.dilation, run_dir, set_rate) as events, \
                Agents(fab, [g for g in tp.ranks if fab.has_host(g)], plan_path, records_dir, record) as agents:
            if wl is None:
                LOG.info("training: %d jobs on %d GPUs (%s); ideal %s per iteration of the slowest", len(tp.jobs),
                         len(tp.ranks), ", ".join(f"{n}: {len(j['gpus'])} GPUs" for n, j in tp.jobs.items()),
                         units.format_duration(tp.ideal["iteration_ns"]))
            elif wl.chakra is not None:
                LOG.info("training: Chakra trace %s replayed on %d GPUs, %d iterations, %d collectives; ideal %s per "
                         "iteration (%.1fs emulated in all)", wl.chakra.prefix, len(tp.ranks), tp.iterations,
                         len(tp.collectives), units.format_duration(tp.ideal["iteration_ns"]), ideal_emulated_s)
            else:
                LOG.info("training: %d GPUs (DP %d x PP %d x TP %d), %d iteration%s; gradients %s by %s; ideal %s per "
                         "iteration (%.1fs emulated in all)", len(tp.ranks), wl.data, wl.pipeline, wl.tensor,
                         tp.iterations, "" if tp.iterations == 1 else "s", " + ".join(units.format_size(b) for b in wl.allreduce_bytes), wl.algorithm,
                         units.format_duration(tp.ideal["iteration_ns"]), ideal_emulated_s)
            # a cluster run: this server's GPUs (the others' records arrive when they are done)
            progress = Progress({g: ops for g, ops in tp.ops.items() if fab.has_host(g)}, records_dir, tp.iterations)
            if far:
                from testbed.run.coordination import train_across

                timeout_s = max(HANG_GUARD_MIN_S, HANG_GUARD_RATIO * ideal_emulated_s)
                started = train_across(agents, list(far), records_dir, timeout_s, progress)
                if cluster is not None:
                    cluster.update(started)
            else:
                # a starved machine trains late but trains: only a training that stops moving is cut
                stall_s = max(HANG_GUARD_MIN_S, HANG_GUARD_RATIO * ideal_emulated_s / max(tp.iterations, 1))
                agents.train(stall_s=stall_s, progress=progress, on_start=events.start,
                             total_s=HANG_GUARD_RATIO * ideal_emulated_s)
            events.check()
    finally:
        if progress is not None:
            progress.close()
        # after the agents have exited: their per-QP counters are the last lines they write
        timings["training"] = round(time.monotonic() - t0, 3)
        records = load_records(records_dir)
        planned = TrainingFile.from_dict(plan.training.to_dict())  # as a results folder's reader sees it
        summary = summarise_run(run_dir, records, planned, plan.dilation)
        (run_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    t = summary["transport"]
    LOG.info("training done: %d iterations, %d packets, %d retransmitted, %d CNPs", len(summary["iterations"]),
             t["packets_sent"], t["retransmitted"], t["cnps_sent"])
    return {"iterations": len(summary["iterations"]), "collectives": len(summary["collectives"]),
            "records": "agents", "summary": "training.json"}
