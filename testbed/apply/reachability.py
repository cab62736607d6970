"""The all-pairs reachability check: every GPU pings every other at once (``probe`` in its
namespace); each reply's TTL must show the planned number of switch hops."""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from testbed.errors import RunError
from testbed.paths import ROOT

PROBE_TIMEOUT_S = 10  # at least; more when a round of probes takes longer to cross the fabric
RESEND_S = 0.2  # at least
PROBE_FRAME_BYTES = 64  # an echo request or reply (13-byte payload) with its headers, rounded up
ROUND_MARGIN = 3  # resend after this many rounds' worth of the busiest port (ECMP spreads unevenly)
TIMEOUT_ROUNDS = 8
DEFAULT_TTL = 64


def probe_timing(plan, paths: dict) -> tuple[float, float]:
    """(resend interval, timeout) in seconds for the all-pairs check. Every GPU pings every
    other at once, so one round (a request and a reply per ordered pair) puts O(GPUs^2)
    frames on the switch ports, at their dilated rate: at 128 GPUs and dilation 500000 a
    spine uplink (800 kbit/s) needs ~0.3 s per round. A round must drain before the next
    resend, or rounds pile up in the queues and nothing answers (a fixed 200 ms resend lost
    3111 of 16256 pairs). The busiest port's load is the expected share of every pair's
    ECMP paths; ``paths[(src, dst)]`` are ``plan.ecmp_paths``."""
    load = defaultdict(float)
    for ps in paths.values():
        for path in ps:
            for _node, intf in path[1:-1]:  # the switches' egress ports (the GPU's own NIC is not shaped)
                load[intf] += 2 / len(ps)  # the request one way, the reverse pair's reply the same way
    rate = {pq.intf: pq.emulated_rate_bps for pq in plan.queues}
    round_s = max((n * PROBE_FRAME_BYTES * 8 / rate[intf] for intf, n in load.items() if intf in rate), default=0.0)
    resend_s = max(RESEND_S, ROUND_MARGIN * round_s)
    return resend_s, max(float(PROBE_TIMEOUT_S), TIMEOUT_ROUNDS * resend_s)


def check(fab, plan) -> dict:
    """Returns {"pairs", "failures"}; raises RunError listing the failures."""
    table = plan.route_table()
    paths = {(a.name, b.name): plan.ecmp_paths(a.name, b.name, table=table)
             for a in plan.hosts for b in plan.hosts if a is not b}
    resend_s, timeout_s = probe_timing(plan, paths)
    procs = {}
    for h in plan.hosts:
        targets = [o.addr for o in plan.hosts if o.name != h.name]
        procs[h.name] = fab.host(h.name).popen(
            [sys.executable, "-m", "testbed.apply.probe", "--timeout", f"{timeout_s:.3f}", "--resend",
             f"{resend_s:.3f}", *targets], cwd=str(ROOT))
    by_addr = {h.addr: h for h in plan.hosts}
    failures, pairs = [], 0
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout_s + 20)
        if proc.returncode:
            raise RunError(f"reachability probe in {name} failed: {err.decode().strip()}")
        for addr, ttl in json.loads(out).items():
            dst = by_addr[addr]
            pairs += 1
            expected = len(paths[(name, dst.name)][0]) - 2
            if ttl is None:
                failures.append(f"{name} -> {dst.name} ({addr}): no reply in {timeout_s:g}s")
            elif DEFAULT_TTL - ttl != expected:
                failures.append(f"{name} -> {dst.name}: reply crossed {DEFAULT_TTL - ttl} switches, planned {expected}")
    if failures:
        more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
        raise RunError(f"{len(failures)} of {pairs} GPU pairs failed: " + "; ".join(failures[:10]) + more)
    return {"pairs": pairs, "failures": failures}
