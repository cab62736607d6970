"""Lab 5: where to put the ECN threshold.

The physics: a queue above Kmin marks packets CE with a probability rising to pmax at Kmax
(and every packet above Kmax); receivers answer marks with CNPs and DCQCN cuts the senders.
So the queue a 2:1 incast builds is held near the thresholds: raise them and it sits
higher; it peaks near Kmax, where marking is heaviest, because cuts land only a CNP round
trip after the marks. Marking early costs no throughput while the threshold stays above
DCTCP's K > C x RTT / 7 (below it the queue could drain and the link idle between cuts).
"""

from testbed.agent.dcqcn import Params
from testbed.labs.measure import size
from testbed.labs.observe import Observation

NAMES = ("lab05-kmin-50kb", "lab05-kmin-100kb", "lab05-kmin-200kb")
RUN_SPREAD = 0.15  # how far two runs of one DCQCN-congested queue's p95 differ (see observe)


def _port(view):
    q = [q for q in view.plan["queues"] if q.get("ecn")]
    return (q[0]["kmin_bytes"], q[0]["kmax_bytes"]) if q else (None, None)


def observe(runs):
    views = [runs[n] for n in NAMES]
    out = []
    for v in views:
        t, e = v.summary["transport"], v.summary["ecn"]
        kmin, _ = _port(v)
        out.append(Observation(f"{v.name}: ECN marked, receivers sent CNPs, DCQCN cut, nothing was dropped",
                               kmin is not None and e.get("marked_packets", 0) > 0 and t["cnps_sent"] > 0
                               and t["cnps_received"] == t["cnps_sent"] and t["dcqcn_cuts"] > 0
                               and v.summary["drops"]["packets"] == 0,
                               f"Kmin {size(kmin or 0)}: {e.get('marked_packets', 0)} marked, {t['cnps_sent']} CNPs, "
                               f"{t['dcqcn_cuts']} cuts, {v.summary['drops']['packets']} drops",
                               "marks > 0, CNPs sent = received > 0, cuts > 0, no drops",
                               "two flows into one uplink at line rate each fill its queue past Kmin at every step"))
    p95 = [v.summary["queues"]["p95_depth_bytes"] for v in views]
    peaks = [v.summary["queues"]["max_depth_bytes"] for v in views]
    bounds = [_port(v) for v in views]
    # a cut acts only after a CNP, at most one per queue pair per interval: the queue may run on
    # at line rate for about two intervals past where marking starts
    params = views[0].plan["training"]["transport"].get("dcqcn_params") or {}
    reaction = 2 * params.get("cnp_interval_ns", Params().cnp_interval_ns) * 1e-9 * \
        views[0].plan["training"]["transport"]["fabric_line_bps"] / 8
    within = all(kmin and kmin <= p <= kmax + reaction for p, (kmin, kmax) in zip(p95, bounds))
    # two runs of the same DCQCN-congested queue differ by up to 15 % in p95 (docs/measurements.md:
    # incast 282, 318 and 387 KB at one dilation): Kmin 100KB and 200KB both overshoot towards
    # Kmax + the reaction, so between those two only more than that spread is a finding
    highest = p95[2] > p95[0] and p95[2] >= (1 - RUN_SPREAD) * p95[1]
    out.append(Observation("the queue sits higher when the thresholds are higher: p95 depth between Kmin and "
                           "Kmax plus the DCQCN reaction, highest at the highest Kmin", within and highest,
                           ", ".join(f"Kmin {size(k or 0)}: p95 {size(p)}, max {size(m)}"
                                     for (k, _), p, m in zip(bounds, p95, peaks)),
                           f"Kmin <= p95 <= Kmax + {size(reaction)} for each, and Kmin 200KB's the highest (above "
                           f"Kmin 50KB's; not below Kmin 100KB's by more than the {RUN_SPREAD:.0%} two runs differ by)",
                           "marking holds the queue in the band where it is marked; a cut acts only after a CNP "
                           "(at most one per queue pair per CNP interval), so the queue overshoots by up to two "
                           "intervals of line rate"))
    ratios = [v.summary["collectives"]["dp"]["mean_ratio"] for v in views]
    k = views[0].summary["references"].get("dctcp_k_bytes") or 0
    out.append(Observation("marking early costs no throughput while Kmin stays above DCTCP's K",
                           all(b[0] and b[0] > k for b in bounds) and max(ratios[:2]) <= 1.15 * ratios[2],
                           ", ".join(f"Kmin {size(b[0] or 0)}: AllReduce x{r:.2f}" for b, r in zip(bounds, ratios))
                           + f"; K = C x RTT / 7 = {size(k)}",
                           "the lower thresholds' AllReduce no more than 15% slower than at Kmin 200KB, every Kmin > K",
                           "above K the queue never drains between cuts, so the uplink never idles: the thresholds "
                           "move the queue, not the throughput"))
    return out
