"""Two jobs on one real fabric: rings crossing the same uplinks slow each other down,
rings on disjoint leaves do not (each measured against the job run alone afterwards,
``--isolate-baseline``)."""

import json

import pytest

from testbed import run
from testbed.config import scenario

pytestmark = pytest.mark.integration

DISJOINT = ["jobs[0].gpus=h1-h4", "jobs[1].gpus=h5-h8", "jobs[0].workload.mapping=sequential",
            "jobs[1].workload.mapping=sequential"]


def interference(tmp_path, sets) -> dict:
    """Each job's interference, after checking every run (together, each alone) finished
    and was trusted; an untrusted set is run once more at the suggested dilation."""
    for attempt in range(2):
        folder = tmp_path / f"attempt{attempt}"
        folder.mkdir(parents=True)
        result = run.run(scenario.load("two-jobs", sets), run.RunOptions(results_dir=folder, isolate_baseline=True))
        assert result.status == "ok", result.reason
        summary = json.loads((result.run_dir / "summary.json").read_text())
        baselines = json.loads((result.run_dir / "baselines.json").read_text())
        verdicts = [summary["fidelity"]] + [json.loads((result.run_dir / b["run_dir"] / "summary.json").read_text())
                                            ["fidelity"] for b in baselines.values()]
        if all(v["verdict"] == "trusted" for v in verdicts):
            break
        worst = max(v.get("suggested_dilation") or 0 for v in verdicts)
        sets = [*sets, f"dilation={worst}"]
    assert all(v["verdict"] == "trusted" for v in verdicts), [v["text"] for v in verdicts]
    assert all(b["status"] == "ok" for b in baselines.values()), baselines
    jobs = summary["jobs"]
    assert set(jobs) == {"a", "b"} and all(j["iterations"] == 2 for j in jobs.values())
    return {name: j["interference"] for name, j in jobs.items()}


def test_jobs_sharing_uplinks_slow_each_other_and_disjoint_ones_do_not(tmp_path, clean_slate):
    shared = interference(tmp_path / "shared", [])
    assert all(x > 1.15 for x in shared.values()), shared  # 4 flows on a leaf's one uplink instead of 2
    apart = interference(tmp_path / "apart", DISJOINT)
    assert all(x <= 1.05 for x in apart.values()), apart
