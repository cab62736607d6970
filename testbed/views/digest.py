"""A short, reviewable digest of a run plan: counts, the per-port queue settings as a table
(ports with equal settings on one row), routes and ECMP groups per switch role, and the
training's bytes per collective step. The golden plans in the tests are these digests:
a change to the plan shows up as a small text diff a reviewer can read."""

from __future__ import annotations

from collections import Counter

from testbed.units import format_duration, format_rate, format_size


def digest(plan) -> str:
    d = plan.dilation
    kinds = Counter(link.kind for link in plan.links)
    roles = Counter(s.role for s in plan.switches)
    out = [f"plan {plan.scenario.name}: {len(plan.hosts)} GPUs in {len(plan.servers)} servers; "
           f"{roles['spine']} spines, {roles['leaf']} leaves; links "
           + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
           f"dilation {d.factor:g}; telemetry every {format_duration(plan.telemetry.interval_real_ns)} real "
           f"({format_duration(plan.telemetry.interval_emulated_ns)} emulated); link delay emulated: "
           f"{'yes' if plan.link_delay else 'no'}"]
    by_role = {s.name: s.role for s in plan.switches}
    routes, groups = Counter(), Counter()
    for r in plan.routes:
        routes[by_role[r.switch]] += 1
        groups[(by_role[r.switch], r.ports)] += len(r.ports) > 1
    out.append("routes: " + ", ".join(f"{n} on {role} switches" for role, n in sorted(routes.items()))
               + f"; ECMP routes: {sum(groups.values())}")
    out.append("queues (ports: rate, buffer, ECN kmin/kmax/pmax, PFC xoff/xon/headroom, feeders):")
    rows = Counter((by_role[pq.switch], pq.peer in by_role, pq.rate_bps, pq.buffer_bytes,
                    (pq.kmin_bytes, pq.kmax_bytes, pq.pmax) if pq.ecn else None,
                    (pq.xoff_bytes, pq.xon_bytes, pq.headroom_bytes) if pq.pfc else None, len(pq.feeders))
                   for pq in plan.queues)
    for (role, to_switch, rate, buf, ecn, pfc, feeders), n in sorted(rows.items(), key=str):
        ecn_text = f"{format_size(ecn[0])}/{format_size(ecn[1])}/{ecn[2]:g}" if ecn else "ECN off"
        pfc_text = f"{format_size(pfc[0])}/{format_size(pfc[1])}/{format_size(pfc[2])}" if pfc else "PFC off"
        out.append(f"  {n:4} {role} ports to {'switches' if to_switch else 'GPUs'}: {format_rate(rate)}, "
                   f"{format_size(buf)}, {ecn_text}, {pfc_text}, {feeders}")
    if plan.training is not None:
        out += _training(plan.training)
    return "\n".join(out) + "\n"


def _training(tp) -> list:
    ideal = tp.ideal
    out = [f"training: {tp.iterations} iterations; ideal iteration {format_duration(ideal['iteration_ns'])} "
           f"(compute {format_duration(ideal['compute_ns'])}, tensor {format_duration(ideal['tensor_parallel_ns'])}, "
           f"data {format_duration(ideal['data_parallel_ns'])}); ops per GPU "
           + "/".join(str(n) for n in sorted({len(v) for v in tp.ops.values()})),
           "iteration 1, payload bytes sent per step (sends x bytes):"]
    steps = Counter()
    for gpu, ops in tp.ops.items():
        for op in ops:
            if op.kind == "send" and op.iteration == 0:
                key = (op.phase, op.collective, op.step, op.micro_batch, op.link)
                steps[(key, op.bytes)] += 1
    by_key: dict = {}
    for (key, nbytes), n in steps.items():
        by_key.setdefault(key, []).append(f"{n} x {format_size(nbytes)}")
    for (phase, coll, step, mb, link), sends in sorted(by_key.items()):
        where = f"collective {coll} step {step}" if coll >= 0 else f"micro-batch {mb}"
        out.append(f"  {phase} {where} on {link}: {', '.join(sorted(sends))}")
    return out
