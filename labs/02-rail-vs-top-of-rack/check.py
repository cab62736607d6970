"""Lab 2: the same servers and job on a rail-optimised and a top-of-rack fabric.

The physics: the ring visits the GPUs rail by rail (NCCL's order on a rail fabric:
h1 h5 h2 h6 ...). On the rail fabric h1 and h5 share rail leaf 1, so half the hops stay on
one leaf and only the hops that change rail cross a spine. On the top-of-rack fabric every
server is one leaf, so every hop of that ring crosses the spines: twice the spine bytes,
and four flows per leaf for ECMP to hash onto four uplinks, where two of them often land on
one (then that hop runs at half rate at best, and the ring at the pace of its slowest hop).
"""

from testbed.labs.measure import flows_per_uplink, size, spine_bytes
from testbed.labs.observe import Observation


def observe(runs):
    rail, tor = runs["lab02-rail"], runs["lab02-tor"]
    out = []
    spine = {view.name: spine_bytes(view) for view in (rail, tor)}
    for view in (rail, tor):
        measured, planned = spine[view.name]
        out.append(Observation(f"{view.name}: the spines carried the bytes of the hops that cross leaves",
                               planned > 0 and abs(measured / planned - 1) <= 0.05,
                               f"{size(measured)} sent by spine ports; planned {size(planned)} "
                               f"(x{measured / max(planned, 1):.3f})", "within 5% of the plan",
                               "a hop between GPUs on different leaves crosses one spine; on the same leaf, none"))
    (mr, pr), (mt, pt) = spine[rail.name], spine[tor.name]
    out.append(Observation("top-of-rack sends twice the rail fabric's bytes through the spines",
                           pr > 0 and abs((mt / mr) / (pt / pr) - 1) <= 0.05 and pt / pr >= 1.9,
                           f"x{mt / max(mr, 1):.2f} (planned x{pt / max(pr, 1):.2f})", "x2 (within 5% of the plan)",
                           "the rail ring crosses a spine only when it changes rail (4 of 8 hops); on top-of-rack "
                           "every hop changes server and so leaf (8 of 8)"))
    r = rail.summary["collectives"]["dp"]["mean_ratio"]
    out.append(Observation("rail: the AllReduce ran at its ideal, nothing shared a link", r <= 1.10,
                           f"AllReduce x{r:.2f} its ideal; deepest queue "
                           f"{size(rail.summary['queues']['max_depth_bytes'])}", "<= x1.10",
                           "each leaf's one crossing flow has two uplinks to itself"))
    k = max(flows_per_uplink(tor).values(), default=0)
    t = tor.summary["collectives"]["dp"]["mean_ratio"]
    out.append(Observation("top-of-rack: ECMP put two flows on one uplink and the ring slowed to that hop's share",
                           k >= 2 and t >= 0.8 * k,
                           f"busiest uplink carried {k} flows; AllReduce x{t:.2f} its ideal (rail x{r:.2f}); "
                           f"deepest queue {size(tor.summary['queues']['max_depth_bytes'])}",
                           ">= 2 flows on one uplink, AllReduce >= 0.8 x that count",
                           "4 flows hashed onto 4 uplinks miss each other only 4!/4^4 = 9% of the time; two on one "
                           "link get half its rate each, at best (DCQCN's cuts cost more, lab 5)"))
    return out
