"""``run --isolate-baseline``: after a run with several jobs, each job again alone on the
same fabric (same scenario, events and seed; the other jobs' GPUs idle), so every job's
interference is measured: its JCT with the others / its JCT alone. The baseline runs go
into the run's ``baselines/`` folder; ``baselines.json`` says where and what they measured,
and the run's summary.json is rebuilt with it (``jobs`` KPIs)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from testbed import units

LOG = logging.getLogger(__name__)


def isolate(scenario, options, result, run_one) -> dict:
    """``run_one(scenario, options)`` runs one scenario (``stages.run`` without baselines)."""
    folder = result.run_dir / "baselines"
    folder.mkdir(exist_ok=True)
    together = json.loads((result.run_dir / "training.json").read_text()).get("jobs", {})
    out = {}
    for job in scenario.jobs:
        name = f"{scenario.name[:18]}-alone-{job.name}"[:32].rstrip("-_")
        alone = replace(scenario, name=name, jobs=(job,))
        LOG.info("baseline: job %s alone on the fabric", job.name)
        res = run_one(alone, replace(options, results_dir=folder, isolate_baseline=False, hook=None,
                                     before_training=None, cli=False, hold_s=0.0))
        jobs = json.loads((res.run_dir / "training.json").read_text()).get("jobs", {}) if res.status == "ok" else {}
        alone_ns = (jobs.get(job.name) or {}).get("jct_ns")
        with_ns = (together.get(job.name) or {}).get("jct_ns")
        out[job.name] = {"run_dir": str(res.run_dir.relative_to(result.run_dir)), "status": res.status,
                         "jct_alone_ns": alone_ns, "jct_together_ns": with_ns,
                         "interference": with_ns / alone_ns if alone_ns and with_ns else None,
                         "fidelity": json.loads((res.run_dir / "summary.json").read_text())["fidelity"]["verdict"]
                         if (res.run_dir / "summary.json").exists() else None}
        if out[job.name]["interference"]:
            LOG.info("job %s: JCT %s with the other jobs, %s alone: interference x%.2f", job.name,
                     units.format_duration(with_ns), units.format_duration(alone_ns), out[job.name]["interference"])
    (result.run_dir / "baselines.json").write_text(json.dumps(out, indent=1) + "\n")
    return out
