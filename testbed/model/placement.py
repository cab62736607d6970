"""Where each part of a planned fabric runs when one run spans several machines (pure).

The unit of placement is a *pod*: leaves with the GPUs (and NVLink bridges) they reach
without a spine, i.e. a connected part of the fabric once the leaf-spine uplinks are
removed. Placing whole pods keeps every GPU link, NVLink and leaf on one machine, so only
spine uplinks can cross machines (and a cross-machine link is the slow, tunnelled one).
Pods go to the machine holding the fewest GPUs so far (largest pod first), spines round
robin: each machine forwards a share of the spine traffic.

A rail-optimised fabric whose servers all reach every rail leaf (``default``, ``rail-32``)
is one pod: its GPUs of one server sit on different rail leaves and share one NVLink, so
splitting it would put an NVLink or a GPU link across machines. ``place`` refuses that with
the pod count rather than cut a link the design says never crosses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from testbed.errors import ConfigError
from testbed.model.plan import Plan


@dataclass(frozen=True)
class Pod:
    leaves: tuple  # leaf switch names
    gpus: tuple  # GPU host names
    nodes: frozenset  # every node of the pod: leaves, GPUs, NVLink bridges


@dataclass(frozen=True)
class Placement:
    machines: tuple  # cluster servers, as given (ssh targets)
    pods: tuple  # Pod
    pod_machine: tuple  # the machine of each pod
    node_machine: dict = field(default_factory=dict)  # every fabric node -> its machine
    cross_links: tuple = ()  # plan Links whose two ends run on different machines

    def gpus_on(self, machine: str) -> int:
        return sum(len(p.gpus) for p, m in zip(self.pods, self.pod_machine) if m == machine)


@dataclass(frozen=True)
class TunnelEnd:
    """One end of a crossing link: the planned switch port, made a tunnel device to the
    machine holding the other end. Both ends carry the link's number as the tunnel key
    (VXLAN VNI or GRE key), so each machine makes its end from the plan alone."""
    intf: str  # the planned interface name (queues, counters and the registry use it)
    switch: str
    port: int
    key: int  # 1 + the link's index in plan.links
    peer: str  # the machine at the other end
    peer_intf: str


@dataclass(frozen=True)
class Share:
    """What one machine runs of a run: its nodes, the links with both ends on it, its
    tunnel ends, the egress queues of its switch ports, and which of those send pause
    frames through a tunnel (a feeder across machines)."""
    machine: str
    switches: tuple
    hosts: tuple
    bridges: tuple
    links: tuple  # plan Links, both ends here
    tunnels: tuple  # TunnelEnd
    queues: tuple  # plan PortQueues of the switches here
    paused_across: tuple  # (queue intf, feeder tunnel intf): its PFC pauses a neighbour on another machine


@dataclass(frozen=True)
class Site:
    """Where this machine's part of a run is, decided once when the run is planned and passed
    to everything bring-up starts: the whole plan (a run on one machine, ``WHOLE``), or one
    cluster ``Share`` with the servers' network (``underlay``: machine -> address, this one's
    included) and the address the controller listens on."""
    share: Share | None = None
    underlay: dict = field(default_factory=dict)
    controller_address: str = "127.0.0.1"

    @property
    def switches(self) -> tuple | None:
        """The switches built here, None for all of the plan's."""
        return None if self.share is None else self.share.switches

    def queues(self, plan: Plan) -> tuple:
        """The egress queues applied here (a share's tunnel ends included)."""
        return tuple(plan.queues) if self.share is None else self.share.queues


WHOLE = Site()


def pods(plan: Plan) -> list[Pod]:
    """The fabric's pods, in the order of their first GPU."""
    parent: dict[str, str] = {}

    def find(n: str) -> str:
        while parent.setdefault(n, n) != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    spines = {s.name for s in plan.switches if s.role == "spine"}
    for node in [s.name for s in plan.switches if s.role == "leaf"] + [h.name for h in plan.hosts]:
        find(node)
    for link in plan.links:
        if link.a in spines or link.b in spines:
            continue
        parent[find(link.a)] = find(link.b)
    groups: dict[str, set] = {}
    for node in list(parent):
        groups.setdefault(find(node), set()).add(node)
    gpu_order = {h.name: h.index for h in plan.hosts}
    leaf_names = {s.name for s in plan.switches if s.role == "leaf"}
    out = [Pod(leaves=tuple(sorted(g & leaf_names)), gpus=tuple(sorted(g & set(gpu_order), key=gpu_order.get)),
               nodes=frozenset(g)) for g in groups.values()]
    return sorted(out, key=lambda p: min((gpu_order[g] for g in p.gpus), default=0))


def parse_machines(text: str, where: str = "--cluster") -> tuple:
    """``SERVER,SERVER,...`` (ssh targets: names or addresses) -> a tuple, checked."""
    machines = tuple(m.strip() for m in text.split(","))
    if not text.strip() or any(not m for m in machines):
        raise ConfigError(f"{where}: expected a comma-separated list of servers such as 10.0.0.1,10.0.0.2, "
                          f"got {text!r}")
    bad = [m for m in machines if any(c.isspace() or c in "'\"`$;|&<>" for c in m) or m.startswith("-")]
    if bad:
        raise ConfigError(f"{where}: {bad[0]!r} is not a host name or address")
    dup = sorted({m for m in machines if machines.count(m) > 1})
    if dup:
        raise ConfigError(f"{where}: {dup[0]} is listed twice; each server runs its share once")
    return machines


def place(plan: Plan, machines: tuple) -> Placement:
    """Whole pods per machine (fewest GPUs first, largest pod first), spines round robin."""
    found = pods(plan)
    if len(found) < len(machines):
        raise ConfigError(
            f"--cluster: {len(machines)} servers but fabric {plan.scenario.fabric.kind} of scenario "
            f"{plan.scenario.name} has {len(found)} pod{'s' if len(found) != 1 else ''} (leaves with the GPUs "
            f"they reach without a spine); only whole pods are placed, so that only spine uplinks cross "
            f"servers. Use at most {len(found)} server{'s' if len(found) != 1 else ''}, or a leaf-spine "
            f"fabric (one pod per leaf); a rail-optimised fabric is one pod, since every server reaches every "
            f"rail leaf and a server's GPUs share one NVLink")
    load = {m: 0 for m in machines}
    pod_machine: dict[int, str] = {}
    for i in sorted(range(len(found)), key=lambda i: (-len(found[i].gpus), i)):
        m = min(machines, key=lambda m: (load[m], machines.index(m)))
        pod_machine[i] = m
        load[m] += len(found[i].gpus)
    node_machine = {n: pod_machine[i] for i, p in enumerate(found) for n in p.nodes}
    spines = sorted((s for s in plan.switches if s.role == "spine"), key=lambda s: s.index)
    node_machine.update({s.name: machines[k % len(machines)] for k, s in enumerate(spines)})
    cross = tuple(link for link in plan.links if node_machine[link.a] != node_machine[link.b])
    return Placement(machines=tuple(machines), pods=tuple(found),
                     pod_machine=tuple(pod_machine[i] for i in range(len(found))),
                     node_machine=node_machine, cross_links=cross)


def shares(plan: Plan, placement: Placement) -> list[Share]:
    """Each machine's share, in the placement's machine order; every node, link and queue
    of the plan is in exactly one share, a crossing link in two (one tunnel end each)."""
    at = placement.node_machine
    ends: dict[str, list] = {m: [] for m in placement.machines}
    for i, link in enumerate(plan.links):
        if at[link.a] != at[link.b]:
            for (node, port, intf), (other, other_intf) in (((link.a, link.a_port, link.a_intf), (link.b, link.b_intf)),
                                                            ((link.b, link.b_port, link.b_intf), (link.a, link.a_intf))):
                ends[at[node]].append(TunnelEnd(intf=intf, switch=node, port=port, key=i + 1, peer=at[other],
                                                peer_intf=other_intf))
    out = []
    for m in placement.machines:
        tunnel_intfs = {t.intf for t in ends[m]}
        queues = tuple(q for q in plan.queues if at[q.switch] == m)
        out.append(Share(
            machine=m, switches=tuple(s.name for s in plan.switches if at[s.name] == m),
            hosts=tuple(h.name for h in plan.hosts if at[h.name] == m),
            bridges=tuple(s.nvlink_bridge for s in plan.servers if s.nvlink_bridge and at[s.nvlink_bridge] == m),
            links=tuple(lk for lk in plan.links if at[lk.a] == at[lk.b] == m), tunnels=tuple(ends[m]),
            queues=queues,
            paused_across=tuple((q.intf, f) for q in queues for f in q.feeders if f in tunnel_intfs)))
    return out


CLOCK_FIELDS = ("t_ns", "ready_ns", "start_ns", "end_ns")  # an agent record's CLOCK_MONOTONIC times


def to_coordinator_clock(text: str, offset_ns: int) -> str:
    """A server's agent records (JSON lines, its CLOCK_MONOTONIC) in the coordinator's clock:
    every time field less the server's measured offset (remote = coordinator + offset), so
    one run folder's records share one time line. Durations and counters are unchanged; a
    line cut short by an interrupted run is kept as it is (the reader skips it)."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if isinstance(record, dict):
            for key in CLOCK_FIELDS:
                if isinstance(record.get(key), int):
                    record[key] -= offset_ns
        out.append(json.dumps(record))
    return "".join(f"{line}\n" for line in out)


def crossing_bytes(plan: Plan, placement: Placement) -> dict:
    """The payload bytes the plan's workload sends from each machine to each other one:
    ``{(from, to): bytes}`` over every send op whose peer is placed on another machine (what
    the tunnels between them must carry, headers and acknowledgements aside)."""
    at = placement.node_machine
    out: dict = {}
    for gpu, ops in (plan.training.ops.items() if plan.training else ()):
        for op in ops:
            if op.kind == "send" and at[op.peer] != at[gpu]:
                key = (at[gpu], at[op.peer])
                out[key] = out.get(key, 0) + op.bytes
    return out


OFFSET_SHARE_OF_MTU = 0.1  # the start-time error a cluster run allows: this share of one MTU's serialisation


def clock_budget_ns(link_bps: float) -> float:
    """The start-time error (emulated ns) a cluster run allows between servers: a tenth of
    one MTU's serialisation on a link of ``link_bps`` (the fastest one: its packets are the
    shortest events an error can reorder)."""
    from testbed.model.queues import MTU_BYTES  # a link's largest frame on the wire

    return OFFSET_SHARE_OF_MTU * MTU_BYTES * 8 / link_bps * 1e9
