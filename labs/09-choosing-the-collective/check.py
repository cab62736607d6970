"""Lab 9: ring, halving-doubling and hierarchical AllReduce on the rail fabric.

The physics (8 GPUs, 2 servers, ranks in rail order h1 h5 h2 h6 ...):
- ring: 14 steps of S/8 between rank neighbours; every GPU sends 2 x 7/8 x S; the hops
  that change rail cross a spine (half of them).
- halving-doubling: 6 steps (log2 8 = 3 of reduce-scatter, 3 of all-gather), partners
  2^k ranks apart exchanging S/2, S/4, S/8: the same bytes per GPU as the ring in fewer steps
  (less latency), but the partners 1 and 2 ranks apart sit on other rails, so 6/7 of its
  bytes cross the spines, several flows per leaf at once: ECMP collisions.
- hierarchical: reduce-scatter inside each server on NVLink, a ring per rail across the
  servers (one leaf: no spine), all-gather on NVLink. The fabric carries 2 x (2-1)/2 x S/4
  per GPU, 1/7 of the ring's bytes.
"""

from testbed.labs.measure import fabric_bytes, size, spine_bytes
from testbed.labs.observe import Observation


def observe(runs):
    ring, hd, hier = runs["lab09-ring"], runs["lab09-halving-doubling"], runs["lab09-hierarchical"]
    out = []
    share = {}
    for v in (ring, hd, hier):
        measured, planned = fabric_bytes(v)
        sm, sp = spine_bytes(v)
        share[v.name] = (sm / measured if measured else 0.0, sp / planned if planned else 0.0)
        out.append(Observation(f"{v.name}: the GPUs put the algorithm's bytes on the fabric, and the planned share "
                               f"crossed the spines", planned > 0 and abs(measured / planned - 1) <= 0.05
                               and abs(share[v.name][0] - share[v.name][1]) <= 0.05,
                               f"{size(measured)} on the fabric (planned {size(planned)}), "
                               f"{share[v.name][0]:.0%} of it through spines (planned {share[v.name][1]:.0%})",
                               "bytes within 5% of the plan; spine share within 5 points of it",
                               "each algorithm's closed form: who sends what to whom at each step"))
    (rf, _), (hf, _) = fabric_bytes(ring), fabric_bytes(hier)
    b = {v.name: v.summary["collectives"]["dp"] for v in (ring, hd, hier)}
    out.append(Observation("hierarchical keeps the fabric part on the rails: a seventh of the ring's bytes, none "
                           "through a spine, and the highest bus bandwidth",
                           hf <= rf / 5 and share[hier.name][0] <= 0.01
                           and b[hier.name]["mean_busbw_bps"] > 2 * b[ring.name]["mean_busbw_bps"],
                           f"fabric bytes {size(hf)} vs ring {size(rf)}; spine share {share[hier.name][0]:.0%}; "
                           f"busbw {b[hier.name]['mean_busbw_bps'] / 1e9:.0f}G vs ring "
                           f"{b[ring.name]['mean_busbw_bps'] / 1e9:.0f}G",
                           "<= 1/5 of the ring's fabric bytes, no spine bytes, busbw > 2 x the ring's",
                           "NVLink (3.6T) does the reduce-scatter and all-gather; only S/4 per GPU crosses the "
                           "fabric, on its own rail"))
    out.append(Observation("the ring runs at its ideal; halving-doubling's fewer, larger spine-crossing steps "
                           "collide and run slower", b[ring.name]["mean_ratio"] <= 1.10
                           and b[hd.name]["mean_ratio"] >= 1.5 and share[hd.name][0] > share[ring.name][0],
                           f"ring x{b[ring.name]['mean_ratio']:.2f} its ideal, halving-doubling "
                           f"x{b[hd.name]['mean_ratio']:.2f} (ECMP imbalance {hd.summary['ecmp'].get('imbalance') or 0:.2f})",
                           "ring <= x1.10; halving-doubling >= x1.5 with more of its bytes through the spines",
                           "halving-doubling's ideal assumes every pair gets a full link; in rail order its partners "
                           "sit on other rails, and two flows per leaf hash onto two uplinks"))
    return out
