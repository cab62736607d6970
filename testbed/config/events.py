"""``events:`` in a scenario: what happens to the fabric while it trains (no root).

    events:
      - {at: 80us, action: down, link: leaf1-spine1}   # every link between the two switches
      - {at: 400us, action: up, link: leaf1-spine1}
      - {at: 80us, action: down, link: leaf2-eth5}      # one link, by a switch port's interface
      - {at: 80us, action: down, link: random uplink}   # one leaf-spine link, chosen with the seed
      - {at: 80us, action: down, switch: spine2}        # a spine dies: every link of it goes dark
      - {at: 80us, action: slow, link: leaf1-spine2, rate: 100G}  # the link runs at 100 Gbit/s
      - {at: 400us, action: up, link: leaf1-spine2}     # back at its planned rate

``at`` is real fabric time after training starts (the GPUs' common start; x dilation on
this machine). A link goes down as a cable pulled at the leaf's end: both switches see the
port go down and the controller reroutes around it (``controller.routing``); ``up`` plugs
it back. A switch down is every one of its links pulled at once (the far ends see their
ports go down, as when a switch loses power); only a spine can go: a leaf down cuts its
GPUs off, and the job cannot go on without them. ``slow`` with a ``rate`` lowers a link's
rate in both directions, as a link that trained down to fewer lanes: nothing goes down,
the controller is not told (nor is a real switch's ECMP), and the traffic hashed onto the
link goes on at the lower rate; ``up`` restores the planned rate (and plugs back a link
that was down). Links and switches are named here and checked against the planned fabric
(and a slow rate against the link's) in ``model.link_events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed import units
from testbed.config.checker import show

ACTIONS = ("down", "up", "slow")
RANDOM_UPLINK = "random uplink"
MAX_EVENTS = 64


@dataclass(frozen=True)
class Event:
    at_ns: int  # real fabric time after training starts
    action: str  # down | up | slow
    link: str  # "leaf1-spine1", "leaf2-eth5" or "random uplink"; "" for a switch
    index: int  # position in the scenario's list (messages name events[index])
    switch: str = ""  # a spine taken down / brought up whole (link is "")
    rate_bps: int = 0  # slow: the link's rate from then on (real); 0 otherwise


def validate_events(c, doc, path: tuple) -> tuple:
    if doc is None:
        return ()
    if not isinstance(doc, list):
        c.problem(path, f"expected a list of {{at, action, link or switch}}, got {show(doc)}")
        return ()
    if len(doc) > MAX_EVENTS:
        c.problem(path, f"expected at most {MAX_EVENTS} events, got {len(doc)}")
        return ()
    out = []
    for i, item in enumerate(doc):
        here = path + (i,)
        if not isinstance(item, dict):
            c.problem(here, f"expected a mapping {{at, action, link or switch}}, got {show(item)}")
            continue
        c.mapping(item, here, ("at", "action", "link", "switch", "rate"))
        at = c.unit(item, "at", here, units.parse_duration_ns)
        if at is not None and at < 0:
            c.problem(here + ("at",), f"expected a duration >= 0, got {show(item['at'])}")
            at = None
        action = item.get("action")
        if action not in ACTIONS:
            c.problem(here + ("action",), f"expected one of {', '.join(ACTIONS)}, got {show(action)}")
            continue
        rate = 0
        if action == "slow":
            rate = c.unit(item, "rate", here, units.parse_rate_bps)
            if rate is None:
                continue
        elif "rate" in item:
            c.problem(here + ("rate",), f"a rate belongs to action: slow (this event is {action})")
            continue
        if "switch" in item:
            switch = item["switch"]
            if "link" in item:
                c.problem(here, "expected link or switch, not both")
            elif not isinstance(switch, str) or not switch or len(switch) > 64:
                c.problem(here + ("switch",), f"expected a spine's name (spine1), got {show(switch)}")
            elif at is not None:
                out.append(Event(at_ns=at, action=action, link="", index=i, switch=switch, rate_bps=rate))
            continue
        link = item.get("link")
        if not isinstance(link, str) or not link or len(link) > 64:
            c.problem(here + ("link",), f"expected SWITCH-SWITCH (leaf1-spine1), a port (leaf1-eth5) or "
                                        f"'{RANDOM_UPLINK}' (or switch: SPINE), got {show(link)}")
            continue
        if at is not None:
            out.append(Event(at_ns=at, action=action, link=link, index=i, rate_bps=rate))
    return tuple(sorted(out, key=lambda e: (e.at_ns, e.index)))
