"""Lab 4: a lossy buffer against the synchronised burst of a 2:1 incast.

The physics: at every ring step the two flows that leave a leaf each send one chunk
(S / n bytes) at line rate into one uplink that drains at line rate. From an empty queue one
step leaves one chunk queued (2C in, C out, for chunk / C). The ring does not let the queue
empty between steps: the next chunks arrive while it still holds the last ones, so the
queue of a lossless run peaks near two chunks. A buffer below that drops; each drop costs a
go-back-N retransmission of everything sent after it.
"""

from testbed.labs.measure import size
from testbed.labs.observe import Observation

FRAME_BYTES = 4096 + 58


def observe(runs):
    small, middle, large = runs["lab04-buffer-16kb"], runs["lab04-buffer-64kb"], runs["lab04-buffer-128kb"]
    coll = large.plan["training"]["collectives"][0]
    chunk = coll["bytes"] / coll["ranks"]
    out = []

    def drops(view):
        return view.summary["drops"]["packets"]

    def buffer(view):
        return max(q["buffer_bytes"] for q in view.plan["queues"])

    for view, claim in ((small, "a buffer smaller than one chunk drops at every step"),
                        (middle, "a buffer of more than one chunk still drops: the queue does not empty between "
                                 "ring steps")):
        out.append(Observation(claim, drops(view) > 0 and buffer(view) < 2 * chunk,
                               f"{size(buffer(view))} buffer: {drops(view)} packets dropped",
                               f"drops > 0 with a buffer below two chunks ({size(2 * chunk)})",
                               f"one ring step is one chunk of {size(chunk)} per flow; two flows share the uplink, "
                               f"and the next step's chunks arrive before the last ones left"))
    peak = large.summary["queues"]["max_depth_bytes"]
    ok = drops(large) == 0 and chunk <= peak <= 2 * chunk + 3 * FRAME_BYTES
    out.append(Observation("a buffer of two chunks and more absorbs the burst; the deepest queue holds at most two "
                           "chunks and a few frames", ok,
                           f"{size(buffer(large))} buffer: {drops(large)} drops, deepest queue {size(peak)} "
                           f"({peak / chunk:.2f} chunks)",
                           f"no drops; deepest queue from {size(chunk)} to {size(2 * chunk)} + 3 frames",
                           "fluid model of the 2:1 ring step: one chunk queued per step from an empty queue, two "
                           "when the next step's chunks arrive before the queue drained"))
    for view in (small, middle):
        t, base = view.summary["transport"], large.summary["jct"]["mean_step_ns"]
        step = view.summary["jct"]["mean_step_ns"]
        out.append(Observation(f"{size(buffer(view))}: every drop cost go-back-N retransmissions and the step "
                               f"stretched", t["retransmitted"] >= drops(view) > 0
                               and t["naks_sent"] + t["timeouts"] > 0 and step >= 1.5 * base,
                               f"{drops(view)} drops, {t['retransmitted']} packets retransmitted "
                               f"({t['naks_sent']} NAKs, {t['timeouts']} timeouts); step {step / 1e3:.0f}us against {base / 1e3:.0f}us "
                               f"lossless (x{step / base:.1f})",
                               "retransmitted >= dropped > 0, NAKs or timeouts, and a step >= 1.5 x the lossless run's",
                               "go-back-N resends every packet after the lost one, and waits a NAK round trip or "
                               "a timeout to learn of the loss"))
    return out
