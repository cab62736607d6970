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

    def nodes_on(self, machine: str) -> list[str]:
        return sorted(n for n, m in self.node_machine.items() if m == machine)


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
