"""The training part of the run plan: each GPU's ops, the collectives with their analytical
ideal, the ranks, and the transport settings every agent runs with (pure data).

``schedule`` decides what each GPU does; this module fixes it for one fabric: the link
rates the ideal is computed at, the propagation the ideal counts when cable delay is
emulated, and the ideal of one whole iteration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property, partial

from testbed.config.workload import BALANCE_DEFAULTS
from testbed.model import replay, schedule
from testbed.wire import roce

RTO_REAL_NS = 128_000  # RoCE retransmission timeout in real time (x dilation in the emulation)


@dataclass(frozen=True)
class Transport:
    """What every agent of a run runs with (``plan.json``'s ``training.transport``): the RDMA
    MTU, DCQCN and its parameters, the RTO, the NICs' line rates, how a connection spreads
    over the paths (defaults: ``config.workload.BALANCE_DEFAULTS``), trimming, and the base
    RTT and store-and-forward time UET's congestion control starts from."""

    mtu_bytes: int
    dcqcn: bool
    dcqcn_params: dict
    rto_ns: int
    fabric_line_bps: float
    nvlink_line_bps: float
    kind: str = BALANCE_DEFAULTS["kind"]
    qps_per_connection: int = BALANCE_DEFAULTS["qps_per_connection"]
    load_balancing: str = BALANCE_DEFAULTS["load_balancing"]
    spray_packets: int = BALANCE_DEFAULTS["spray_packets"]
    flowlet_gap_ns: int = BALANCE_DEFAULTS["flowlet_gap_ns"]
    trim: bool = False
    base_rtt_ns: float = 0.0
    store_and_forward_ns: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Transport":
        return cls(**d)


@dataclass(frozen=True)
class TrainingPlan:
    collectives: tuple  # dicts: id, iteration, phase, algorithm, bytes, ranks, gpus, ideal_ns, ...
    ideal: dict  # one iteration's analytical ideal, real ns, and what it is made of
    ranks: dict  # GPU name -> {"rank", "stage", "dp", "tp"}
    transport: Transport  # what every agent runs with
    iterations: int
    expand: object = field(repr=False, compare=False, default=None)  # members (None: all) -> ops per GPU
    jobs: dict = field(default_factory=dict)  # several jobs: name -> {gpus, start_ns, iterations, ideal}

    @cached_property
    def ops(self) -> dict:
        """GPU name -> tuple of schedule.Op: built when first asked for (a run, a digest), never
        by ``show`` of a large fabric, where a ring has millions of them."""
        return self.expand(None)

    def ops_of(self, members) -> dict:
        """The ops of some GPUs only (the others' lists are empty)."""
        return self.expand(set(members))

    def to_dict(self) -> dict:
        return {"iterations": self.iterations, "ideal": self.ideal, "transport": self.transport.to_dict(),
                "ranks": self.ranks, "collectives": list(self.collectives), "ops": schedule.to_json(self.ops),
                "jobs": self.jobs}


def plan_training(plan, workload, table, hosts=None) -> TrainingPlan:
    """The schedule of ``workload`` on ``plan``'s GPUs (or on ``hosts``, a job's); ``table``
    is the plan's route table."""
    hosts = plan.hosts if hosts is None else hosts
    link_bps = plan.scenario.fabric.host_link.rate_bps
    nvlink_bps = plan.scenario.fabric.nvlink_rate_bps
    lay = schedule.layout(workload, hosts)
    latency_ns = 0
    if plan.link_delay:
        ring = workload.algorithm == "ring"
        latency_ns = (ring_step_propagation_ns if ring else max_ring_propagation_ns)(plan, lay.dp_groups[(0, 0)], table)
    if workload.chakra is not None:
        build = partial(_replay, workload, hosts, link_bps, nvlink_bps, latency_ns)
        _, collectives, path = replay.build_plan(workload, hosts, link_bps, nvlink_bps, latency_ns, members=())
        iteration_ideal = {"link_bps": link_bps, "step_latency_ns": latency_ns, **path}
    else:
        build = partial(schedule.build_plan, workload, hosts, link_bps, nvlink_bps, latency_ns)
        _, collectives = build(members=())
        iteration_ideal = ideal(workload, collectives, link_bps, latency_ns)
    ranks = {name: {"rank": r, "stage": lay.stage[name], "dp": lay.dp_rank[name], "tp": lay.tp_rank[name]}
             for r, name in enumerate(lay.order)}
    if workload.chakra is not None:  # the trace's rank on each GPU (the roles are the trace's own)
        trace_rank = {name: r for r, name in enumerate(replay.gpus_of_ranks(workload, hosts))}
        ranks = {name: {"rank": trace_rank[name], "stage": 0, "dp": trace_rank[name], "tp": 0} for name in lay.order}
    transport = Transport(mtu_bytes=workload.mtu_bytes, dcqcn=workload.dcqcn,
                          dcqcn_params=dict(workload.dcqcn_params), rto_ns=RTO_REAL_NS,
                          fabric_line_bps=link_bps, nvlink_line_bps=nvlink_bps,
                          qps_per_connection=workload.qps_per_connection, load_balancing=workload.load_balancing,
                          spray_packets=workload.spray_packets, flowlet_gap_ns=workload.flowlet_gap_ns,
                          kind=workload.kind, trim=plan.scenario.queues.trim,
                          base_rtt_ns=base_rtt_ns(plan, workload.mtu_bytes),
                          store_and_forward_ns=store_and_forward_ns(plan, workload.mtu_bytes))
    return TrainingPlan(collectives=tuple(collectives), ideal=iteration_ideal,
                        ranks=ranks, transport=transport, iterations=workload.iterations,
                        expand=partial(_expand, build))


def _replay(workload, hosts, link_bps, nvlink_bps, latency_ns, members=None) -> tuple:
    ops, collectives, _ = replay.build_plan(workload, hosts, link_bps, nvlink_bps, latency_ns, members=members)
    return ops, collectives


def _expand(build, members) -> dict:
    return {gpu: tuple(ops) for gpu, ops in build(members=members)[0].items()}


def ideal(workload, collectives, link_bps: float, latency_ns: float) -> dict:
    """Real-time ideal of one iteration without overlap: the compute on the critical path
    (for a pipeline, (micro-batches + stages - 1) forward/backward slots: the GPipe/1F1B
    bubble), the tensor-parallel AllReduces of one rank, and one data-parallel group's
    collectives."""
    wl = workload
    first = [c for c in collectives if c["iteration"] == 0]
    dp = [c["ideal_ns"] for c in first if c["phase"] == "dp" and c.get("stage", 0) == 0
          and c.get("tp_rank", 0) == 0]
    if wl.pipeline > 1:
        compute = (wl.micro_batches + wl.pipeline - 1) * wl.compute_ns
        tp_count = 2 * wl.micro_batches
    else:
        compute, tp_count = wl.compute_ns, 2
    tp = [c["ideal_ns"] for c in first if c["phase"] == "tp"][:1] * tp_count if wl.tensor > 1 else []
    return {"link_bps": link_bps, "step_latency_ns": latency_ns, "compute_ns": compute,
            "tensor_parallel_ns": sum(tp), "data_parallel_ns": sum(dp),
            "iteration_ns": compute + sum(tp) + sum(dp)}


def store_and_forward_ns(plan, mtu_bytes: int) -> float:
    """An MTU packet's serialisation at every hop of the fabric's longest path, and its SACK's
    on the way back: what a real fabric's round trip holds and the emulated one lacks (a
    token-bucket shaper sets a port's rate, not the store-and-forward latency of a packet)."""
    links = plan.fabric_links
    hops = 4 if any(link.kind == "uplink" for link in links) else 2  # GPU, leaf, (spine, leaf), GPU
    rate = min(link.rate_bps for link in links)
    return hops * (roce.wire_bytes(mtu_bytes) + roce.HEADER_BYTES + roce.SACK.size) * 8 / rate * 1e9


def base_rtt_ns(plan, mtu_bytes: int) -> float:
    """UET's config_base_rtt (3.6.13.3): the round trip of an MTU packet over the fabric's
    longest path with no other traffic: serialisation at every hop both ways (the data
    packet out, a SACK back) plus, where cable delay is emulated, propagation."""
    links = plan.fabric_links
    spines = any(link.kind == "uplink" for link in links)
    serialise = store_and_forward_ns(plan, mtu_bytes)
    if not plan.link_delay:
        return serialise
    delay = {kind: max((link.delay_ns for link in links if link.kind == kind), default=0) for kind in ("host", "uplink")}
    one_way = 2 * delay["host"] + (2 * delay["uplink"] if spines else 0)
    return serialise + 2 * one_way


def hop_propagation_ns(plan, order: list, table) -> list:
    """Cable delay from each GPU of a data-parallel ring to the next (0 for a ring of one)."""
    delay = {frozenset((link.a, link.b)): link.delay_ns for link in plan.fabric_links}
    out = []
    for i, a in enumerate(order):
        b = order[(i + 1) % len(order)]
        if b == a:
            out.append(0)
            continue
        names = [hop[0] for hop in plan.ecmp_paths(a, b, limit=1, table=table)[0]]
        out.append(sum(delay.get(frozenset(pair), 0) for pair in zip(names, names[1:])))
    return out


def max_ring_propagation_ns(plan, order: list, table) -> int:
    """Cable delay along the longest path between neighbours of a data-parallel ring (the
    per-step latency of the algorithms other than the ring: a bound, not a chain)."""
    return max(hop_propagation_ns(plan, order, table))


def ring_step_propagation_ns(plan, order: list, table) -> float:
    """A ring AllReduce's cable delay per step. GPU i's step-s send forwards what it received
    from GPU i-1 in step s-1, so the last of the 2(n-1) steps to finish at GPU j has waited
    for the 2(n-1) hops before it around the ring, each with its own delay, not 2(n-1) times
    the longest (on the default rail ring, hops of 30 ns and 1030 ns alternate: 7.4 us in
    all, not 14.4). The worst such chain over the GPUs, per step."""
    hops = hop_propagation_ns(plan, order, table)
    n = len(hops)
    steps = 2 * (n - 1)
    if steps == 0:
        return 0.0
    return max(sum(hops[(j - 1 - k) % n] for k in range(steps)) for j in range(n)) / steps



