"""Lab 1: the burst at the synchronisation point.

The physics: a step is compute (every GPU port idle) then a ring AllReduce (every GPU port
at line rate). So each GPU port's peak utilisation is the line rate, and its mean over the
training is the bytes it carried per step over what the line could carry in a step:
mean = 2 (n-1)/n x S x (wire/payload) / (step x C), and peak / mean is its inverse.
"""

from testbed.labs.measure import duration, host_ports, size, wire_bytes
from testbed.labs.observe import Observation


def observe(runs):
    v = runs["lab01-burst"]
    r, plan = v.results, v.plan
    training = plan["training"]
    ops = r.ops
    start, end = ops.start_real_ns.min(), ops.end_real_ns.max()
    gpu_ports = set(host_ports(v).values())
    # GPU-facing leaf ports, polls inside the training window
    p = r.ports[r.ports.intf.isin(gpu_ports) & r.ports.tx_utilisation.notna()
                & (r.ports.t_real_ns > start) & (r.ports.t_real_ns <= end)]
    peak = p.groupby("intf").tx_utilisation.max()
    idle = p[p.tx_utilisation < 0.05].groupby("intf").size().reindex(peak.index, fill_value=0)
    coll = training["collectives"][0]
    n, s = coll["ranks"], coll["bytes"]
    per_step = wire_bytes(int(2 * (n - 1) / n * s), training["transport"]["mtu_bytes"])
    step_ns = v.summary["jct"]["mean_step_ns"]
    expected_mean = per_step * 8 / (step_ns * 1e-9 * training["ideal"]["link_bps"])
    mean = p.groupby("intf").tx_utilisation.mean()
    compute = training["ideal"]["compute_ns"]
    interval = plan["telemetry"]["interval_real_ns"]
    # polls that fall wholly inside a compute phase: at least compute / interval - 1 per step
    quiet = training["iterations"] * max(0.0, compute / interval - 1)
    ratio = v.summary["jct"]["mean_ratio"]
    return [
        Observation("during the synchronisation every GPU port ran at line rate", len(peak) == n and peak.min() >= 0.9,
                    f"peak utilisation per GPU port: {peak.min():.2f} to {peak.max():.2f} ({len(peak)} ports)",
                    f"every one of the {n} GPU ports >= 0.90 in some poll",
                    "a ring step sends a whole chunk at line rate; the telemetry interval (10us) is shorter than "
                    "one AllReduce"),
        Observation("between the bursts, during compute, the GPU ports idled",
                    quiet >= 1 and len(idle) == n and idle.min() >= 0.5 * quiet,
                    f"polls below 5% utilisation per GPU port: {idle.min()} to {idle.max()}; {duration(compute)} of "
                    f"compute per step, polls every {duration(interval)}",
                    f"every GPU port idle (< 5%) in at least half of the {quiet:.0f} polls that fall inside compute",
                    "during compute nobody sends; a poll wholly inside a compute phase sees an idle port"),
        Observation("the mean utilisation is what the bytes per step predict, so peak / mean is their inverse",
                    abs(mean.mean() / expected_mean - 1) <= 0.15,
                    f"mean {mean.mean():.2f} (peak / mean {peak.mean() / mean.mean():.1f}); predicted "
                    f"{expected_mean:.2f} ({size(per_step)} per GPU per {duration(step_ns)} step at "
                    f"{training['ideal']['link_bps'] / 1e9:.0f}G)",
                    "within 15% of the prediction",
                    "a ring AllReduce sends 2(n-1)/n x S per GPU per step; the port idles the rest of the step"),
        Observation("a step took its analytical ideal: compute plus the ring at line rate", 0.98 <= ratio <= 1.10,
                    f"step {duration(step_ns)} against an ideal of {duration(training['ideal']['iteration_ns'])} "
                    f"(x{ratio:.3f})", "x0.98 to x1.10",
                    "on a non-blocking fabric with the rail ring nothing shares a link, so nothing waits"),
    ]
