"""Lab 3: ECMP collisions and oversubscription.

The physics: the ring alternates leaves, so every hop crosses the spines and each leaf
sends 4 flows of equal size at every step. ECMP hashes each flow onto one uplink (and each
spine onto one of its ports toward the other leaf) once, for good. With k flows on one
link each gets 1/k of it (ECN and DCQCN are off here, PFC keeps it lossless, so the shares
are exact), and a ring step ends when its slowest hop ends: the AllReduce takes k times its
ideal, k the most flows any link carried. On the 4:1 fabric all 4 flows share the one
uplink: k = 4 by construction, whatever the hash.
"""

from testbed.labs.measure import flows_per_uplink, spine_ports, uplinks
from testbed.labs.observe import Observation


def links(view) -> dict:
    return flows_per_uplink(view, uplinks(view) + spine_ports(view))


def observe(runs):
    flat, over = runs["lab03-one-to-one"], runs["lab03-four-to-one"]
    out = []
    shared = links(flat)
    k = max(shared.values(), default=0)
    busy = ", ".join(f"{i} {n}" for i, n in sorted(shared.items()) if n >= 2)
    imbalance = flat.summary["ecmp"].get("imbalance") or 0
    out.append(Observation("1:1: ECMP hashed two or more flows onto one link while others stayed idle",
                           k >= 2 and imbalance >= 1.5,
                           f"flows per link: {busy or 'none shared'}; uplink bytes max / mean x{imbalance:.2f}",
                           "a link with >= 2 flows; imbalance >= 1.5",
                           "a hash spreads few large flows unevenly: 4 flows miss each other on 4 uplinks only "
                           "9% of the time (4!/4^4)"))
    for view, kk, label in ((flat, k, "1:1"), (over, max(links(over).values(), default=0), "4:1")):
        ratio = view.summary["collectives"]["dp"]["mean_ratio"]
        out.append(Observation(f"{label}: the AllReduce took (most flows on one link) x its ideal",
                               kk >= 1 and 0.85 * kk <= ratio <= 1.25 * kk,
                               f"busiest link carried {kk} flow(s); AllReduce x{ratio:.2f} its ideal",
                               f"x{0.85 * kk:.2f} to x{1.25 * kk:.2f}",
                               "k flows on a link get 1/k of it each, and the ring waits for its slowest hop"))
    over_k = max(flows_per_uplink(over).values(), default=0)
    out.append(Observation("4:1: all four flows of a leaf share its one uplink: oversubscription, not imbalance",
                           over_k == 4 and (over.summary["ecmp"].get("imbalance") or 1.0) <= 1.01,
                           f"{over_k} flows on each leaf's uplink; imbalance "
                           f"{over.summary['ecmp'].get('imbalance') or 1.0:.2f}",
                           "4 flows on the uplink, imbalance 1.00",
                           "one uplink per leaf leaves ECMP nothing to choose; 4 x 400G of GPUs over 400G is 4:1"))
    return out
