"""Routing as pure data: each switch's proactive routes (ECMP where several shortest paths
exist), longest-prefix match over them, the shortest paths between two GPUs, and the
fabric's max-flow (bisection bandwidth)."""

from __future__ import annotations

import ipaddress
from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    """On ``switch``, packets to ``prefix`` leave by one of ``ports`` (ECMP when several)."""

    switch: str
    prefix: str
    ports: tuple


def compute(switches, hosts, links, leaves) -> list[Route]:
    """Per switch: /32 to each attached GPU, and per other leaf's /24 every port on a
    shortest path toward that leaf (ECMP).

    Leaves with the same neighbours (every leaf of a leaf-spine, a rail's leaves) share one
    breadth-first search: for such a pair L, R every other switch is as far from L as from
    R, so a switch adjacent to neither has the same shortest-path ports toward both; a
    switch adjacent to the destination routes to it directly; only R itself is looked at
    again. One search per class of leaves instead of per leaf is what keeps a 1000-GPU
    leaf-spine with hundreds of uplinks per leaf in seconds (bench/plan.py)."""
    adj: dict = {s.name: {} for s in switches}  # name -> {neighbour: [port, ...]}
    for link in links:
        if link.kind == "uplink":
            adj[link.a].setdefault(link.b, []).append(link.a_port)
            adj[link.b].setdefault(link.a, []).append(link.b_port)
    order = {s.name: i for i, s in enumerate(switches)}
    names = [s.name for s in switches]
    routes = [Route(h.leaf, f"{h.addr}/32", (h.leaf_port,)) for h in sorted(hosts, key=lambda h: order[h.leaf])]

    def toward(s: str, dist: dict) -> tuple:
        d = dist[s] - 1
        return tuple(sorted(p for v, ports in adj[s].items() if dist.get(v) == d for p in ports))

    def search(root: str) -> dict:
        dist = {root: 0}
        queue = deque([root])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        return dist

    classes: dict = {}  # (neighbours) -> (representative, its distances, its ports per switch)
    direct = {s: {v: tuple(sorted(ports)) for v, ports in adj[s].items()} for s in names}
    for li, dest in enumerate(leaves):
        key = frozenset(adj[dest.name]) or dest.name  # a leaf without neighbours: its own class
        if key not in classes:
            dist = search(dest.name)
            classes[key] = (dest.name, dist, {s: toward(s, dist) for s in names if s != dest.name and s in dist})
        rep, dist_rep, base = classes[key]
        prefix = f"10.0.{li + 1}.0/24"
        if rep == dest.name:
            routes.extend(Route(s, prefix, base[s]) for s in names if s in base)
            continue
        dist = dict(dist_rep)  # L's distances: R's, with L and R swapped
        dist[dest.name], dist[rep] = 0, dist_rep[dest.name]
        for s in names:
            if s == dest.name or s not in dist:
                continue
            if dest.name in adj[s]:
                ports = direct[s][dest.name]
            elif s == rep:  # a switch next to rep is next to dest too (same neighbours)
                ports = toward(s, dist)
            else:
                ports = base[s]
            routes.append(Route(s, prefix, ports))
    return routes


@dataclass(frozen=True)
class Steer:
    """Adaptive routing, one decision table entry: a data packet to ``dst_net`` that leaves
    by ``hop`` (a switch port's interface; None: the NIC of the GPU with address ``src``)
    enters a switch with several shortest-path ports toward it, ``choices`` ((interface,
    OpenFlow port), ...); the hop tags it with the least occupied one (bpf/marker.c)."""

    hop: str | None
    src: str | None
    dst_net: str
    choices: tuple


def adaptive_choices(hosts, links, routes) -> list[Steer]:
    """Every place a packet enters a switch that has an ECMP choice to make: the GPU NICs
    into their leaf, and every fabric port into the switch at its other end. Only /24
    (per-leaf) routes with several ports are choices; a GPU's /32 has one port."""
    multi: dict = {}
    ports = {(r.switch, r.prefix): r.ports for r in routes}
    for r in routes:
        if len(r.ports) > 1 and r.prefix.endswith("/24"):
            multi.setdefault(r.switch, []).append(r)
    out = []

    def entries(hop, src, switch, sender=None, sender_port=None):
        for r in multi.get(switch, ()):
            if sender is not None and sender_port not in ports.get((sender, r.prefix), ()):
                continue  # the sending switch never routes this prefix over this port
            out.append(Steer(hop, src, r.prefix, tuple((f"{switch}-eth{p}", p) for p in sorted(r.ports))))

    for h in hosts:
        entries(None, h.addr, h.leaf)
    for link in links:
        if link.kind == "uplink":
            entries(f"{link.a}-eth{link.a_port}", None, link.b, link.a, link.a_port)
            entries(f"{link.b}-eth{link.b_port}", None, link.a, link.b, link.b_port)
    return out


class Table:
    """Longest-prefix match over every switch's routes, with the prefixes as integers (a
    plan of a thousand GPUs asks it millions of times)."""

    def __init__(self, routes):
        self.by_switch: dict[str, dict[int, dict[int, tuple]]] = {}
        for r in routes:
            net = ipaddress.ip_network(r.prefix)
            self.by_switch.setdefault(r.switch, {}).setdefault(net.prefixlen, {})[int(net.network_address)] = r.ports
        self.lengths = {sw: sorted(by_len, reverse=True) for sw, by_len in self.by_switch.items()}

    def ports(self, switch: str, addr: str | int) -> tuple:
        """The ports of ``switch`` toward ``addr`` (empty: no route)."""
        ip = int(ipaddress.ip_address(addr)) if isinstance(addr, str) else addr
        by_len = self.by_switch.get(switch)
        if not by_len:
            return ()
        for length in self.lengths[switch]:
            ports = by_len[length].get(ip & (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF)
            if ports is not None:
                return ports
        return ()


def lookup(routes, addr: str) -> tuple:
    """Longest-prefix match over one switch's routes: the ports toward ``addr``."""
    ip = ipaddress.ip_address(addr)
    best = None
    for r in routes:
        net = ipaddress.ip_network(r.prefix)
        if ip in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, r.ports)
    return best[1] if best else ()


def neighbours(fabric_links) -> dict:
    """(node, port) -> the node at the other end of that port's link."""
    by_port = {}
    for link in fabric_links:
        by_port[(link.a, link.a_port)] = link.b
        by_port[(link.b, link.b_port)] = link.a
    return by_port


def paths(table: Table, fabric_links, src, dst, max_hops: int, limit: int = 64) -> list:
    """All shortest fabric paths from GPU ``src`` to GPU ``dst`` (plan Hosts) following the
    routes, each a list of (node, out_interface) hops ending with (dst, None)."""
    if src.name == dst.name:
        return []
    by_port = neighbours(fabric_links)
    found = []

    def walk(node, hops):
        if len(found) >= limit:
            return
        if node == dst.name:
            found.append(hops + [(node, None)])
            return
        if len(hops) > max_hops:
            raise AssertionError(f"routing loop from {src.name} to {dst.name}: {hops}")
        for port in table.ports(node, dst.addr):
            walk(by_port[(node, port)], hops + [(node, f"{node}-eth{port}")])

    walk(src.leaf, [(src.name, f"{src.name}-eth0")])
    return found


def ecmp_shares(table: Table, fabric_links, hosts) -> tuple[dict, dict]:
    """Every ordered GPU pair sending one packet, split evenly over the ports of each
    switch's route at each hop (what hashing does on average): (expected packets per switch
    egress interface, switches crossed per pair). Per destination, each node's share of a
    packet on every port below it is computed once and shared by all sources behind it: no
    path is enumerated (all pairs' paths at 128 GPUs took ~1.6 s)."""
    by_port = neighbours(fabric_links)
    load: dict = defaultdict(float)
    switches: dict = {}
    for dst in hosts:
        below: dict = {dst.name: ({}, 0)}  # node -> (share per egress interface, switches to dst)

        def down(node, depth=0):
            if node not in below:
                if depth > len(by_port):
                    raise AssertionError(f"routing loop toward {dst.name} at {node}")
                ports = table.ports(node, dst.addr)
                if not ports:
                    raise AssertionError(f"no route toward {dst.name} at {node}")
                share: dict = defaultdict(float)
                for port in ports:
                    share[f"{node}-eth{port}"] += 1 / len(ports)
                    for intf, v in down(by_port[(node, port)], depth + 1)[0].items():
                        share[intf] += v / len(ports)
                below[node] = (share, 1 + down(by_port[(node, ports[0])], depth + 1)[1])
            return below[node]

        senders = defaultdict(int)
        for src in hosts:
            if src.name != dst.name:
                senders[src.leaf] += 1
                switches[(src.name, dst.name)] = down(src.leaf)[1]
        for leaf, n in senders.items():
            for intf, v in down(leaf)[0].items():
                load[intf] += n * v
    return dict(load), switches


def max_flow(links, sources, sinks) -> int:
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
