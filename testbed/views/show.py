"""``testbed show``: the planned fabric as text, in real and emulated units (no root needed)."""

from __future__ import annotations

from collections import Counter

from testbed.errors import ConfigError
from testbed.model import collectives
from testbed.model.plan import Plan
from testbed.units import format_duration, format_rate, format_size


def render(plan: Plan, pair: tuple[str, str] | None = None) -> str:
    sc = plan.scenario
    out = _header(plan)
    out += _switches_and_links(plan)
    out += _servers(plan)
    out += _queues(plan)
    if plan.training is not None:
        out += (_jobs(plan) if sc.jobs else _workload(plan, sc.workload)) + [""]
    out += _paths(plan, pair)
    return "\n".join(out)


def _header(plan: Plan) -> list[str]:
    sc, d = plan.scenario, plan.dilation
    fab = sc.fabric
    out = [f"scenario {sc.name} ({sc.source}; topology {sc.topology_source})"]
    if sc.description:
        out.append(f"  {sc.description}")
    out.append(f"fabric: {fab.kind}, {len(plan.hosts)} GPUs in {len(plan.servers)} servers, "
               f"{sum(s.role == 'leaf' for s in plan.switches)} leaves, {fab.spines} spines")
    out.append("routing: " + ("adaptive (each data packet to the least occupied shortest-path port; "
                              f"{len(plan.adaptive_choices())} decision entries)" if fab.routing == "adaptive"
                              else "ecmp (select groups hash the 5-tuple)"))
    for e in plan.events:
        rate = (f" to {format_rate(e.rate_bps)}bit/s ({format_rate(d.rate_bps(e.rate_bps))}bit/s emulated)"
                if e.rate_bps else "")
        out.append(f"event: at {format_duration(e.at_ns)} after the start, link {e.name} {e.action}{rate} "
                   f"({', '.join(e.intfs)}; {format_duration(d.duration_ns(e.at_ns))} emulated)")
    out.append(f"dilation: {d.factor:g} ({plan.dilation_reason})")
    if plan.scenario.dilation is None:
        out.append("  a run multiplies it by this machine's measured slowdown (x1 on the machine kind the "
                   "budgets were measured on; python -m testbed.apply.speed)")
    out.append(f"  real 400G = {format_rate(d.rate_bps(400e9))}bit/s emulated; real 1us = "
               f"{format_duration(d.duration_ns(1000))} emulated; bytes unchanged")
    over = plan.oversubscription()
    ratios = sorted({round(v, 3) for v in over.values() if v is not None})
    out.append("oversubscription (host capacity : uplink capacity per leaf): "
               + (", ".join(f"{r:g}:1" for r in ratios) if ratios else "n/a (single leaf)"))
    bis = plan.bisection_bps()
    out.append(f"bisection bandwidth: {format_rate(bis)}bit/s real, {format_rate(d.rate_bps(bis))}bit/s "
               f"emulated (max-flow from the first half of the GPUs to the second, one direction)")
    return out + [""]


def _switches_and_links(plan: Plan) -> list[str]:
    d = plan.dilation
    out = ["switches:"]
    ports = Counter(end for lk in plan.fabric_links for end in {lk.a, lk.b})
    for s in plan.switches:
        out.append(f"  {s.name:8} {s.role:5} dpid {s.dpid_hex}  {ports[s.name]} ports")
    out.append("")
    out.append("links (real rate / emulated rate, cable delay real / emulated):")
    groups = Counter((lk.kind, lk.rate_bps, lk.delay_ns) for lk in plan.links)
    for (kind, rate, delay), n in sorted(groups.items()):
        delay_text = (f"{format_duration(delay)} / {format_duration(d.duration_ns(delay))}"
                      if kind != "nvlink" else "inside the server")
        out.append(f"  {n:3} x {kind:6} {format_rate(rate):>5} / {format_rate(d.rate_bps(rate)) + 'bit/s':>11}"
                   f"   {delay_text}")
    for lk in plan.links:
        if lk.kind == "uplink":
            out.append(f"        {lk.a_intf:14} <-> {lk.b_intf}")
    return out + [""]


def _servers(plan: Plan) -> list[str]:
    fab = plan.scenario.fabric
    out = ["servers and GPUs (fabric NIC -> leaf port, address; NVLink address):"]
    for server in plan.servers:
        nv = f"NVLink bridge {server.nvlink_bridge}" if server.nvlink_bridge else "single GPU, no NVLink"
        out.append(f"  {server.name} ({nv})")
        for name in server.gpus:
            h = plan.host(name)
            rail = f" rail {h.local_rank}" if fab.kind == "rail-optimised" else ""
            nvip = f"  nvlink {h.nvlink_ip}" if h.nvlink_ip else ""
            out.append(f"    {h.name:5} gpu{h.local_rank}{rail:8} {h.name}-eth0 -> {h.leaf}-eth{h.leaf_port:<3} "
                       f"{h.ip:15} {h.mac}{nvip}")
    return out + [""]


def _queues(plan: Plan) -> list[str]:
    q = plan.scenario.queues
    out = []
    out.append("egress queues on every switch port (TBF at the emulated port rate + eBPF WRED/ECN marker):")
    out.append(f"  scenario: buffer {format_size(q.buffer_bytes) if q.buffer_bytes else 'derived'}; "
               f"ECN {_ecn(q)}; PFC {_pfc(q)}")
    kinds = {}
    for pq in plan.queues:
        kinds.setdefault((pq.rate_bps, pq.buffer_bytes, pq.kmin_bytes, pq.kmax_bytes, pq.pmax, pq.headroom_bytes,
                          pq.headroom_formula_bytes), []).append(pq.intf)
    for (rate, buf, kmin, kmax, pmax, head, formula), intfs in sorted(kinds.items()):
        ecn = f"kmin {format_size(kmin)} kmax {format_size(kmax)} pmax {pmax:g}" if q.ecn else "ECN off"
        out.append(f"  {len(intfs):3} ports at {format_rate(rate)}: buffer {format_size(buf)}, {ecn}, "
                   f"PFC headroom {format_size(head)} (formula {format_size(formula)})")
    return out + [""]


def _paths(plan: Plan, pair: tuple[str, str] | None) -> list[str]:
    """The ECMP paths between two GPUs (the first and last by default)."""
    out = []
    if pair is None:
        first, last = plan.hosts[0], plan.hosts[-1]
        pair = (first.name, last.name) if len(plan.hosts) > 1 else None
    if pair:
        src, dst = pair
        for name in pair:
            try:
                plan.host(name)
            except KeyError:
                raise ConfigError(f"--paths: no GPU host {name!r} (hosts are h1..h{len(plan.hosts)})") from None
        paths = plan.ecmp_paths(src, dst)
        out.append(f"ECMP paths {src} -> {dst}: {len(paths)}")
        for p in paths:
            out.append("  " + " -> ".join(f"{node}[{intf}]" if intf else node for node, intf in p))
    return out


def _ecn(q) -> str:
    if q.ecn is None:
        return "off"
    e = q.ecn
    kmin = format_size(e.kmin_bytes) if e.kmin_bytes is not None else "derived"
    kmax = format_size(e.kmax_bytes) if e.kmax_bytes is not None else "derived"
    pmax = f"{e.pmax:g}" if e.pmax is not None else "derived"
    return f"kmin {kmin} kmax {kmax} pmax {pmax}"


def _pfc(q) -> str:
    if q.pfc is None:
        return "off"
    p = q.pfc
    parts = [(k, v) for k, v in (("xoff", p.xoff_bytes), ("xon", p.xon_bytes), ("headroom", p.headroom_bytes))]
    return " ".join(f"{k} {format_size(v) if v is not None else 'derived'}" for k, v in parts)


def _workload(plan, wl) -> list:
    """Ranks on GPUs and what the planned schedule sends where: per step of the first
    data-parallel collective, and per iteration on the fabric vs on NVLink."""
    if wl.chakra is not None:
        return _replay(plan, wl)
    out = [f"workload {wl.name}: {wl.iterations} iterations; DP {wl.data} x PP {wl.pipeline} x TP {wl.tensor}; "
           f"compute forward {format_duration(wl.forward_ns)} + backward {format_duration(wl.backward_ns)}"
           + (f" per micro-batch, {wl.micro_batches} micro-batches ({wl.pipeline_schedule})" if wl.pipeline > 1
              else "")
           + f"; gradients {format_size(wl.gradient_bytes)} ({wl.gradient_source}) in "
             f"{len(wl.allreduce_bytes)} bucket(s) by {wl.algorithm}; RoCE MTU {wl.mtu_bytes}; "
             f"DCQCN {'on' if wl.dcqcn else 'off'}"]
    return out + _transport(plan, wl) + _ranks_and_bytes(plan, wl)


def _jobs(plan) -> list:
    """Several jobs: each one's GPUs, start and ideal, then the first job's details."""
    tp = plan.training
    out = [f"{len(tp.jobs)} jobs on one fabric (the agents share the transport below):"]
    for job in plan.scenario.jobs:
        j = tp.jobs[job.name]
        out.append(f"  job {job.name}: {job.traffic} on {' '.join(job.gpus)}, start {format_duration(job.start_ns)}, "
                   f"{j['iterations']} iterations, ideal {format_duration(j['ideal']['iteration_ns'])} per iteration")
    return out + _transport(plan, plan.scenario.jobs[0].workload)


def _replay(plan, wl) -> list:
    tp, trace = plan.training, wl.chakra
    ideal = tp.ideal
    out = [f"workload {wl.name}: Chakra trace {trace.prefix} replayed, {len(trace.ranks)} ranks, {wl.iterations} "
           f"iteration(s); RoCE MTU {wl.mtu_bytes}; DCQCN {'on' if wl.dcqcn else 'off'}",
           f"  ideal iteration {format_duration(ideal['iteration_ns'])} (the trace's critical path: compute "
           f"{format_duration(ideal['compute_ns'])}, NVLink {format_duration(ideal['tensor_parallel_ns'])}, fabric "
           f"{format_duration(ideal['data_parallel_ns'])})"]
    kinds = Counter((c["algorithm"], c["link"]) for c in tp.collectives if c["iteration"] == 0)
    out.append("  collectives per iteration: " + ", ".join(
        f"{n} {algo} on {link}" for (algo, link), n in sorted(kinds.items())) if kinds else "  no collectives")
    return out + _transport(plan, wl) + _ranks_and_bytes(plan, wl)


def _transport(plan, wl) -> list:
    out = []
    how = {"flow": "one UDP source port per QP (ECMP pins each QP to a path)",
           "spray": "a new UDP source port every " + (f"{wl.spray_packets} packets" if wl.spray_packets > 1 else "packet"),
           "flowlet": f"a new UDP source port after {format_duration(wl.flowlet_gap_ns)} idle"}[wl.load_balancing]
    out.append("  transport " + ("uet: reliable unordered, SACK, selective retransmission, NSCC window (Ultra "
                                 "Ethernet 1.0 model)" if wl.kind == "uet" else "roce: RC, go-back-N, DCQCN")
               + ("; switches trim instead of dropping" if plan.scenario.queues.trim else ""))
    out.append(f"  load balancing {wl.load_balancing}: {wl.qps_per_connection} QP"
               f"{'s' if wl.qps_per_connection > 1 else ''} per connection, {how}")
    return out


def _ranks_and_bytes(plan, wl) -> list:
    collectives, ranks = plan.training.collectives, plan.training.ranks
    out = []
    if wl.pipeline > 1:
        out.append(f"  pipeline: {format_size(wl.pipeline_bytes)} of activations per micro-batch and hop")
    if wl.tensor > 1:
        out.append(f"  tensor parallel: AllReduce of {format_size(wl.tensor_bytes)} on NVLink after every "
                   f"forward and backward")
    mapping = wl.mapping if isinstance(wl.mapping, str) else "explicit list"
    if wl.chakra is not None:
        out.append(f"  ranks (mapping {mapping}): GPU, the trace's rank")
        out += [f"    {name:5} rank {r['rank']:<4} server {plan.host(name).server} GPU {plan.host(name).local_rank} on "
                f"{plan.host(name).leaf}" for name, r in ranks.items()]
    else:
        out.append(f"  ranks (mapping {mapping}): GPU, global rank, pipeline stage, data-parallel rank, tensor rank")
    for name, r in ranks.items() if wl.chakra is None else ():
        h = plan.host(name)
        out.append(f"    {name:5} rank {r['rank']:<3} stage {r['stage']:<2} dp {r['dp']:<3} "
                   f"tp {r['tp']:<2} server {h.server} GPU {h.local_rank} on {h.leaf}")
    first = [c for c in collectives if c["iteration"] == 0 and c["phase"] == "dp"][:1]
    if first:
        c = first[0]
        out.append(f"  data-parallel {c['algorithm']} of {format_size(c['bytes'])} over "
                   f"{' '.join(c['gpus'])}; per step:")
        # the first members' ops (a step lists 8 sends): a large ring has millions of ops
        shown = c["gpus"] if c["ranks"] <= 64 else c["gpus"][:9]
        ops = plan.training.ops_of(shown)
        steps = {}
        for name in shown:
            for op in ops[name]:
                if op.collective == c["id"] and op.kind == "send":
                    steps.setdefault(op.step, []).append(f"{name}->{op.peer} {format_size(op.bytes)}"
                                                         + (" (NVLink)" if op.link == "nvlink" else ""))
        for step, sends in sorted(steps.items())[:8]:
            out.append(f"    step {step:<2} " + ", ".join(sends[:8]) + (" ..." if len(sends) > 8 else ""))
        if len(steps) > 8:
            out.append(f"    ... {len(steps)} steps in all")
    fabric, nvlink = iteration_bytes(plan.training, wl)
    out.append(f"  per iteration: {format_size(fabric)} on the fabric, {format_size(nvlink)} on NVLink "
               f"(payload bytes sent by all GPUs)")
    return out


def iteration_bytes(training, wl) -> tuple[int, int]:
    """Payload bytes all GPUs send in one iteration, on the fabric and on NVLink: every
    collective's (in closed form) and the pipeline's activations and gradients."""
    fabric = nvlink = 0
    for c in training.collectives:
        if c["iteration"] == 0:
            sent = collectives.sent_bytes(c)
            fabric, nvlink = fabric + sent["fabric"], nvlink + sent["nvlink"]
    if wl.pipeline > 1:  # per chain and micro-batch, one hop forward and one back per stage boundary
        fabric += wl.pipeline_bytes * wl.micro_batches * 2 * (wl.pipeline - 1) * wl.data * wl.tensor
    if wl.chakra is not None:  # a replay's point-to-point messages, from its ops
        for ops in training.ops.values():
            for op in ops:
                if op.iteration == 0 and op.kind == "send" and op.collective < 0:
                    if op.link == "nvlink":
                        nvlink += op.bytes
                    else:
                        fabric += op.bytes
    return fabric, nvlink
