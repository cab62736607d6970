"""Scenario events resolved against the planned fabric (pure): which links an event takes
down or brings up (a spine's: all of its links), named by the interfaces at their leaf
end (where the run pulls the cable)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from testbed.config.events import RANDOM_UPLINK
from testbed.errors import ConfigError

PORT_RE = re.compile(r"(?P<switch>[a-z]+[0-9]+)-eth(?P<port>[0-9]+)")


@dataclass(frozen=True)
class LinkEvent:
    at_ns: int  # real fabric time after training starts
    action: str  # down | up
    name: str  # as the scenario wrote it ("random uplink": the link it became)
    intfs: tuple  # the links' leaf-end interfaces, e.g. ("leaf1-eth3",)
    peers: tuple  # the other ends ("spine1-eth1",)


def resolve(scenario, links) -> tuple:
    """``scenario.events`` on ``links`` (the plan's); ConfigError naming the file and YAML
    path of a link the fabric does not have."""
    uplinks = [lk for lk in links if lk.kind == "uplink"]
    chosen = random.Random(scenario.seed).choice(uplinks) if uplinks else None
    out, problems = [], []
    spines = sorted({lk.b for lk in uplinks})
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
            out.append(LinkEvent(at_ns=e.at_ns, action=e.action, name=f"{e.switch} (every link)",
                                 intfs=tuple(lk.a_intf for lk in found), peers=tuple(lk.b_intf for lk in found)))
            continue
        found = _links(e.link, uplinks, chosen)
        if not found:
            pairs = sorted({f"{lk.a}-{lk.b}" for lk in uplinks})
            problems.append(f"{scenario.where(('events', e.index, 'link'))}: no leaf-spine link {e.link!r} in this "
                            f"fabric (it has {', '.join(pairs[:6]) + (' ...' if len(pairs) > 6 else '') or 'none'}; "
                            f"or a port such as {uplinks[0].a_intf if uplinks else 'leaf1-eth3'})")
            continue
        name = f"{chosen.a}-{chosen.b} ({chosen.a_intf})" if e.link == RANDOM_UPLINK else e.link
        out.append(LinkEvent(at_ns=e.at_ns, action=e.action, name=name, intfs=tuple(lk.a_intf for lk in found),
                             peers=tuple(lk.b_intf for lk in found)))
    if problems:
        raise ConfigError(problems)
    return tuple(out)


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
