"""PFC decisions as pure data: which ports feed a congested egress queue (the neighbours
its pause stops) and the XOFF/XON hysteresis of one accounting point. The frame is
``testbed.wire.pfc``; ``testbed.apply.processes.pfcd`` acts on these decisions."""

from __future__ import annotations

from dataclasses import dataclass

from testbed import units
from testbed.model.queues import PFC_RESPONSE_NS

# How often the PFC process reads the shadow queues, in real-fabric time: a twentieth of the
# peer response time the headroom formula budgets (PFC_RESPONSE_NS), so a crossing of XOFF
# waits at most that long to be seen, and a poll may run late by 4x before the fidelity
# guard's pfc_reaction check (a quarter of the response) fails the run.
POLL_REAL_NS = PFC_RESPONSE_NS // 20
MIN_POLL_NS = 1_000_000  # never more often than this (emulated): below, polling costs a core


def poll_period_ns(dilation: units.Dilation) -> int:
    """The PFC process's polling period on the emulated clock at ``dilation``. Polling at a
    fixed 1 ms whatever the dilation cost 0.4 cores at 32 GPUs (bench/scale.py) to sample
    queues every 5 ns of fabric time at dilation 200000; the reaction the guard judges is in
    fabric time, so the period is too."""
    return max(MIN_POLL_NS, int(dilation.duration_ns(POLL_REAL_NS)))


# what arrives at once beyond its feeders' line rates, per feeder: its sender's shaper bucket
# (plan's burst_bytes) and one batch of OVS's userspace datapath (NETDEV_MAX_BURST = 32
# packets), which a busy ovs-vswitchd hands over back to back after falling behind
OVS_BATCH_PACKETS = 32


def quiet_until_ns(depth_bytes: float, xoff_bytes: int, fill_bps: float, slack_bytes: float, now_ns: int) -> int:
    """The earliest time an egress queue ``depth_bytes`` deep now can pass XOFF, if at most
    ``fill_bps`` (emulated: its feeders' line rates, nothing drained) arrive, plus
    ``slack_bytes`` at once: polling it before then cannot find it above XOFF, so the PFC
    process reads only the queues that could be near it. ``now_ns`` when it could already be."""
    room_bytes = xoff_bytes - depth_bytes - slack_bytes
    if room_bytes <= 0 or fill_bps <= 0:
        return now_ns
    return now_ns + int(room_bytes * 8 / fill_bps * 1e9)


def feeders(switch: str, egress_port: int, toward: dict, links_of: dict, host_index: dict) -> tuple[int, ...]:
    """Ports of ``switch`` whose arriving traffic the planned routes can send out of
    ``egress_port``: the upstream neighbours feeding that queue, which its PFC pauses.
    A host port feeds every egress its routes use; a switch neighbour feeds it only with
    destinations it routes toward this switch (so a leaf never pauses an uplink for
    another uplink: traffic does not turn around at a leaf).

    ``toward[sw][i]``: the ports of switch ``sw`` toward GPU ``i``; ``links_of[sw]``: its
    (port, neighbour, neighbour's port); ``host_index``: GPU name -> ``i``."""
    dests = [i for i, ports in enumerate(toward[switch]) if egress_port in ports]
    result = []
    for port, peer, peer_port in links_of[switch]:
        if port == egress_port:
            continue
        if peer in toward:  # a switch: only what it routes to us on this link
            theirs = toward[peer]
            if any(peer_port in theirs[i] for i in dests):
                result.append(port)
        elif any(i != host_index[peer] for i in dests):  # a GPU: anything but itself
            result.append(port)
    return tuple(sorted(set(result)))


@dataclass
class Hysteresis:
    """XOFF/XON for one ingress accounting point: pause above ``xoff_bytes`` (and refresh
    the pause before it expires), resume at or below ``xon_bytes``."""

    xoff_bytes: int
    xon_bytes: int
    pause_emulated_ns: float  # how long one XOFF frame pauses the neighbour
    paused_until_ns: float = 0.0

    def update(self, depth_bytes: float, now_ns: float) -> str | None:
        """"xoff" (send a pause), "xon" (send a resume) or None."""
        paused = now_ns < self.paused_until_ns
        if depth_bytes > self.xoff_bytes:
            # refresh at half the pause time so the neighbour never resumes on expiry
            if not paused or now_ns >= self.paused_until_ns - self.pause_emulated_ns / 2:
                self.paused_until_ns = now_ns + self.pause_emulated_ns
                return "xoff"
            return None
        if paused and depth_bytes <= self.xon_bytes:
            self.paused_until_ns = 0.0
            return "xon"
        return None
