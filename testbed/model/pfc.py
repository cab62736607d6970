"""PFC decisions as pure data: which ports feed a congested egress queue (the neighbours
its pause stops) and the XOFF/XON hysteresis of one accounting point. The frame is
``testbed.wire.pfc``; ``testbed.apply.pfc`` acts on these decisions."""

from __future__ import annotations

from dataclasses import dataclass


def feeders(table, hosts, fabric_links, switches, switch: str, egress_port: int) -> tuple[int, ...]:
    """Ports of ``switch`` whose arriving traffic the planned routes can send out of
    ``egress_port``: the upstream neighbours feeding that queue, which its PFC pauses.
    A host port feeds every egress its routes use; a switch neighbour feeds it only with
    destinations it routes toward this switch (so a leaf never pauses an uplink for
    another uplink: traffic does not turn around at a leaf)."""
    addr = {h.name: h.addr for h in hosts}
    dests = [h.addr for h in hosts if egress_port in table.ports(switch, h.addr)]
    result = []
    for link in fabric_links:
        for here, port, peer, peer_port in ((link.a, link.a_port, link.b, link.b_port),
                                            (link.b, link.b_port, link.a, link.a_port)):
            if here != switch or port == egress_port:
                continue
            if peer in switches:  # a switch: only what it routes to us on this link
                if any(peer_port in table.ports(peer, a) for a in dests):
                    result.append(port)
            elif any(a != addr[peer] for a in dests):  # a GPU: anything but itself
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
