"""The all-pairs reachability check: every GPU pings every other at once (``probe`` in its
namespace); each reply's TTL must show the planned number of switch hops."""

from __future__ import annotations

import json
import sys

from testbed.errors import RunError
from testbed.paths import ROOT

PROBE_TIMEOUT_S = 10  # at least; more when a round of probes takes longer to cross the fabric
RESEND_S = 0.2  # at least
PROBE_FRAME_BYTES = 64  # an echo request or reply (13-byte payload) with its headers, rounded up
ROUND_MARGIN = 3  # resend after this many rounds' worth of the busiest port (ECMP spreads unevenly)
TIMEOUT_ROUNDS = 8
DEFAULT_TTL = 64


def probe_timing(plan, load: dict) -> tuple[float, float]:
    """(resend interval, timeout) in seconds for the all-pairs check. Every GPU pings every
    other at once, so one round (a request and a reply per ordered pair) puts O(GPUs^2)
    frames on the switch ports, at their dilated rate: at 128 GPUs and dilation 500000 a
    spine uplink (800 kbit/s) needs ~0.3 s per round. A round must drain before the next
    resend, or rounds pile up in the queues and nothing answers (a fixed 200 ms resend lost
    3111 of 16256 pairs). ``load``: each switch egress interface's expected share of one
    packet per ordered pair (``plan.ecmp_shares``); the reverse pair's reply goes the same
    way as a request, so a round is twice that."""
    rate = {pq.intf: pq.emulated_rate_bps for pq in plan.queues}
    round_s = max((2 * n * PROBE_FRAME_BYTES * 8 / rate[intf] for intf, n in load.items() if intf in rate),
                  default=0.0)
    resend_s = max(RESEND_S, ROUND_MARGIN * round_s)
    return resend_s, max(float(PROBE_TIMEOUT_S), TIMEOUT_ROUNDS * resend_s)


def check(fab, plan, far=()) -> dict:
    """Returns {"pairs", "failures"}; raises RunError listing the failures. ``far``: the
    other servers' shares of a cluster run (``apply.cluster.remote_share.RemoteShare``), whose GPUs
    probe at the same time from there (run/share.py's ``probe``)."""
    load, switches = plan.ecmp_shares()
    timing = probe_timing(plan, load)
    for f in far:
        f.send(f"probe {timing[0]:.3f} {timing[1]:.3f}")
    results = probe(fab, plan, [h.name for h in plan.hosts if fab.has_host(h.name)], timing)
    for f in far:
        results.update(f.answer("probed", timing[1] + 60, "its GPUs' reachability probes did not answer")["results"])
    return judge(plan, results, switches, timing[1])


def probe(fab, plan, gpus: list, timing: tuple) -> dict:
    """Every GPU of ``gpus`` pings every other GPU of the plan at once: ``{gpu: {addr: ttl
    or None}}``. ``timing``: (resend, timeout) in seconds, ``probe_timing``'s."""
    resend_s, timeout_s = timing
    procs = {}
    for name in gpus:
        targets = [o.addr for o in plan.hosts if o.name != name]
        procs[name] = fab.host(name).popen(
            [sys.executable, "-m", "testbed.apply.processes.probe", "--timeout", f"{timeout_s:.3f}", "--resend",
             f"{resend_s:.3f}", *targets], cwd=str(ROOT))
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout_s + 20)
        if proc.returncode:
            raise RunError(f"reachability probe in {name} failed: {err.decode().strip()}")
        results[name] = json.loads(out)
    return results


def judge(plan, results: dict, switches: dict, timeout_s: float) -> dict:
    """Each GPU's replies against the planned number of switch hops (``switches``: per
    ordered pair, ``plan.ecmp_shares``'s); every GPU must have probed (a cluster run's
    servers each probe from their own GPUs)."""
    missing = [h.name for h in plan.hosts if h.name not in results]
    if missing:
        raise RunError(f"reachability: no probe results from {', '.join(missing)}")
    by_addr = {h.addr: h for h in plan.hosts}
    failures, pairs = [], 0
    for h in plan.hosts:
        for addr, ttl in results[h.name].items():
            dst = by_addr[addr]
            pairs += 1
            expected = switches[(h.name, dst.name)]
            if ttl is None:
                failures.append(f"{h.name} -> {dst.name} ({addr}): no reply in {timeout_s:g}s")
            elif DEFAULT_TTL - ttl != expected:
                failures.append(f"{h.name} -> {dst.name}: reply crossed {DEFAULT_TTL - ttl} switches, planned "
                                f"{expected}")
    if failures:
        more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
        raise RunError(f"{len(failures)} of {pairs} GPU pairs failed: " + "; ".join(failures[:10]) + more)
    return {"pairs": pairs, "failures": failures}
