"""Plan: the fabric as pure data (no root, no side effects).

From a validated Scenario this builds every switch, GPU host, server and link with
port numbers, interface names, addresses, the proactive routes each switch gets
(ECMP groups where several shortest paths exist), and the numbers an engineer
sizes a fabric by: oversubscription and bisection bandwidth. Apply does exactly
what the plan says; the controller receives the plan as JSON.

It is the run's one plan: the fabric, routes, every switch port's queue settings (with
the ports its PFC pauses), the training schedule (each GPU's ops, the collectives and the
analytical ideal) and the telemetry settings, built once by ``build`` and written whole to
``plan.json``. ``show``, the apply steps, the controller, the PFC process, the agents and
the report read it; none rebuilds a piece of it.

Conventions (Mininet's): switches ``spine1..``, ``leaf1..`` with interfaces
``leaf1-eth3``; GPU hosts ``h1..`` with fabric NIC ``h1-eth0`` and NVLink NIC
``h1-eth1``; a server's NVLink segment is the Linux bridge ``nvl1``.
Addresses: GPU n on leaf L is ``10.0.L.n/16``; the NVLink segment of server s
is ``10.(128 + s // 256).(s % 256).0/24``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from testbed import units
from testbed.config.scenario import Scenario
from testbed.config.workload import DEFAULT_MTU_BYTES
from testbed.model import limits, link_events, pfc, queues, routing
from testbed.model.training import TrainingPlan, plan_training
from testbed.wire import roce

# Forwarding the host can give the emulated fabric, in emulated bits/s x switch hops.
# userspace: one TCP flow crossed 3 switches of the default fabric at ~490 Mbit/s
# (~1.5 Gbit/s of hop-forwarding) on the 2-core development machine; a quarter of
# that is budgeted, leaving room for GPU agents, telemetry and small packets.
# kernel: assumed 2.5x userspace (the lab VM that CI boots runs under QEMU software
# emulation, where no forwarding figure means anything). The manifest records the
# figure used and the fidelity guard checks, per run, that it held.
FORWARDING_BUDGET_BPS = {"user": 400e6, "kernel": 1e9}
# What the GPU agents (Python event loops, one process per server) send on time, in emulated
# packets/s for all of them together, on the 2-core development machine: the default 8-GPU
# ring's mean pacing lateness was 0.03 / 0.13 / 0.37 line-rate packet gaps at 1900 / 4800 /
# 9600 packets/s (D = 50000 / 20000 / 10000), its collectives x1.004 / x1.03 / x1.10 of what
# D = 250000 gave (docs/measurements.md, "The fidelity guard against a slower run"). Half
# the rate at which the lateness reached 0.1 gaps is budgeted (lateness 0.034, under the
# guard's limit of 0.07). The
# forwarding budget alone priced bytes, not packets: a 2048-byte MTU ring got a quarter of
# the dilation it needed.
AGENT_PACKET_BUDGET_PPS = 2000
DEFAULT_TELEMETRY_INTERVAL_REAL_NS = 10_000


@dataclass(frozen=True)
class Switch:
    name: str
    role: str  # "spine" | "leaf"
    dpid: int
    index: int  # 1-based within its role

    @property
    def dpid_hex(self) -> str:
        return f"{self.dpid:016x}"


@dataclass(frozen=True)
class Host:
    """An emulated GPU: one fabric NIC (to its leaf) and, in a multi-GPU server, one NVLink NIC."""

    name: str
    index: int  # 1-based global GPU number
    server: int  # 1-based
    local_rank: int  # 0-based GPU index inside its server (= rail on rail-optimised)
    leaf: str
    leaf_port: int
    ip: str  # with prefix length
    mac: str
    nvlink_ip: str | None
    nvlink_mac: str | None

    @property
    def addr(self) -> str:
        return self.ip.split("/")[0]


@dataclass(frozen=True)
class Link:
    """A full-duplex link between two ports. ``kind`` is host, uplink or nvlink."""

    kind: str
    a: str
    a_port: int
    b: str
    b_port: int
    rate_bps: int
    delay_ns: int

    @property
    def a_intf(self) -> str:
        return f"{self.a}-eth{self.a_port}"

    @property
    def b_intf(self) -> str:
        return f"{self.b}-eth{self.b_port}"


@dataclass(frozen=True)
class Server:
    name: str
    index: int
    gpus: tuple  # host names
    nvlink_bridge: str | None  # None for single-GPU servers


@dataclass(frozen=True)
class Telemetry:
    """How often the controller collects counters: real-fabric time, and x dilation."""

    interval_real_ns: int
    interval_emulated_ns: int


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    dilation: units.Dilation
    dilation_reason: str
    switches: tuple
    hosts: tuple
    servers: tuple
    links: tuple
    routes: tuple
    queues: tuple = ()  # queues.PortQueue per switch port, with the ports its PFC pauses
    training: TrainingPlan | None = None  # None: the run only proves reachability
    telemetry: Telemetry | None = None
    link_delay: bool = False  # cable delay emulated (netem): the ideal counts propagation
    events: tuple = ()  # model.link_events.LinkEvent: links down and up while it trains

    # -- lookups ---------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @cached_property
    def fabric_links(self) -> tuple:
        """The links switches forward over (NVLink excluded); computed once per plan (a
        1000-GPU plan has tens of thousands of links, asked for by every view)."""
        return tuple(link for link in self.links if link.kind != "nvlink")

    def routes_for(self, switch: str) -> tuple:
        return tuple(r for r in self.routes if r.switch == switch)

    # -- what an engineer sizes a fabric by -------------------------------------------------

    def oversubscription(self) -> dict:
        """Per leaf: host-facing capacity / uplink capacity (None without uplinks)."""
        down: dict = {}
        up: dict = {}
        for link in self.links:
            if link.kind == "host":
                down[link.b] = down.get(link.b, 0) + link.rate_bps
            elif link.kind == "uplink":
                up[link.a] = up.get(link.a, 0) + link.rate_bps
        return {s.name: down.get(s.name, 0) / up[s.name] if up.get(s.name) else None
                for s in self.switches if s.role == "leaf"}

    def bisection_bps(self) -> int:
        """Max-flow, one direction, from the first half of the GPUs (in server order) to the
        second half over the fabric links (NVLink excluded)."""
        n = len(self.hosts)
        if n < 2:
            return 0
        first = [h.name for h in self.hosts[: n // 2]]
        second = [h.name for h in self.hosts[n // 2:]]
        return routing.max_flow(self.fabric_links, first, second)

    def route_table(self) -> routing.Table:
        return routing.Table(self.routes)

    def ecmp_paths(self, src: str, dst: str, limit: int = 64, table: routing.Table | None = None) -> list:
        """All shortest fabric paths between two GPU hosts, each a list of
        (node, out_interface) hops ending with (dst, None). Follows the planned routes."""
        return routing.paths(table or self.route_table(), self.fabric_links, self.host(src), self.host(dst),
                             len(self.switches) + 1, limit)

    def ecmp_shares(self, table: routing.Table | None = None) -> tuple[dict, dict]:
        """Every ordered GPU pair sending one packet, split evenly at each hop: (expected
        packets per switch egress interface, switches crossed per pair)."""
        return routing.ecmp_shares(table or self.route_table(), self.fabric_links, self.hosts)

    @property
    def routing(self) -> str:
        """ecmp, or adaptive (each data packet to the least occupied shortest-path port)."""
        return self.scenario.fabric.routing

    def adaptive_choices(self) -> list:
        """Adaptive routing's decision table (empty under ECMP): ``routing.Steer`` entries."""
        if self.routing != "adaptive":
            return []
        return routing.adaptive_choices(self.hosts, self.links, self.routes)

    def to_dict(self) -> dict:
        """JSON-ready plan (handed to the controller, written to the run folder)."""
        return {
            "scenario": self.scenario.name,
            "routing": self.routing,
            "dilation": self.dilation.factor,
            "switches": [asdict(s) | {"dpid_hex": s.dpid_hex} for s in self.switches],
            "hosts": [asdict(h) for h in self.hosts],
            "servers": [asdict(s) for s in self.servers],
            "links": [asdict(link) | {"a_intf": link.a_intf, "b_intf": link.b_intf} for link in self.links],
            "routes": [asdict(r) for r in self.routes],
            "queues": [pq.to_dict() for pq in self.queues],
            "training": self.training.to_dict() if self.training else None,
            "telemetry": asdict(self.telemetry) if self.telemetry else None,
            "link_delay": self.link_delay,
        }


def smallest_frame_bytes(scenario: Scenario) -> int:
    """The smallest RoCE data frame any of the scenario's workloads sends (its path MTU plus
    headers): the most packets per byte."""
    workloads = [scenario.workload, *(job.workload for job in scenario.jobs)]
    return min((w.mtu_bytes for w in workloads if w is not None), default=DEFAULT_MTU_BYTES) + roce.HEADER_BYTES


def auto_dilation(scenario: Scenario, datapath: str, slowdown: float = 1.0) -> tuple[units.Dilation, str]:
    """Dilation so that every GPU sending at line rate fits what this machine kind does in
    time, rounded up to 1/2/5 x 10^k: the bytes forwarded across three switch hops (the
    datapath's forwarding budget) and the packets the GPU agents send (their packet budget,
    at the scenario's smallest MTU), whichever needs more; then times ``slowdown``, how much
    slower than the budgets' machine kind this machine runs the agents' per-packet work
    (``apply.speed``: 1 on that kind), to two digits: the dilation trusted there, stretched by
    what this machine measured, without a second 1/2/5 rounding (up to x2.5 more wall time)."""
    fabric = scenario.fabric
    gpus = sum(leaf.hosts for leaf in fabric.leaves)
    hops = 3 if fabric.spines else 1
    rate = fabric.host_link.rate_bps
    demand = gpus * rate * hops
    budget = FORWARDING_BUDGET_BPS["kernel" if datapath == "kernel" else "user"]
    frame = smallest_frame_bytes(scenario)
    packets = gpus * rate / (8 * frame)
    need = max(demand / budget, packets / AGENT_PACKET_BUDGET_PPS)
    d = units.Dilation.nice(need)  # what the budgets' machine kind is trusted at
    if slowdown != 1:  # that, as many times slower as this machine ran the probe (2 digits)
        d = units.Dilation(float(f"{d.scaled(slowdown):.2g}"))
    reason = (f"auto: forwarding {gpus} GPUs x {units.format_rate(rate)} x {hops} hops = {units.format_rate(demand)} "
              f"against the {datapath} datapath's {units.format_rate(budget)} -> D >= {demand / budget:.0f}; "
              f"the agents' packets {gpus} GPUs x {units.format_rate(rate)} / {frame}-byte frames = "
              f"{units.format_rate(packets)}/s against {AGENT_PACKET_BUDGET_PPS}/s -> D >= "
              f"{packets / AGENT_PACKET_BUDGET_PPS:.0f}; rounded to {units.nice_ceil(need)}"
              + (f"; x{slowdown:g} for this machine's measured speed = {d.factor:.0f}" if slowdown != 1 else ""))
    return d, reason


def _mac(kind: int, a: int, b: int) -> str:
    return f"02:{kind:02x}:00:{a >> 8:02x}:{a & 0xff:02x}:{b:02x}"


def build(scenario: Scenario, datapath: str = "user", link_delay: bool = False,
          telemetry_interval_real_ns: int = DEFAULT_TELEMETRY_INTERVAL_REAL_NS, slowdown: float = 1.0) -> Plan:
    """The whole run plan for a scenario, from what the machine offers: ``datapath``
    ("user"/"kernel") and ``slowdown`` (the machine's measured speed, ``apply.speed``) feed
    auto dilation; ``link_delay`` says whether cable delay is emulated (netem), which the
    training's ideal then counts."""
    fabric = scenario.fabric
    if scenario.dilation is not None:
        dilation = units.Dilation(scenario.dilation)
        reason = "set by the scenario"
    else:
        dilation, reason = auto_dilation(scenario, datapath, slowdown)

    spines = [Switch(f"spine{i + 1}", "spine", i + 1, i + 1) for i in range(fabric.spines)]
    leaves = [Switch(f"leaf{i + 1}", "leaf", fabric.spines + i + 1, i + 1) for i in range(len(fabric.leaves))]
    hosts, links = _hosts(fabric, leaves, _placement(fabric))
    links += _uplinks(fabric, spines, leaves)
    servers = _servers(fabric, hosts, links)

    switches = spines + leaves
    routes = routing.compute(switches, hosts, links, leaves)
    plan = Plan(scenario=scenario, dilation=dilation, dilation_reason=reason, switches=tuple(switches),
                hosts=tuple(hosts), servers=tuple(servers), links=tuple(links), routes=tuple(routes),
                telemetry=Telemetry(telemetry_interval_real_ns,
                                    int(dilation.duration_ns(telemetry_interval_real_ns))),
                link_delay=link_delay)
    table = plan.route_table()
    plan = replace(plan, queues=_queues(plan, table), events=link_events.resolve(scenario, links, dilation))
    limits.check(plan)
    if scenario.workload is not None:
        plan = replace(plan, training=plan_training(plan, scenario.workload, table))
    elif scenario.jobs:
        from testbed.model.jobs import plan_jobs

        plan = replace(plan, training=plan_jobs(plan, scenario.jobs, table))
    return plan


def _queues(plan: Plan, table: routing.Table) -> tuple:
    """Every switch egress port (NVLink bridges are not switches), with its PFC feeders."""
    switches = {s.name for s in plan.switches}
    links_of: dict[str, list] = {name: [] for name in switches}
    link_at = {}
    for link in plan.fabric_links:
        for here, port, peer, peer_port in ((link.a, link.a_port, link.b, link.b_port),
                                            (link.b, link.b_port, link.a, link.a_port)):
            if here in switches:
                links_of[here].append((port, peer, peer_port))
                link_at[(here, port)] = link
    pfc_on = plan.scenario.queues.pfc is not None
    if pfc_on:  # each switch's ports toward each GPU, looked up once
        addrs = [int(ipaddress.ip_address(h.addr)) for h in plan.hosts]
        toward = {sw: [table.ports(sw, a) for a in addrs] for sw in switches}
        host_index = {h.name: i for i, h in enumerate(plan.hosts)}
    out = []
    for node in switches:
        for port, peer, _ in links_of[node]:
            link = link_at[(node, port)]
            feeders = ()
            if pfc_on:
                feeders = tuple(f"{node}-eth{p}" for p in pfc.feeders(node, port, toward, links_of, host_index))
            out.append(queues.port_queue(plan.scenario.queues, node, port, peer, link.rate_bps, link.delay_ns,
                                         plan.dilation, feeders=feeders))
    return tuple(sorted(out, key=lambda pq: (pq.switch, pq.port)))


def _placement(fabric) -> list:
    """(server, local rank, leaf index, leaf port - 1) of every GPU, in server order."""
    g = fabric.gpus_per_server
    if fabric.kind == "rail-optimised":  # GPU k of every server on rail leaf k
        slots = [[(s + 1, k) for s in range(fabric.servers)] for k in range(g)]
    else:
        slots, server = [], 0
        for leaf in fabric.leaves:
            row = []
            for n in range(leaf.hosts):
                if n % g == 0:
                    server += 1
                row.append((server, n % g))
            slots.append(row)
    return sorted((server, rank, li, n) for li, row in enumerate(slots) for n, (server, rank) in enumerate(row))


def _hosts(fabric, leaves, placed) -> tuple[list, list]:
    """The GPU hosts and their links to their leaves."""
    hosts, links = [], []
    nv = fabric.gpus_per_server > 1
    for idx, (server, rank, li, n) in enumerate(placed, start=1):
        leaf, name = leaves[li], f"h{idx}"
        nv_net = f"10.{128 + server // 256}.{server % 256}"
        hosts.append(Host(
            name=name, index=idx, server=server, local_rank=rank, leaf=leaf.name, leaf_port=n + 1,
            ip=f"10.0.{li + 1}.{n + 1}/16", mac=_mac(1, li + 1, n + 1),
            nvlink_ip=f"{nv_net}.{rank + 1}/24" if nv else None,
            nvlink_mac=_mac(2, server, rank + 1) if nv else None,
        ))
        links.append(Link("host", name, 0, leaf.name, n + 1, fabric.host_link.rate_bps, fabric.host_link.delay_ns))
    return hosts, links


def _uplinks(fabric, spines, leaves) -> list:
    """Each leaf's uplinks, spread round-robin over the spines."""
    links, spine_port = [], {s.name: 0 for s in spines}
    for leaf, spec in zip(leaves, fabric.leaves):
        for u in range(spec.uplinks.count):
            spine = spines[u % len(spines)]
            spine_port[spine.name] += 1
            links.append(Link("uplink", leaf.name, spec.hosts + u + 1, spine.name, spine_port[spine.name],
                              spec.uplinks.link.rate_bps, spec.uplinks.link.delay_ns))
    return links


def _servers(fabric, hosts, links) -> list:
    """The servers; in multi-GPU servers, each GPU's link to the server's NVLink bridge
    (added to ``links``)."""
    by_server: dict[int, list] = {}
    for h in hosts:
        by_server.setdefault(h.server, []).append(h)
    servers = []
    for s in range(1, max(by_server, default=0) + 1):
        members = by_server.get(s, [])
        bridge = f"nvl{s}" if fabric.gpus_per_server > 1 else None
        servers.append(Server(f"server{s}", s, tuple(h.name for h in members), bridge))
        if bridge:
            links += [Link("nvlink", h.name, 1, bridge, h.local_rank + 1, fabric.nvlink_rate_bps, 0) for h in members]
    return servers
