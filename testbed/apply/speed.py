"""How fast this machine runs the GPU agents' per-packet work, against the machine kind
the automatic dilation's budgets were measured on.

The agents' packet budget (``model.plan.AGENT_PACKET_BUDGET_PPS``) and the userspace
forwarding budget were measured on a 2-core development machine. A machine that runs
Python much slower (the lab VM under QEMU without KVM runs every instruction in software)
needs a proportionally larger dilation for the same run to be trusted; without this probe
the automatic dilation cannot know it and the run starves (docs/limitations.md).

The probe is the agents' own per-packet path: a RoCE frame from ``wire.roce.FrameTemplate``
(headers, ICRC over 4 KB), sent on a datagram socket, received, parsed. The best of a few
short trials is kept, so a busy neighbour on a shared machine does not read as a slow
machine (load during the run is the fidelity guard's business); the probe takes about
50 ms here.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from testbed.wire import roce

# The probe's best time per packet on the reference machine kind (the 2-core development
# machine the budgets were measured on; 20 runs of ``python -m testbed.apply.speed`` there,
# 2026-12-07: 6.3-6.6 us or 8.6-9.1 us depending on the core it ran on; the slower kept).
# With both cores busy with other work it read 6.4-15.8 us.
REFERENCE_US_PER_PACKET = 9.0
# Within this factor of the reference a machine counts as the reference kind: the budgets
# already leave half their measured capacity free, a busy shared machine reads up to x1.8
# (above), and the 1/2/5 rounding of the dilation would otherwise double D on a machine
# 1 % slower. QEMU without KVM (the lab VM in CI) is far beyond it.
SAME_KIND_SLOWDOWN = 2.0
PACKETS_PER_TRIAL = 1000
TRIALS = 5
_PAYLOAD = bytes(4096)


@dataclass(frozen=True)
class Speed:
    """The probe's result: its best time per packet and the slowdown the dilation applies
    (1 on the reference kind and on faster machines: the budgets were not measured there)."""

    us_per_packet: float
    reference_us_per_packet: float = REFERENCE_US_PER_PACKET

    @property
    def ratio(self) -> float:
        return self.us_per_packet / self.reference_us_per_packet

    @property
    def slowdown(self) -> float:
        return round(self.ratio, 1) if self.ratio >= SAME_KIND_SLOWDOWN else 1.0

    def to_dict(self) -> dict:
        return {"us_per_packet": round(self.us_per_packet, 2), "reference_us_per_packet": self.reference_us_per_packet,
                "ratio": round(self.ratio, 2), "slowdown": self.slowdown}


def _trial(tx: socket.socket, rx: socket.socket, template: roce.FrameTemplate, packets: int) -> float:
    start = time.perf_counter()
    for psn in range(packets):
        tx.send(template.frame(roce.OP_SEND_ONLY, psn, False, _PAYLOAD))
        parsed = roce.parse(memoryview(rx.recv(8192))[roce.OFF_BTH:])
        if parsed is None or parsed.psn != psn:
            raise RuntimeError(f"speed probe: packet {psn} came back as {parsed}")
    return (time.perf_counter() - start) / packets * 1e6


def measure(packets: int = PACKETS_PER_TRIAL, trials: int = TRIALS) -> Speed:
    """Run the probe: ``trials`` trials of ``packets`` packets, the best one kept."""
    src = roce.Endpoint("02:00:00:00:00:01", "10.0.0.1")
    dst = roce.Endpoint("02:00:00:00:00:02", "10.0.0.2")
    template = roce.FrameTemplate(src, dst, roce.udp_source_port(1, 2), 2, len(_PAYLOAD), roce.DSCP_DATA, roce.ECT0)
    tx, rx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with tx, rx:
        return Speed(min(_trial(tx, rx, template, packets) for _ in range(trials)))


def main() -> int:
    speed = measure()
    print(f"speed probe: {speed.us_per_packet:.2f} us per packet (reference {speed.reference_us_per_packet} us): "
          f"x{speed.ratio:.2f}, slowdown applied to the automatic dilation x{speed.slowdown:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
