"""``testbed show SCENARIO --cluster A,B``: where each part of the fabric runs (no root needed)."""

from __future__ import annotations

import re

from testbed.model.placement import Placement, shares
from testbed.model.plan import Plan


def _span(names) -> str:
    """``h1..h4`` for a run of consecutively numbered names, else the names themselves."""
    names = list(names)
    nums = [int(re.sub(r"^\D+", "", n) or -1) for n in names]
    run = all(b == a + 1 for a, b in zip(nums, nums[1:])) and len({re.sub(r"\d+$", "", n) for n in names}) == 1
    return f"{names[0]}..{names[-1]}" if len(names) > 3 and run else ", ".join(names)


def render(plan: Plan, placement: Placement) -> str:
    p = placement
    uplinks = [lk for lk in plan.links if lk.kind == "uplink"]
    out = [f"cluster: {len(p.machines)} servers, {len(p.pods)} pods (leaves with the GPUs they reach "
           f"without a spine); whole pods per server, spines round robin"]
    spines = sorted((s for s in plan.switches if s.role == "spine"), key=lambda s: s.index)
    split = shares(plan, p)
    key_of = {end.intf: end.key for share in split for end in share.tunnels}
    for m, share in zip(p.machines, split):
        pods = [pod for pod, at in zip(p.pods, p.pod_machine) if at == m]
        gpus = [g for pod in pods for g in pod.gpus]
        gpu_text = ", ".join(_span(pod.gpus) for pod in pods if pod.gpus)
        leaves = [leaf for pod in pods for leaf in pod.leaves]
        here = [s.name for s in spines if p.node_machine[s.name] == m]
        out.append(f"  {m}: {len(gpus)} GPUs ({gpu_text or 'none'}), leaves {_span(leaves) or 'none'}, "
                   f"spines {_span(here) or 'none'}; {len(share.tunnels)} tunnel ends, "
                   f"{len({q for q, _f in share.paused_across})} queues whose PFC pauses go through one")
    out.append(f"cross-server links: {len(p.cross_links)} of {len(uplinks)} uplinks, each a tunnel between "
               f"its two servers keyed by the link's number (nothing else crosses):")
    for lk in p.cross_links:
        out.append(f"  {lk.a_intf:14} <-> {lk.b_intf:14} {p.node_machine[lk.a]} -> {p.node_machine[lk.b]}, "
                   f"key {key_of[lk.a_intf]}")
    return "\n".join(out)
