"""``jobs:`` in a scenario: several training jobs sharing one fabric, each on its own GPUs
(no root).

    jobs:
      - name: a
        traffic: dp-ring              # a workload file (or chakra:PREFIX), as traffic: takes
        gpus: [h1, h5, h2, h6]        # or a range: h1-h4
        workload: {iterations: 2}     # overrides, as workload: takes
      - name: b
        traffic: dp-ring
        gpus: h3-h8                   # or a share of the fabric: 25% (the next free GPUs, h1 first)
        start: 50us                   # real time after the common start (default 0)

A job's workload is validated on its own GPUs (parallelism, mapping lists name them);
every job runs the same transport (the agents of a run share one), so its settings must
agree. ``run --isolate-baseline`` runs each job alone afterwards for its interference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from testbed import units
from testbed.config.workload import BALANCE_DEFAULTS, validate_workload
from testbed.config.checker import show
from testbed.config.source import NAME_RE

KEYS = ("name", "traffic", "gpus", "start", "workload")
MAX_JOBS = 16
SHARE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")
RANGE_RE = re.compile(r"h([0-9]+)-h([0-9]+)")
SHARED = ("mtu_bytes", "dcqcn", "dcqcn_params", *BALANCE_DEFAULTS)  # what every agent of a run shares


@dataclass(frozen=True)
class Job:
    name: str
    gpus: tuple  # GPU names
    start_ns: int  # real time after the common start
    workload: object  # config.workload.Workload
    traffic: str


def validate_jobs(c, doc, path: tuple, fabric_gpus: int | None) -> tuple:
    if not isinstance(doc, list) or not doc:
        c.problem(path, f"expected a list of jobs ({{name, traffic, gpus}}), got {show(doc)}")
        return ()
    if len(doc) > MAX_JOBS:
        c.problem(path, f"expected at most {MAX_JOBS} jobs, got {len(doc)}")
        return ()
    out, owner, names = [], {}, set()
    for i, job in enumerate(doc):
        here = path + (i,)
        if not isinstance(job, dict):
            c.problem(here, f"expected a mapping {{name, traffic, gpus}}, got {show(job)}")
            continue
        c.mapping(job, here, KEYS)
        name = job.get("name", f"job{i + 1}")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in names:
            c.problem(here + ("name",), f"expected a unique name of 1-32 characters of a-z, 0-9, - and _, "
                                        f"got {show(name)}")
        names.add(name)
        gpus = _gpus(c, job.get("gpus"), here + ("gpus",), fabric_gpus, taken=set(owner))
        for g in gpus or ():
            if g in owner:
                c.problem(here + ("gpus",), f"{g} is already job {owner[g]}'s (a GPU runs one job)")
            owner.setdefault(g, name)
        start = c.unit(job, "start", here, units.parse_duration_ns, default="0us")
        if job.get("workload") is None:
            c.problem(here + ("traffic",), "required: the job's workload (a file in traffic/ or chakra:PREFIX)")
            continue
        wl = validate_workload(c, job["workload"], here + ("workload",), len(gpus) if gpus else None,
                                     names=gpus)
        if wl is not None and gpus and start is not None:
            out.append(Job(name=str(name), gpus=gpus, start_ns=start, workload=wl, traffic=str(job.get("traffic"))))
    if out and any(tuple(getattr(j.workload, k) for k in SHARED) != tuple(getattr(out[0].workload, k) for k in SHARED)
                   for j in out):
        c.problem(path, "every job must run the same transport (mtu, dcqcn, kind, qps_per_connection, "
                        "load_balancing): the agents of a run share it")
    return tuple(out)


def _gpus(c, spec, path: tuple, fabric_gpus: int | None, taken: set = frozenset()) -> tuple | None:
    share = SHARE_RE.fullmatch(spec) if isinstance(spec, str) else None
    if share and fabric_gpus is None:
        return None  # the fabric itself is wrong (reported): no count to take a share of
    if share:
        # a share of the fabric: that many of the GPUs no job listed before has, in order
        # (h1 first: servers' GPUs are numbered together, so a share fills whole servers)
        count = round(float(share.group(1)) / 100 * fabric_gpus)
        free = [f"h{i}" for i in range(1, fabric_gpus + 1) if f"h{i}" not in taken]
        if not 0 < float(share.group(1)) <= 100 or count < 2 or count > len(free):
            c.problem(path, f"expected a share of the fabric's {fabric_gpus} GPUs that makes at least 2 of the "
                            f"{len(free)} no earlier job has, got {show(spec)} ({count} GPUs)")
            return None
        return tuple(free[:count])
    if isinstance(spec, str) and RANGE_RE.fullmatch(spec):
        a, b = map(int, RANGE_RE.fullmatch(spec).groups())
        names = [f"h{i}" for i in range(a, b + 1)] if a <= b else []
    elif isinstance(spec, list) and all(isinstance(g, str) for g in spec):
        names = list(spec)
    else:
        c.problem(path, f"expected a list of GPUs ([h1, h2]), a range (h1-h4) or a share (50%), got {show(spec)}")
        return None
    known = {f"h{i}" for i in range(1, (fabric_gpus or 0) + 1)}
    bad = [g for g in names if fabric_gpus is not None and g not in known]
    if bad or len(set(names)) != len(names) or len(names) < 2:
        why = (f"{bad[0]} is not a GPU of this fabric (h1 .. h{fabric_gpus})" if bad else
               "a GPU listed twice" if len(set(names)) != len(names) else "at least 2 GPUs")
        c.problem(path, f"expected distinct GPUs of the fabric, at least 2: {why}")
        return None
    return tuple(names)
