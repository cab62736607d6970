"""Switch egress queues as pure data: what every switch port gets, in real and emulated
units, and the marker's settings as the bytes the BPF map holds.

Defaults, derived per port from its link rate R and cable (values the scenario leaves
unset):
- ECN (WRED on the instantaneous queue): DCQCN paper (Zhu et al., SIGCOMM 2015)
  settings at 40 Gbit/s, Kmin 5 KB, Kmax 200 KB, Pmax 1 %, scaled linearly with R
  (400G: 50 KB, 2 MB, 1 %). A derived Kmin above the user's Kmax is lowered to it (`show`
  prints both); a Kmin the user set is never changed: above a derived Kmax it is refused
  (``model.limits``).
- PFC headroom (bytes that still arrive after XOFF is sent): both ends' MTU in flight
  (2 x MTU) + the cable's round trip at line rate (2 x delay x R / 8) + the peer's
  response time at line rate (``PFC_RESPONSE_NS`` x R / 8, 1 us assumed).
- buffer per port: 2 x Kmax + headroom, so marking saturates well before the buffer
  fills; XOFF = buffer - headroom; XON = XOFF - 2 x MTU.
Emulation (section 4 of the design): a TBF at R / D with a burst of 3 MTU (late timers
in VMs otherwise make the real queue drift from the shadow) and a FIFO limit of
buffer + 2 MTU, a little above the marker's buffer, so drops happen in the marker,
where they are counted, and not in the qdisc.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from testbed import units

# Every fabric and NVLink interface gets IP MTU 4200 (the usual RoCE setting: a 4096-byte
# RoCE payload + BTH/UDP/IP headers + ICRC = 4140 bytes fits); MTU_BYTES is the largest
# frame on the wire, Ethernet header included, which is what TBF and the marker count.
LINK_MTU_BYTES = 4200
MTU_BYTES = LINK_MTU_BYTES + 14
PFC_RESPONSE_NS = 1000
DCQCN_REF_RATE_BPS = 40e9
DCQCN_KMIN_BYTES = 5_000
DCQCN_KMAX_BYTES = 200_000
DCQCN_PMAX = 0.01
BURST_MTUS = 3
FIFO_SLACK_MTUS = 2
@dataclass(frozen=True)
class PortQueue:
    """The egress queue of one switch port."""

    switch: str
    port: int
    intf: str
    peer: str  # the node this port sends to
    rate_bps: int  # real
    emulated_rate_bps: float
    buffer_bytes: int
    ecn: bool
    kmin_bytes: int
    kmax_bytes: int
    pmax: float
    pfc: bool
    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    headroom_formula_bytes: int
    burst_bytes: int
    fifo_limit_bytes: int
    delay_ns: int  # the link's propagation delay, real
    emulated_delay_ns: float  # x dilation: what netem holds each packet, where the kernel has netem
    feeders: tuple = ()  # interfaces of this switch whose upstream neighbours its PFC pauses
    trim: bool = False  # the data class trims (cuts to headers, control class) instead of dropping

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PortQueue":
        """The queue again from its ``plan.json`` entry (``to_dict`` through JSON): what the
        PFC process, the controller and ``testbed queues`` read instead of string keys."""
        return cls(**{**d, "feeders": tuple(d.get("feeders", ()))})


def headroom_formula_bytes(rate_bps: float, delay_ns: float, mtu_bytes: int = MTU_BYTES) -> int:
    """2 x MTU + 2 x cable delay x R + peer response time x R (bytes)."""
    return int(round(2 * mtu_bytes + (2 * delay_ns + PFC_RESPONSE_NS) * rate_bps / 8e9))


def port_queue(q, switch: str, port: int, peer: str, rate_bps: int, delay_ns: int,
               dilation: units.Dilation, mtu_bytes: int = MTU_BYTES, feeders: tuple = ()) -> PortQueue:
    """Settings for one port from the scenario's ``Queues`` (None = derived)."""
    scale = rate_bps / DCQCN_REF_RATE_BPS
    ecn = q.ecn is not None
    kmin = (q.ecn.kmin_bytes if ecn and q.ecn.kmin_bytes is not None else int(round(DCQCN_KMIN_BYTES * scale)))
    kmax = (q.ecn.kmax_bytes if ecn and q.ecn.kmax_bytes is not None else int(round(DCQCN_KMAX_BYTES * scale)))
    kmin = min(kmin, kmax)
    pmax = q.ecn.pmax if ecn and q.ecn.pmax is not None else DCQCN_PMAX
    formula = headroom_formula_bytes(rate_bps, delay_ns, mtu_bytes)
    pfc = q.pfc is not None
    headroom = q.pfc.headroom_bytes if pfc and q.pfc.headroom_bytes is not None else formula
    buffer = q.buffer_bytes if q.buffer_bytes is not None else 2 * kmax + headroom
    xoff = q.pfc.xoff_bytes if pfc and q.pfc.xoff_bytes is not None else max(0, buffer - headroom)
    xon = q.pfc.xon_bytes if pfc and q.pfc.xon_bytes is not None else max(0, xoff - 2 * mtu_bytes)
    return PortQueue(
        switch=switch, port=port, intf=f"{switch}-eth{port}", peer=peer, rate_bps=rate_bps,
        emulated_rate_bps=dilation.rate_bps(rate_bps), buffer_bytes=buffer, ecn=ecn,
        kmin_bytes=kmin if ecn else 0, kmax_bytes=kmax if ecn else 0, pmax=pmax if ecn else 0.0,
        pfc=pfc, xoff_bytes=xoff if pfc else 0, xon_bytes=xon if pfc else 0,
        headroom_bytes=headroom if pfc else 0, headroom_formula_bytes=formula,
        burst_bytes=BURST_MTUS * mtu_bytes, fifo_limit_bytes=buffer + FIFO_SLACK_MTUS * mtu_bytes,
        delay_ns=delay_ns, emulated_delay_ns=dilation.duration_ns(delay_ns), feeders=feeders if pfc else (),
        trim=q.trim)
