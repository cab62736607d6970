"""Lab 7: one slow link, two kinds of parallelism.

The physics: leaf1's uplinks run at 100G instead of 400G. An 8-stage pipeline h1 -> h8
crosses them once, between h4 (leaf1) and h5 (leaf2): each activation of B bytes takes
B x 8 x (1/100G - 1/400G) longer there, so the stages behind the hop (h5 .. h8) start
that much later, while h1 .. h4 do not notice. A ring AllReduce over the same GPUs is one
collective: its hops through the slow uplinks gate every step, so every GPU's iteration
stretches.
"""

from testbed.labs.measure import duration
from testbed.labs.observe import Observation


def first_forward(view):
    ops = view.results.ops
    fwd = ops[ops.phase == "forward"]
    return (fwd.groupby("gpu").ready_real_ns.min() - ops.ready_real_ns.min()).to_dict()


def finish(view):
    ops = view.results.ops
    return (ops.groupby("gpu").end_real_ns.max() - ops.ready_real_ns.min()).to_dict()


def slow_rate(view):
    return min(link["rate_bps"] for link in view.plan["links"] if link["kind"] == "uplink")


def observe(runs):
    base, slow = runs["lab07-pipeline"], runs["lab07-pipeline-slow"]
    ring, ring_slow = runs["lab07-allreduce"], runs["lab07-allreduce-slow"]
    activations = max(op["bytes"] for ops in slow.plan["training"]["ops"].values() for op in ops
                      if op["kind"] == "send" and op["phase"] == "pp")
    fast_bps, slow_bps = slow_rate(base), slow_rate(slow)
    extra = activations * 8 * (1 / slow_bps - 1 / fast_bps) * 1e9 if slow_bps < fast_bps else 0.0
    a, b = first_forward(base), first_forward(slow)
    shift = {g: b[g] - a[g] for g in a}
    before, behind = ("h2", "h3", "h4"), ("h5", "h6", "h7", "h8")
    words = ", ".join(f"{g} {shift[g] / 1e3:+.1f}us" for g in sorted(shift, key=lambda g: int(g[1:])))
    why = (f"one activation of {activations / 1e3:.0f}KB takes {duration(extra)} longer at "
           f"{slow_bps / 1e9:.0f}G than at {fast_bps / 1e9:.0f}G on the h4 -> h5 hop")
    t0, t1 = finish(ring), finish(ring_slow)
    stretch = {g: t1[g] / t0[g] for g in t0}
    ring_slow_bps = slow_rate(ring_slow)
    none = "" if slow_bps < fast_bps else f"pipeline-slow has no slower uplink (all {slow_bps / 1e9:.0f}G); "
    return [
        Observation("pipeline: the stages behind the slow hop start their first forward later by what the link "
                    "costs", extra > 0 and all(shift[g] > 0.7 * extra for g in behind),
                    f"{none}first-forward shift: {words}", f"h5 .. h8 later by > 0.7 x {duration(extra)}", why),
        Observation("pipeline: the stages before the slow hop do not notice it",
                    all(abs(shift[g]) < 0.2 * max(extra, 1.0) for g in before),
                    f"{none}first-forward shift: {', '.join(f'{g} {shift[g] / 1e3:+.2f}us' for g in before)}",
                    f"|shift| < 0.2 x {duration(extra)} for h2 .. h4",
                    "their activations travel on leaf1 only; nothing they need crosses the slow uplinks"),
        Observation("AllReduce: every GPU's iteration stretches, wherever it sits",
                    ring_slow_bps < slow_rate(ring) and min(stretch.values()) > 1.5,
                    "iteration end, slow / fast: " + ", ".join(f"{g} x{stretch[g]:.2f}" for g in
                                                                sorted(stretch, key=lambda g: int(g[1:]))),
                    "every GPU > x1.5",
                    "a ring step ends when its slowest hop ends, and the hops through leaf1's uplinks now run at "
                    f"{ring_slow_bps / 1e9:.0f}G: every rank waits for them at every step"),
    ]
