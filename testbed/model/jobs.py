"""Several jobs on one fabric as one training plan (pure): each job's schedule built on its
own GPUs, then merged. Collective ids are made unique (each job's shifted past the ones
before it, every collective tagged with its job); a job that starts late gets a first
``wait`` op (iteration -1, outside every step time) its first ops depend on."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from testbed.model.schedule import Op
from testbed.model.training import TrainingPlan, plan_training


def plan_jobs(plan, jobs, table) -> TrainingPlan:
    parts, collectives, offsets = [], [], []
    for job in jobs:
        hosts = [h for h in plan.hosts if h.name in job.gpus]
        tp = plan_training(plan, job.workload, table, hosts=hosts)
        offsets.append(len(collectives))
        collectives += [{**c, "id": c["id"] + offsets[-1], "job": job.name} for c in tp.collectives]
        parts.append((job, tp))
    slowest = max((tp for _, tp in parts), key=lambda tp: tp.ideal["iteration_ns"])
    return TrainingPlan(
        collectives=tuple(collectives), ideal=dict(slowest.ideal),
        ranks={g: {**r, "job": job.name} for job, tp in parts for g, r in tp.ranks.items()},
        transport=parts[0][1].transport, iterations=max(tp.iterations for _, tp in parts),
        expand=partial(_expand, parts, offsets),
        jobs={job.name: {"gpus": list(job.gpus), "start_ns": job.start_ns, "iterations": tp.iterations,
                         "traffic": job.traffic, "ideal": tp.ideal} for job, tp in parts})


def _expand(parts, offsets, members) -> dict:
    out = {}
    for (job, tp), off in zip(parts, offsets):
        mine = None if members is None else set(members) & set(job.gpus)
        if mine is not None and not mine:
            continue
        shift = 1 if job.start_ns else 0
        for gpu, ops in tp.expand(mine).items():
            moved = [replace(op, id=op.id + shift, collective=op.collective + off if op.collective >= 0 else -1,
                             deps=tuple(d + shift for d in op.deps) if op.deps or not shift else (0,))
                     for op in ops]
            if shift and ops:
                moved.insert(0, Op(id=0, kind="compute", iteration=-1, phase="wait", collective=-1, step=-1, peer=None,
                                   bytes=0, duration_ns=job.start_ns, deps=()))
            out[gpu] = tuple(moved)
    return out
