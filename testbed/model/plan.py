"""Plan: the fabric as pure data (no root, no side effects).

From a validated Scenario this builds every switch, GPU host, server and link with
port numbers, interface names, addresses, the proactive routes each switch gets
(ECMP groups where several shortest paths exist), and the numbers an engineer
sizes a fabric by: oversubscription and bisection bandwidth. Apply does exactly
what the plan says; the controller receives the plan as JSON.

Conventions (Mininet's): switches ``spine1..``, ``leaf1..`` with interfaces
``leaf1-eth3``; GPU hosts ``h1..`` with fabric NIC ``h1-eth0`` and NVLink NIC
``h1-eth1``; a server's NVLink segment is the Linux bridge ``nvl1``.
Addresses: GPU n on leaf L is ``10.0.L.n/16``; the NVLink segment of server s
is ``10.(128 + s // 256).(s % 256).0/24``.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import asdict, dataclass

from testbed.model import queues
from testbed import units
from testbed.config.scenario import Fabric, Scenario

FABRIC_NET = ipaddress.ip_network("10.0.0.0/16")

# Forwarding the host can give the emulated fabric, in emulated bits/s x switch hops.
# userspace: one TCP flow crossed 3 switches of the default fabric at ~490 Mbit/s
# (~1.5 Gbit/s of hop-forwarding) on the 2-core development machine; a quarter of
# that is budgeted, leaving room for GPU agents, telemetry and small packets.
# kernel: not yet measured (lab VM); assumed 2.5x userspace. The manifest records
# the figure used; the fidelity guard (a later issue) checks that it held.
FORWARDING_BUDGET_BPS = {"user": 400e6, "kernel": 1e9}


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
class Route:
    """On ``switch``, packets to ``prefix`` leave by one of ``ports`` (ECMP when several)."""

    switch: str
    prefix: str
    ports: tuple


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

    # -- lookups ---------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def fabric_links(self) -> tuple:
        return tuple(link for link in self.links if link.kind != "nvlink")

    def routes_for(self, switch: str) -> tuple:
        return tuple(r for r in self.routes if r.switch == switch)

    # -- what an engineer sizes a fabric by -------------------------------------------------

    def oversubscription(self) -> dict:
        """Per leaf: host-facing capacity / uplink capacity (None without uplinks)."""
        out = {}
        for s in self.switches:
            if s.role != "leaf":
                continue
            down = sum(link.rate_bps for link in self.links if link.kind == "host" and link.b == s.name)
            up = sum(link.rate_bps for link in self.links if link.kind == "uplink" and link.a == s.name)
            out[s.name] = down / up if up else None
        return out

    def bisection_bps(self) -> int:
        """Max-flow, one direction, from the first half of the GPUs (in server order) to the
        second half over the fabric links (NVLink excluded)."""
        n = len(self.hosts)
        if n < 2:
            return 0
        first = [h.name for h in self.hosts[: n // 2]]
        second = [h.name for h in self.hosts[n // 2:]]
        return _max_flow(self.fabric_links, first, second)

    def ecmp_paths(self, src: str, dst: str, limit: int = 64) -> list:
        """All shortest fabric paths between two GPU hosts, each a list of
        (node, out_interface) hops ending with (dst, None). Follows the planned routes."""
        s, d = self.host(src), self.host(dst)
        if s.name == d.name:
            return []
        by_port = {}
        for link in self.fabric_links:
            by_port[(link.a, link.a_port)] = (link.b, link.b_port)
            by_port[(link.b, link.b_port)] = (link.a, link.a_port)
        routes = {}
        for r in self.routes:
            routes.setdefault(r.switch, []).append(r)
        paths = []

        def walk(node, hops):
            if len(paths) >= limit:
                return
            if node == d.name:
                paths.append(hops + [(node, None)])
                return
            if len(hops) > len(self.switches) + 1:
                raise AssertionError(f"routing loop from {src} to {dst}: {hops}")
            for port in lookup(routes.get(node, ()), d.addr):
                nxt, _ = by_port[(node, port)]
                walk(nxt, hops + [(node, f"{node}-eth{port}")])

        walk(s.leaf, [(s.name, f"{s.name}-eth0")])
        return paths

    def to_dict(self) -> dict:
        """JSON-ready plan (handed to the controller, written to the run folder)."""
        return {
            "scenario": self.scenario.name,
            "dilation": self.dilation.factor,
            "switches": [asdict(s) | {"dpid_hex": s.dpid_hex} for s in self.switches],
            "hosts": [asdict(h) for h in self.hosts],
            "servers": [asdict(s) for s in self.servers],
            "links": [asdict(link) | {"a_intf": link.a_intf, "b_intf": link.b_intf} for link in self.links],
            "routes": [asdict(r) for r in self.routes],
            "queues": [pq.to_dict() for pq in queues.plan_queues(self)],
        }


def lookup(routes, addr: str) -> tuple:
    """Longest-prefix match over a switch's routes: the ports toward ``addr``."""
    ip = ipaddress.ip_address(addr)
    best = None
    for r in routes:
        net = ipaddress.ip_network(r.prefix)
        if ip in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, r.ports)
    return best[1] if best else ()


def _max_flow(links, sources, sinks) -> int:
    """Edmonds-Karp on full-duplex links (each direction has the link's capacity)."""
    cap: dict = {}

    def arc(u, v, c):
        cap.setdefault(u, {}).setdefault(v, 0)
        cap.setdefault(v, {}).setdefault(u, 0)
        cap[u][v] += c

    for link in links:
        arc(link.a, link.b, link.rate_bps)
        arc(link.b, link.a, link.rate_bps)
    big = sum(link.rate_bps for link in links) + 1
    for h in sources:
        arc("<src>", h, big)
    for h in sinks:
        arc(h, "<dst>", big)
    total = 0
    while True:
        parent = {"<src>": None}
        queue = deque(["<src>"])
        while queue and "<dst>" not in parent:
            u = queue.popleft()
            for v, c in cap[u].items():
                if c > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if "<dst>" not in parent:
            return total
        v, bottleneck = "<dst>", big
        while parent[v] is not None:
            bottleneck = min(bottleneck, cap[parent[v]][v])
            v = parent[v]
        v = "<dst>"
        while parent[v] is not None:
            cap[parent[v]][v] -= bottleneck
            cap[v][parent[v]] += bottleneck
            v = parent[v]
        total += bottleneck


def auto_dilation(fabric: Fabric, datapath: str) -> tuple[units.Dilation, str]:
    """Dilation so that every GPU sending at line rate across three switch hops fits the
    host's forwarding budget for the datapath, rounded up to 1/2/5 x 10^k."""
    gpus = sum(leaf.hosts for leaf in fabric.leaves)
    hops = 3 if fabric.spines else 1
    demand = gpus * fabric.host_link.rate_bps * hops
    budget = FORWARDING_BUDGET_BPS["kernel" if datapath == "kernel" else "user"]
    d = units.Dilation.nice(demand / budget)
    reason = (f"auto: {gpus} GPUs x {units.format_rate(fabric.host_link.rate_bps)} x {hops} hops = "
              f"{units.format_rate(demand)} of forwarding; {datapath} datapath budget "
              f"{units.format_rate(budget)} -> D >= {demand / budget:.0f}, rounded to {d.factor:g}")
    return d, reason


def _mac(kind: int, a: int, b: int) -> str:
    return f"02:{kind:02x}:00:{a >> 8:02x}:{a & 0xff:02x}:{b:02x}"


def build(scenario: Scenario, datapath: str = "user") -> Plan:
    """The whole fabric for a scenario. ``datapath`` ("user"/"kernel") only feeds auto dilation."""
    fabric = scenario.fabric
    if scenario.dilation is not None:
        dilation = units.Dilation(scenario.dilation)
        reason = "set by the scenario"
    else:
        dilation, reason = auto_dilation(fabric, datapath)

    spines = [Switch(f"spine{i + 1}", "spine", i + 1, i + 1) for i in range(fabric.spines)]
    leaves = [Switch(f"leaf{i + 1}", "leaf", fabric.spines + i + 1, i + 1) for i in range(len(fabric.leaves))]

    # GPU placement: (server, local_rank) for each leaf slot.
    g = fabric.gpus_per_server
    slots: list[list[tuple[int, int]]] = []
    if fabric.kind == "rail-optimised":
        slots = [[(s + 1, k) for s in range(fabric.servers)] for k in range(g)]
    else:
        server = 0
        for leaf in fabric.leaves:
            row = []
            for n in range(leaf.hosts):
                if n % g == 0:
                    server += 1
                row.append((server, n % g))
            slots.append(row)

    placed = []  # (server, local_rank, leaf_idx, n)
    for li, row in enumerate(slots):
        for n, (server, rank) in enumerate(row):
            placed.append((server, rank, li, n))
    placed.sort()
    servers_count = max((p[0] for p in placed), default=0)

    hosts, links = [], []
    for idx, (server, rank, li, n) in enumerate(placed, start=1):
        leaf = leaves[li]
        name = f"h{idx}"
        nv = g > 1
        nv_net = f"10.{128 + server // 256}.{server % 256}"
        hosts.append(Host(
            name=name, index=idx, server=server, local_rank=rank, leaf=leaf.name, leaf_port=n + 1,
            ip=f"10.0.{li + 1}.{n + 1}/16", mac=_mac(1, li + 1, n + 1),
            nvlink_ip=f"{nv_net}.{rank + 1}/24" if nv else None,
            nvlink_mac=_mac(2, server, rank + 1) if nv else None,
        ))
        links.append(Link("host", name, 0, leaf.name, n + 1, fabric.host_link.rate_bps, fabric.host_link.delay_ns))

    spine_port = {s.name: 0 for s in spines}
    for li, (leaf, spec) in enumerate(zip(leaves, fabric.leaves)):
        for u in range(spec.uplinks.count):
            spine = spines[u % len(spines)]
            spine_port[spine.name] += 1
            links.append(Link("uplink", leaf.name, spec.hosts + u + 1, spine.name, spine_port[spine.name],
                              spec.uplinks.link.rate_bps, spec.uplinks.link.delay_ns))

    servers = []
    for s in range(1, servers_count + 1):
        members = [h for h in hosts if h.server == s]
        bridge = f"nvl{s}" if g > 1 else None
        servers.append(Server(f"server{s}", s, tuple(h.name for h in members), bridge))
        if bridge:
            for h in members:
                links.append(Link("nvlink", h.name, 1, bridge, h.local_rank + 1, fabric.nvlink_rate_bps, 0))

    switches = spines + leaves
    routes = _routes(switches, hosts, links, leaves)
    return Plan(scenario=scenario, dilation=dilation, dilation_reason=reason, switches=tuple(switches),
                hosts=tuple(hosts), servers=tuple(servers), links=tuple(links), routes=tuple(routes))


def _routes(switches, hosts, links, leaves) -> list[Route]:
    """Per switch: /32 to each attached GPU, and per other leaf's /24 every port on a
    shortest path toward that leaf (ECMP)."""
    adj: dict = {s.name: [] for s in switches}  # name -> [(port, neighbour)]
    for link in links:
        if link.kind == "uplink":
            adj[link.a].append((link.a_port, link.b))
            adj[link.b].append((link.b_port, link.a))
    routes = []
    for s in switches:
        for h in hosts:
            if h.leaf == s.name:
                routes.append(Route(s.name, f"{h.addr}/32", (h.leaf_port,)))
    for li, dest in enumerate(leaves):
        dist = {dest.name: 0}
        queue = deque([dest.name])
        while queue:
            u = queue.popleft()
            for _, v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        prefix = f"10.0.{li + 1}.0/24"
        for s in switches:
            if s.name == dest.name or s.name not in dist:
                continue
            ports = tuple(sorted(p for p, v in adj[s.name] if dist.get(v) == dist[s.name] - 1))
            routes.append(Route(s.name, prefix, ports))
    return routes
