"""Scenario events resolved against the planned fabric (pure): which links an event takes
down, brings up or slows (a spine's: all of its links), named by the interfaces at their
leaf end (where the run pulls the cable) and at the spine's; and the rate each sets (a
slowed link's, and its planned rate again when it comes back ``up``)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from testbed import units
from testbed.config.events import RANDOM_UPLINK
from testbed.errors import ConfigError
from testbed.model.limits import MIN_EMULATED_RATE_BPS

PORT_RE = re.compile(r"(?P<switch>[a-z]+[0-9]+)-eth(?P<port>[0-9]+)")


@dataclass(frozen=True)
class LinkEvent:
    at_ns: int  # real fabric time after training starts
    action: str  # down | up | slow
    name: str  # as the scenario wrote it ("random uplink": the link it became)
    intfs: tuple  # the links' leaf-end interfaces, e.g. ("leaf1-eth3",)
    peers: tuple  # the other ends ("spine1-eth1",)
    rate_bps: int = 0  # real rate both ends' ports run at from then on (slow, or up after a slow); 0: unchanged


def resolve(scenario, links, dilation) -> tuple:
    """``scenario.events`` on ``links`` (the plan's); ConfigError naming the file and YAML
    path of a link the fabric does not have, or of a slow rate that is not below the link's
    or that this machine cannot run at ``dilation``."""
    uplinks = [lk for lk in links if lk.kind == "uplink"]
    chosen = random.Random(scenario.seed).choice(uplinks) if uplinks else None
    out, problems = [], []
    spines = sorted({lk.b for lk in uplinks})
    slowed: set = set()  # leaf-end interfaces running below their planned rate (events are in time order)
    for e in scenario.events:
        if e.switch:
            found = [lk for lk in uplinks if lk.b == e.switch]
            if not found:
                leaf = any(lk.a == e.switch for lk in uplinks)
                problems.append(f"{scenario.where(('events', e.index, 'switch'))}: "
                                + (f"{e.switch} is a leaf: a leaf down cuts its GPUs off and the job cannot go "
                                   f"on; take its uplinks down instead (link: {e.switch}-{spines[0]})" if leaf else
                                   f"no spine {e.switch!r} in this fabric (it has {', '.join(spines) or 'none'})"))
                continue
            name = f"{e.switch} (every link)"
        else:
            found = _links(e.link, uplinks, chosen)
            if not found:
                pairs = sorted({f"{lk.a}-{lk.b}" for lk in uplinks})
                have = ", ".join(pairs[:6]) + (" ..." if len(pairs) > 6 else "") or "none"
                problems.append(f"{scenario.where(('events', e.index, 'link'))}: no leaf-spine link {e.link!r} in "
                                f"this fabric (it has {have}; or a port such as "
                                f"{uplinks[0].a_intf if uplinks else 'leaf1-eth3'})")
                continue
            name = f"{chosen.a}-{chosen.b} ({chosen.a_intf})" if e.link == RANDOM_UPLINK else e.link
        rate = _rate(scenario, e, found, dilation, slowed, problems)
        out.append(LinkEvent(at_ns=e.at_ns, action=e.action, name=name, intfs=tuple(lk.a_intf for lk in found),
                             peers=tuple(lk.b_intf for lk in found), rate_bps=rate))
    if problems:
        raise ConfigError(problems)
    return tuple(out)


def _rate(scenario, e, found: list, dilation, slowed: set, problems: list) -> int:
    """The rate ``e`` sets on ``found`` (0: none); a slow rate that is not lower than the
    link's, or too low to emulate at ``dilation``, goes to ``problems``."""
    intfs = {lk.a_intf for lk in found}
    if e.action == "up":
        if not intfs & slowed:
            return 0
        slowed -= intfs
        return found[0].rate_bps  # uplinks all run at the fabric's uplink rate
    if e.action != "slow":
        return 0
    where = scenario.where(("events", e.index, "rate"))
    planned = min(lk.rate_bps for lk in found)
    if e.rate_bps >= planned:
        problems.append(f"{where}: expected a rate below the link's {units.format_rate(planned)}bit/s, got "
                        f"{units.format_rate(e.rate_bps)}bit/s")
    elif dilation.rate_bps(e.rate_bps) < MIN_EMULATED_RATE_BPS:
        problems.append(f"{where}: at dilation {dilation.factor:g}, {units.format_rate(e.rate_bps)}bit/s runs at "
                        f"{dilation.rate_bps(e.rate_bps):.0f} bit/s here, below the {MIN_EMULATED_RATE_BPS} bit/s "
                        f"a paused port's shaper is told apart from (a rate of at least "
                        f"{units.format_rate(dilation.real_rate_bps(MIN_EMULATED_RATE_BPS))}bit/s)")
    slowed |= intfs
    return e.rate_bps


def _links(name: str, uplinks: list, chosen) -> list:
    if name == RANDOM_UPLINK:
        return [chosen] if chosen is not None else []
    m = PORT_RE.fullmatch(name)
    if m:
        return [lk for lk in uplinks if name in (lk.a_intf, lk.b_intf)]
    parts = name.split("-")
    if len(parts) == 2:
        return [lk for lk in uplinks if {lk.a, lk.b} == set(parts)]
    return []
