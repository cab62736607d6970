"""``events:`` in a scenario: what happens to the fabric while it trains (no root).

    events:
      - {at: 80us, action: down, link: leaf1-spine1}   # every link between the two switches
      - {at: 400us, action: up, link: leaf1-spine1}
      - {at: 80us, action: down, link: leaf2-eth5}      # one link, by a switch port's interface
      - {at: 80us, action: down, link: random uplink}   # one leaf-spine link, chosen with the seed

``at`` is real fabric time after training starts (the GPUs' common start; x dilation on
this machine). A link goes down as a cable pulled at the leaf's end: both switches see the
port go down and the controller reroutes around it (``controller.routing``); ``up`` plugs
it back. Links are named here and checked against the planned fabric in ``model.events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed import units
from testbed.config.checker import show

ACTIONS = ("down", "up")
NOT_BUILT = {"slow": "link slow (a lower port rate mid-run)", "switch": "switch down"}
RANDOM_UPLINK = "random uplink"
MAX_EVENTS = 64


@dataclass(frozen=True)
class Event:
    at_ns: int  # real fabric time after training starts
    action: str  # down | up
    link: str  # "leaf1-spine1", "leaf2-eth5" or "random uplink"
    index: int  # position in the scenario's list (messages name events[index])


def validate(c, doc, path: tuple) -> tuple:
    if doc is None:
        return ()
    if not isinstance(doc, list):
        c.problem(path, f"expected a list of {{at, action, link}}, got {show(doc)}")
        return ()
    if len(doc) > MAX_EVENTS:
        c.problem(path, f"expected at most {MAX_EVENTS} events, got {len(doc)}")
        return ()
    out = []
    for i, item in enumerate(doc):
        here = path + (i,)
        if not isinstance(item, dict):
            c.problem(here, f"expected a mapping {{at, action, link}}, got {show(item)}")
            continue
        c.mapping(item, here, ("at", "action", "link"))
        at = c.unit(item, "at", here, units.parse_duration_ns)
        if at is not None and at < 0:
            c.problem(here + ("at",), f"expected a duration >= 0, got {show(item['at'])}")
            at = None
        action = item.get("action")
        if action in NOT_BUILT:
            c.problem(here + ("action",), f"{NOT_BUILT[action]} is not built in this version (it has: "
                                          f"{', '.join(ACTIONS)})")
            continue
        if action not in ACTIONS:
            c.problem(here + ("action",), f"expected one of {', '.join(ACTIONS)}, got {show(action)}")
            continue
        link = item.get("link")
        if not isinstance(link, str) or not link or len(link) > 64:
            c.problem(here + ("link",), f"expected SWITCH-SWITCH (leaf1-spine1), a port (leaf1-eth5) or "
                                        f"'{RANDOM_UPLINK}', got {show(link)}")
            continue
        if at is not None:
            out.append(Event(at_ns=at, action=action, link=link, index=i))
    return tuple(sorted(out, key=lambda e: (e.at_ns, e.index)))
