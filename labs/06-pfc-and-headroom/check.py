"""Lab 6: PFC and its headroom.

The physics: a lossless port sends XOFF upstream when its queue passes XOFF; until the
pause takes effect its feeders keep sending: the cable's round trip, the peer's response
time and up to two frames in flight (the headroom formula, 2 x MTU + (2 x cable delay +
response) x rate: 59.9 KB behind a 3 m GPU link, 108 KB behind a 100 m uplink at 400G).
Headroom below what really arrives after XOFF overflows the buffer: drops on a "lossless"
class. A paused port's queue then fills and passes its own XOFF, so pauses spread hop by
hop towards the senders, and a pause stops every flow of the priority on that link, also
flows that never go near the congestion (head-of-line blocking of a victim).

On this machine link delay is not emulated (no netem in the kernel) and the PFC process
reacts in well under the 1 us the formula budgets, so what arrives after XOFF is far less
than the formula: the run with the formula's headroom shows how much was really used.
"""

from testbed.labs.measure import host_ports, size
from testbed.labs.observe import Observation


def _pfc(view):
    return view.summary["pfc"]


def observe(runs):
    low, full = runs["lab06-headroom-4kb"], runs["lab06-formula"]
    out = []
    lp, fp = _pfc(low), _pfc(full)
    low_headroom = max(q.get("headroom_bytes") or 0 for q in low.plan["queues"])
    used = fp.get("headroom_high_water_bytes", 0)
    ref = full.summary["references"]
    worst = {q["intf"]: q for q in full.plan["queues"]}.get(fp.get("headroom_high_water_port"), {})
    budget = len(worst.get("feeders", [])) * (worst.get("headroom_bytes") or 0)
    out.append(Observation("with 4 KB of headroom the lossless class drops, and go-back-N resends",
                           lp.get("enabled") and lp.get("drops", 0) > 0 and low.summary["transport"]["retransmitted"] > 0,
                           f"{lp.get('drops', 0)} PFC drops, {low.summary['transport']['retransmitted']} packets "
                           f"retransmitted, {lp.get('xoff_frames', 0)} XOFF frames",
                           "drops > 0 and retransmissions > 0",
                           f"{size(low_headroom)} is less than what keeps arriving after XOFF "
                           f"(the formula run used {size(used)})"))
    out.append(Observation("with the formula's headroom nothing is dropped, and less than the formula was used",
                           fp.get("enabled") and fp.get("xoff_frames", 0) > 0 and fp.get("drops", 0) == 0
                           and full.summary["drops"]["packets"] == 0
                           and 0 < used <= budget,
                           f"{fp.get('xoff_frames', 0)} XOFF, {fp.get('drops', 0)} drops; headroom used {size(used)} "
                           f"on {fp.get('headroom_high_water_port')} against {size(ref.get('pfc_headroom_formula_bytes') or 0)} "
                           f"(formula for that port), {len(worst.get('feeders', []))} feeders",
                           "XOFF > 0, no drops, headroom used > 0 and within the formula x the port's feeders",
                           "the formula covers the worst case per feeder; here the emulation accounts one egress "
                           "queue for all its feeders, and no cable delay is emulated"))
    gpu_ports = set(host_ports(full).values())
    per_port = fp.get("per_port", {})
    spine = sorted(p for p, c in per_port.items() if p.startswith("spine") and c.get("frames_sent"))
    leaf_to_gpu = sorted(p for p, c in per_port.items() if p in gpu_ports and c.get("frames_sent"))
    out.append(Observation("the pause spread hop by hop: the spine paused the leaves, the leaves paused their GPUs",
                           bool(spine) and bool(leaf_to_gpu),
                           f"spine ports that sent pauses: {', '.join(spine) or 'none'}; leaf ports that paused a GPU: "
                           f"{', '.join(leaf_to_gpu) or 'none'}",
                           "pause frames from a spine port and from a leaf's GPU port",
                           "a paused uplink's queue fills with its GPUs' traffic and passes its own XOFF"))
    victims = _victims(full)
    out.append(Observation("a victim: a GPU whose flow stays inside its leaf was paused and its sends slowed",
                           bool(victims), "; ".join(victims) or "no intra-leaf sender was paused",
                           "an intra-leaf sender with pause frames received and a send >= 1.2 x its line-rate time",
                           "PFC pauses the whole priority on a link, every flow on it, wherever it goes"))
    return out


def _victims(view) -> list:
    """Intra-leaf senders (never near the congested ports) that were paused, with their
    slowest send against its line-rate time."""
    hosts = {h["name"]: h for h in view.plan["hosts"]}
    rate = view.plan["training"]["transport"]["fabric_line_bps"]
    r = view.results
    paused = set(r.pauses.gpu) if not r.pauses.empty else set()
    ops = r.ops[(r.ops.kind == "send") & (r.ops.link == "fabric")]
    found = []
    for gpu, peer in {(row.gpu, row.peer) for row in ops.itertuples()}:
        if hosts[gpu]["leaf"] != hosts[peer]["leaf"] or gpu not in paused:
            continue
        mine = ops[(ops.gpu == gpu) & (ops.peer == peer)]
        stretch = (mine.end_real_ns - mine.start_real_ns).max() / (mine.bytes.max() * 8 / rate * 1e9)
        if stretch >= 1.2:
            found.append(f"{gpu} -> {peer} (both on {hosts[gpu]['leaf']}) paused, slowest send x{stretch:.1f} its "
                         f"line-rate time")
    return sorted(found)
