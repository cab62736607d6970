"""What the physics and this machine allow a plan (pure): every port's queue must be able to
work with the settings the scenario's values add up to, and the slowest link, dilated,
must stay above what a port's shaper can pace. Refused with the reason and the field that
set it, rather than run."""

from __future__ import annotations

from testbed import units
from testbed.errors import ConfigError
from testbed.model import queues
from testbed.wire.bpfmaps import PMAX_ONE

MIN_EMULATED_RATE_BPS = 16_000  # twice the rate a paused port's shaper is turned down to (apply/datapath/tc.py)


def check(plan):
    """What the scenario's values add up to on every port must be a queue that can work:
    refused with the reason (and the field that set it) rather than run."""
    sc, problems = plan.scenario, []
    slowest = min(link.rate_bps for link in plan.links)
    if plan.dilation.rate_bps(slowest) < MIN_EMULATED_RATE_BPS:
        problems.append(f"{sc.where(('dilation',))}: at dilation {plan.dilation.factor:g} the slowest link "
                        f"({units.format_rate(slowest)}bit/s real) runs at {plan.dilation.rate_bps(slowest):.0f} bit/s "
                        f"here, below the {MIN_EMULATED_RATE_BPS // 1000} kbit/s a port's shaper needs; use a dilation "
                        f"of at most {slowest / MIN_EMULATED_RATE_BPS:.0f}")
    for pq in plan.queues:
        frames = 2 * queues.MTU_BYTES
        if pq.buffer_bytes < frames:
            problems.append(f"{sc.where(('queues', 'buffer'))}: a {pq.buffer_bytes}-byte buffer cannot hold the "
                            f"{frames} bytes of two {queues.MTU_BYTES}-byte frames (one leaving, one arriving)")
        if pq.ecn and pq.kmax_bytes > pq.buffer_bytes:
            problems.append(f"{sc.where(('queues', 'ecn', 'kmax'))}: kmax {units.format_size(pq.kmax_bytes)} (at "
                            f"{units.format_rate(pq.rate_bps)}) is above the {units.format_size(pq.buffer_bytes)} "
                            f"buffer: the queue would drop before it marks every packet")
        user_kmin = sc.queues.ecn.kmin_bytes if sc.queues.ecn is not None else None
        if pq.ecn and user_kmin is not None and pq.kmin_bytes != user_kmin:  # only a derived kmin is lowered
            problems.append(f"{sc.where(('queues', 'ecn', 'kmin'))}: kmin {units.format_size(user_kmin)} is above the "
                            f"kmax derived at {units.format_rate(pq.rate_bps)} ({units.format_size(pq.kmax_bytes)}: "
                            f"DCQCN's {units.format_size(queues.DCQCN_KMAX_BYTES)} at 40G, scaled with the rate); "
                            f"set queues.ecn.kmax too, or a kmin at most that")
        if pq.ecn and 0 < pq.pmax and round(pq.pmax * PMAX_ONE) == 0:
            problems.append(f"{sc.where(('queues', 'ecn', 'pmax'))}: pmax {pq.pmax:g} is below the marker's "
                            f"resolution (1/{PMAX_ONE} = {1 / PMAX_ONE:.2g}): it would mark nothing; use at least "
                            f"{1 / PMAX_ONE:.2g}, or ecn: off")
        if pq.pfc and pq.xoff_bytes + pq.headroom_bytes > pq.buffer_bytes:
            problems.append(f"{sc.where(('queues', 'pfc', 'xoff'))}: xoff {units.format_size(pq.xoff_bytes)} + "
                            f"headroom {units.format_size(pq.headroom_bytes)} (at {units.format_rate(pq.rate_bps)}) do "
                            f"not fit in the {units.format_size(pq.buffer_bytes)} buffer")
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
