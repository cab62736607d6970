"""Several jobs on one fabric, the pure parts: validation, the merged plan (each job's
schedule on its own GPUs, collective ids kept apart, a late start waits), per-job results."""

import pytest

from testbed.analysis.training import summarise_jobs
from testbed.config import scenario
from testbed.errors import ConfigError
from testbed.model import plan as planning
from testbed.model.plan_file import TrainingFile
from testbed.units import Dilation

TWO = ("jobs=[{name: a, traffic: dp-ring, gpus: [h1, h5, h2, h6], workload: {mapping: [h1, h5, h2, h6], "
       "iterations: 2}}, {name: b, traffic: dp-ring, gpus: [h3, h7, h4, h8], start: 30us}]")


def test_each_job_is_its_own_schedule_on_its_own_gpus():
    p = planning.build(scenario.load("leaf-spine", [TWO]))
    tp = p.training
    assert tp.jobs["a"]["gpus"] == ["h1", "h5", "h2", "h6"] and tp.jobs["b"]["iterations"] == 3
    assert [c["job"] for c in tp.collectives] == ["a", "a", "b", "b", "b"]
    assert [c["id"] for c in tp.collectives] == list(range(5))
    ops = tp.ops
    # job a's ring is the native 4-GPU ring on its GPUs: op for op what schedule builds for them
    for gpu in ("h1", "h5", "h2", "h6"):
        peers = {op.peer for op in ops[gpu] if op.kind == "send"}
        assert peers <= {"h1", "h5", "h2", "h6"} and len(peers) == 1
        assert all(op.collective in (0, 1) for op in ops[gpu] if op.collective >= 0)
    # job b starts 30 us late: a wait op first, outside every iteration
    wait = ops["h3"][0]
    assert (wait.phase, wait.iteration, wait.duration_ns) == ("wait", -1, 30_000)
    assert ops["h3"][1].deps == (0,) and all(op.collective in (2, 3, 4) for op in ops["h3"] if op.collective >= 0)


def test_jobs_are_refused_when_they_cannot_share_the_fabric():
    with pytest.raises(ConfigError, match="every job must run the same transport"):
        scenario.load("leaf-spine", [TWO.replace("start: 30us", "start: 30us, workload: {transport: {kind: uet}}")])
    with pytest.raises(ConfigError, match="give either jobs or traffic/workload, not both"):
        scenario.load("collisions", [TWO])


def test_a_share_of_the_fabric_is_the_next_free_gpus():
    sc = scenario.load("leaf-spine", ["jobs=[{name: a, traffic: dp-ring, gpus: [h1, h5]}, "
                                      "{name: b, traffic: dp-ring, gpus: 50%}, {name: c, traffic: dp-ring, gpus: 25%}]"])
    assert [j.gpus for j in sc.jobs] == [("h1", "h5"), ("h2", "h3", "h4", "h6"), ("h7", "h8")]
    with pytest.raises(ConfigError, match=r"\[1\]\.gpus: expected a share .* at least 2 of the 2 no earlier job"):
        scenario.load("leaf-spine", ["jobs=[{name: a, traffic: dp-ring, gpus: 75%}, {name: b, traffic: dp-ring, "
                                     "gpus: 50%}]"])


def test_per_job_results_come_from_its_gpus_alone():
    p = planning.build(scenario.load("leaf-spine", [TWO]))
    training = p.training.to_dict()
    records = []
    for gpu, ops in training["ops"].items():
        for op in ops:
            slow = 2 if gpu in ("h3", "h7", "h4", "h8") else 1
            start = 1_000_000 + op["iteration"] * 500_000 * slow
            records.append({"type": "op", "gpu": gpu, "id": op["id"], "iteration": op["iteration"],
                            "collective": op["collective"], "ready_ns": start, "start_ns": start,
                            "end_ns": start + 400_000 * slow})
    jobs = summarise_jobs(records, TrainingFile.from_dict(training), dilation=Dilation(10))
    assert set(jobs) == {"a", "b"}
    assert len(jobs["a"]["iterations"]) == 2 and len(jobs["b"]["iterations"]) == 3
    assert jobs["a"]["jct_ns"] == pytest.approx((500_000 + 400_000) / 10)
    assert jobs["b"]["jct_ns"] == pytest.approx((2 * 1_000_000 + 800_000) / 10)
    assert jobs["b"]["mean_step_ns"] == pytest.approx(80_000)
