"""Controller decisions as pure functions: plan in, OpenFlow messages (as data) out.

The os-ken application (``testbed.controller.app``) only translates these messages
to the wire and reports what happened; everything it decides is here and unit
tested without a switch. Faucet's style: handlers take ``now`` and return
messages and events.

Program installed on every switch (OpenFlow 1.3):
- table 0, priority 1000: EtherType 0x8808 (MAC control / PFC) is dropped: pause
  frames are link-local and must never be forwarded by a bridge;
- table 0, priority 10: one counting flow per (in_port, ip_ecn) for IPv4, then
  ``goto_table:1``: their packet counters are the per-link ECN codepoint counts
  (Not-ECT, ECT(1), ECT(0), CE arriving over each link) the collector reads;
- table 1, priority 100 + prefix length: IPv4 to a prefix -> decrement TTL, then
  output to the one port, or to a select group over the ECMP ports that hashes the
  5-tuple (``HASH_FIELDS``), so flows differing only in UDP source port spread over
  the uplinks (OVS's default group hash leaves UDP ports out: see ``wire.openflow``);
- adaptive routing only (the plan's ``routing`` is ``adaptive``), table 1, priority
  ``PRIORITY_STEERED``: per port of a select group, IPv4 tagged with VLAN id = that port
  -> pop the tag, decrement TTL, output there. The hop before the switch chose the port
  (the least occupied one, ``bpf/marker.c``) and pushed the tag; untagged packets (the
  control class, anything without a decision) still take the select group;
- no table-miss entry: anything else (ARP, IPv6) is dropped; hosts use static
  neighbour entries, so nothing needs flooding and no packet reaches the controller.

When a fabric port goes down or comes back (OpenFlow port status), the routes are computed
again from the plan's links without the dead ones (``model.routing.compute``, the same
shortest paths the plan made) and every switch whose routes changed gets, make before
break, a new select group for each new port set, then its changed route flows overwritten
to use them (an OpenFlow add with the same match and priority replaces a flow in place),
then a barrier; when every such switch has confirmed, the reroute is done. OVS's select
groups do not watch their ports, so until then packets hashed to a dead port are lost.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import cached_property

from testbed.model import routing

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_MAC_CONTROL = 0x8808
PRIORITY_DROP_PAUSE = 1000
PRIORITY_ROUTE_BASE = 100
PRIORITY_COUNT = 10
PRIORITY_STEERED = 200  # above every route (100 + prefix length)
OFPVID_PRESENT = 0x1000
COUNT_TABLE, ROUTE_TABLE = 0, 1
ECN_CODEPOINTS = ("not_ect", "ect1", "ect0", "ce")  # ip_ecn 0..3 (RFC 3168)
HASH_FIELDS = ("ipv4_src", "ipv4_dst", "ip_proto", "tcp_src", "tcp_dst", "udp_src", "udp_dst")


@dataclass(frozen=True)
class ClearSwitch:
    """Delete every flow and group (a reconnecting switch starts from a known state)."""


@dataclass(frozen=True)
class GroupAdd:
    group_id: int
    ports: tuple  # select group, one bucket per port, equal weights
    hash_fields: tuple = HASH_FIELDS  # what the bucket choice hashes on


@dataclass(frozen=True)
class FlowAdd:
    priority: int
    match: tuple  # ((field, value), ...) in os-ken OFPMatch keyword names
    actions: tuple  # (("dec_nw_ttl",), ("output", port) | ("group", id))
    table: int = COUNT_TABLE
    goto: int | None = None  # goto_table after the actions


@dataclass(frozen=True)
class Barrier:
    """Ask the switch to confirm everything before it has been applied."""


@dataclass(frozen=True)
class SwitchReady:
    """Event: the switch acknowledged its whole program."""

    dpid: int
    name: str
    flows: int
    groups: int
    seconds: float  # connect -> barrier reply


@dataclass(frozen=True)
class RerouteDone:
    """Event: every switch whose routes a port change altered has confirmed its new ones."""

    switches: tuple  # names
    flows: int
    groups: int
    seconds: float  # the port status that started it -> the last barrier reply
    down: tuple  # fabric links down now, by their first end's interface


def route_flow(prefix: str, out: tuple) -> FlowAdd:
    net = ipaddress.ip_network(prefix)
    match = (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", (str(net.network_address), str(net.netmask))))
    return FlowAdd(PRIORITY_ROUTE_BASE + net.prefixlen, match, (("dec_nw_ttl",), out), table=ROUTE_TABLE)


def switch_program(routes, in_ports=(), adaptive: bool = False) -> list:
    """Messages that program one switch from its routes (``model.routing.Route``: prefix
    ``10.0.2.0/24`` out of ports (9, 10)) and its fabric ports (ECN counting); with
    ``adaptive``, the flows that follow a tagged packet's chosen port."""
    msgs: list = [ClearSwitch()]
    groups: dict[tuple, int] = {}
    for r in routes:
        ports = tuple(sorted(r.ports))
        if len(ports) > 1 and ports not in groups:
            groups[ports] = len(groups) + 1
    msgs += [GroupAdd(gid, ports) for ports, gid in sorted(groups.items(), key=lambda kv: kv[1])]
    msgs.append(FlowAdd(PRIORITY_DROP_PAUSE, (("eth_type", ETH_TYPE_MAC_CONTROL),), ()))
    for port in sorted(in_ports):
        for ecn in range(len(ECN_CODEPOINTS)):
            msgs.append(FlowAdd(PRIORITY_COUNT, (("in_port", port), ("eth_type", ETH_TYPE_IPV4), ("ip_ecn", ecn)), (),
                                goto=ROUTE_TABLE))
    for r in sorted(routes, key=lambda r: (ipaddress.ip_network(r.prefix).prefixlen, r.prefix),
                    reverse=True):
        ports = tuple(sorted(r.ports))
        msgs.append(route_flow(r.prefix, ("group", groups[ports]) if len(ports) > 1 else ("output", ports[0])))
    if adaptive:
        for port in sorted({p for ports in groups for p in ports}):
            match = (("eth_type", ETH_TYPE_IPV4), ("vlan_vid", OFPVID_PRESENT | port))
            msgs.append(FlowAdd(PRIORITY_STEERED, match, (("pop_vlan",), ("dec_nw_ttl",), ("output", port)),
                                table=ROUTE_TABLE))
    msgs.append(Barrier())
    return msgs


class FabricController:
    """What the controller does, without os-ken: which program each switch gets and when
    the fabric is ready. ``plan`` is the run's plan, typed (``model.plan_file.PlanFile``, or
    the ``Plan`` itself): its switches, routes, links, hosts and routing mode."""

    def __init__(self, plan):
        self.switches = {s.dpid: s for s in plan.switches}
        self.routes: dict[str, dict] = {}  # switch -> {prefix: ports} as programmed now
        for r in plan.routes:
            self.routes.setdefault(r.switch, {})[r.prefix] = tuple(sorted(r.ports))
        self.ports: dict[str, list] = {}
        self.link_at: dict[tuple, object] = {}  # (switch, port) -> the fabric link there
        names = {s.name for s in plan.switches}
        for link in plan.links:
            for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
                self.ports.setdefault(node, []).append(port)
                if node in names and link.kind == "uplink":
                    self.link_at[(node, port)] = link
        self.plan = plan
        self.down: set = set()  # fabric links down, by their first end's interface
        self.next_group = {name: 1 + len({p for p in r.values() if len(p) > 1}) for name, r in self.routes.items()}
        self.reroute: dict | None = None
        self.adaptive = plan.routing == "adaptive"
        self.pending: dict[int, tuple[float, int, int]] = {}
        self.ready: set[int] = set()
        self.connected: set[int] = set()

    def switch_connected(self, dpid: int, now: float) -> list:
        """A switch finished the OpenFlow handshake: its full program. Unknown
        datapaths (not in the plan) get nothing."""
        sw = self.switches.get(dpid)
        if sw is None:
            return []
        routes = [routing.Route(sw.name, prefix, ports) for prefix, ports in self.routes.get(sw.name, {}).items()]
        msgs = switch_program(routes, self.ports.get(sw.name, ()), self.adaptive)
        self.next_group[sw.name] = 1 + sum(isinstance(m, GroupAdd) for m in msgs)
        flows = sum(isinstance(m, FlowAdd) for m in msgs)
        groups = sum(isinstance(m, GroupAdd) for m in msgs)
        self.pending[dpid] = (now, flows, groups)
        self.ready.discard(dpid)
        self.connected.add(dpid)
        return msgs

    def port_status(self, dpid: int, port: int, live: bool, now: float) -> list:
        """A switch port went down or came back: [(dpid, messages), ...] for every switch
        whose routes change (empty if the port is not a fabric link's or nothing changed)."""
        sw = self.switches.get(dpid)
        link = self.link_at.get((sw.name, port)) if sw else None
        if link is None:
            return []
        key = link.a_intf
        if live == (key not in self.down):
            return []  # the other end already told us
        (self.down.discard if live else self.down.add)(key)
        fresh: dict[str, dict] = {}
        plan = self.plan
        for r in routing.compute(plan.switches, plan.hosts, [lk for lk in plan.links if lk.a_intf not in self.down],
                                 self.leaves):
            fresh.setdefault(r.switch, {})[r.prefix] = r.ports
        out = []
        for dp, s in sorted(self.switches.items()):
            name = s.name
            changed = {p: ports for p, ports in fresh.get(name, {}).items() if self.routes[name].get(p) != ports}
            if not changed:
                continue
            msgs, groups = [], {}
            for ports in sorted(set(changed.values())):
                if len(ports) > 1:
                    groups[ports] = self.next_group[name]
                    self.next_group[name] += 1
                    msgs.append(GroupAdd(groups[ports], ports))
            msgs += [route_flow(p, ("group", groups[ports]) if len(ports) > 1 else ("output", ports[0]))
                     for p, ports in sorted(changed.items())]
            msgs.append(Barrier())
            self.routes[name].update(changed)
            if dp in self.connected:  # one not connected yet gets the routes of now when it connects
                out.append((dp, msgs))
        if out:
            r = self.reroute or {"started": now, "pending": set(), "switches": set(), "flows": 0, "groups": 0}
            r["pending"] |= {dp for dp, _ in out}
            r["switches"] |= {self.switches[dp].name for dp, _ in out}
            r["flows"] += sum(isinstance(m, FlowAdd) for _, msgs in out for m in msgs)
            r["groups"] += sum(isinstance(m, GroupAdd) for _, msgs in out for m in msgs)
            self.reroute = r
        return out

    def barrier_reply(self, dpid: int, now: float) -> list:
        if dpid not in self.pending:
            r = self.reroute
            if r is None or dpid not in r["pending"]:
                return []
            r["pending"].discard(dpid)
            if r["pending"]:
                return []
            self.reroute = None
            return [RerouteDone(tuple(sorted(r["switches"])), r["flows"], r["groups"], now - r["started"],
                                tuple(sorted(self.down)))]
        started, flows, groups = self.pending.pop(dpid)
        self.ready.add(dpid)
        return [SwitchReady(dpid, self.switches[dpid].name, flows, groups, now - started)]

    def switch_disconnected(self, dpid: int, now: float) -> list:
        self.ready.discard(dpid)
        self.connected.discard(dpid)
        self.pending.pop(dpid, None)
        return []

    @cached_property
    def leaves(self) -> list:
        """The leaves in index order, as ``model.routing.compute`` takes them."""
        return sorted((s for s in self.plan.switches if s.role == "leaf"), key=lambda s: s.index)

    @property
    def all_ready(self) -> bool:
        return self.ready == set(self.switches)
