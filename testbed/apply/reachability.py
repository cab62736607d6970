"""The all-pairs reachability check: every GPU pings every other at once (``probe`` in its
namespace); each reply's TTL must show the planned number of switch hops."""

from __future__ import annotations

import json
import sys

from testbed.errors import RunError
from testbed.paths import ROOT

PROBE_TIMEOUT_S = 10
DEFAULT_TTL = 64


def check(fab, plan) -> dict:
    """Returns {"pairs", "failures"}; raises RunError listing the failures."""
    procs = {}
    for h in plan.hosts:
        targets = [o.addr for o in plan.hosts if o.name != h.name]
        procs[h.name] = fab.host(h.name).popen(
            [sys.executable, "-m", "testbed.apply.probe", "--timeout", str(PROBE_TIMEOUT_S), *targets], cwd=str(ROOT))
    by_addr = {h.addr: h for h in plan.hosts}
    table = plan.route_table()
    failures, pairs = [], 0
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S + 20)
        if proc.returncode:
            raise RunError(f"reachability probe in {name} failed: {err.decode().strip()}")
        for addr, ttl in json.loads(out).items():
            dst = by_addr[addr]
            pairs += 1
            expected = len(plan.ecmp_paths(name, dst.name, limit=1, table=table)[0]) - 2
            if ttl is None:
                failures.append(f"{name} -> {dst.name} ({addr}): no reply in {PROBE_TIMEOUT_S}s")
            elif DEFAULT_TTL - ttl != expected:
                failures.append(f"{name} -> {dst.name}: reply crossed {DEFAULT_TTL - ttl} switches, planned {expected}")
    if failures:
        more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
        raise RunError(f"{len(failures)} of {pairs} GPU pairs failed: " + "; ".join(failures[:10]) + more)
    return {"pairs": pairs, "failures": failures}
