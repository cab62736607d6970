"""Lab 8: tensor parallelism stays on NVLink.

The physics: a tensor-parallel group splits every layer across its GPUs, which then
AllReduce activations twice per layer, forward and backward: far more bytes than the
gradients, and on the critical path of every micro-batch. That is why a TP group is the
GPUs of one server, on NVLink (3.6T here), and only the data-parallel gradients cross the
fabric. The same TP bytes on a 400G fabric link would take 9 times as long.
"""

from testbed.labs.measure import duration, fabric_bytes, sends, size
from testbed.labs.observe import Observation


def observe(runs):
    v = runs["lab08-tensor"]
    training = v.plan["training"]
    mtu = training["transport"]["mtu_bytes"]
    tp = sends(v, "nvlink")
    planned_packets = sum(-(-s["bytes"] // mtu) for s in tp)
    qps = v.results.qps
    sent = int(qps[qps.link == "nvlink"].packets_sent.sum()) if not qps.empty else 0
    tp_bytes = sum(s["bytes"] for s in tp)
    measured, planned = fabric_bytes(v)
    colls = v.summary["collectives"]
    tp_ratio = (colls.get("tp") or {}).get("mean_ratio") or 0
    ideal = training["ideal"]
    nvlink_bps, fabric_bps = training["transport"]["nvlink_line_bps"], training["transport"]["fabric_line_bps"]
    on_fabric = ideal["tensor_parallel_ns"] * nvlink_bps / fabric_bps
    step_on_fabric = ideal["iteration_ns"] - ideal["tensor_parallel_ns"] + on_fabric
    return [
        Observation("the tensor-parallel AllReduces ran on NVLink, every planned packet of them",
                    planned_packets > 0 and sent == planned_packets,
                    f"{sent} NVLink packets sent, {planned_packets} planned ({size(tp_bytes)} of TP traffic per "
                    f"iteration)", "sent = planned > 0",
                    "a TP group is the GPUs of one server; the schedule puts its collectives on the NVLink segment"),
        Observation("the fabric carried the data-parallel gradients and nothing of the TP traffic",
                    planned > 0 and abs(measured / planned - 1) <= 0.05 and measured - planned < 0.01 * max(tp_bytes, 1),
                    f"leaves received {size(measured)} from the GPUs; the plan's fabric sends are {size(planned)}",
                    f"within 5% of the plan, and less than 1% of the TP bytes ({size(0.01 * tp_bytes)}) extra",
                    "the per-link counters would show the TP bytes if any crossed a leaf"),
        Observation("on NVLink the TP AllReduces ran near their ideal; on 400G they would dominate the step",
                    0 < tp_ratio <= 1.5,
                    f"TP AllReduces x{tp_ratio:.2f} their NVLink ideal ({duration(ideal['tensor_parallel_ns'])} per "
                    f"iteration); at {fabric_bps / 1e9:.0f}G they would take {duration(on_fabric)}, a step "
                    f"{duration(step_on_fabric)} instead of {duration(ideal['iteration_ns'])} "
                    f"(x{step_on_fabric / ideal['iteration_ns']:.2f}, computed from the workload)",
                    "TP collectives <= x1.5 their ideal",
                    f"NVLink runs at {nvlink_bps / 1e12:.1f}T, {nvlink_bps / fabric_bps:.0f} x a fabric link"),
    ]
