"""``testbed show SCENARIO --cluster A,B``: where each part of the fabric runs (no root needed)."""

from __future__ import annotations

from testbed.model.cluster import Placement
from testbed.model.plan import Plan


def _span(names) -> str:
    names = list(names)
    return f"{names[0]}..{names[-1]}" if len(names) > 3 else ", ".join(names)


def render(plan: Plan, placement: Placement) -> str:
    p = placement
    uplinks = [lk for lk in plan.links if lk.kind == "uplink"]
    out = [f"cluster: {len(p.machines)} servers, {len(p.pods)} pods (leaves with the GPUs they reach "
           f"without a spine); whole pods per server, spines round robin"]
    spines = sorted((s for s in plan.switches if s.role == "spine"), key=lambda s: s.index)
    for m in p.machines:
        pods = [pod for pod, at in zip(p.pods, p.pod_machine) if at == m]
        gpus = [g for pod in pods for g in pod.gpus]
        leaves = [leaf for pod in pods for leaf in pod.leaves]
        here = [s.name for s in spines if p.node_machine[s.name] == m]
        out.append(f"  {m}: {len(gpus)} GPUs ({_span(gpus) or 'none'}), leaves {_span(leaves) or 'none'}, "
                   f"spines {_span(here) or 'none'}")
    out.append(f"cross-server links: {len(p.cross_links)} of {len(uplinks)} uplinks, each a tunnel between "
               f"its two servers (nothing else crosses):")
    for lk in p.cross_links:
        out.append(f"  {lk.a_intf:14} <-> {lk.b_intf:14} {p.node_machine[lk.a]} -> {p.node_machine[lk.b]}")
    return "\n".join(out)
