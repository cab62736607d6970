"""The training schedule as pure data: which GPU holds which rank, and what each GPU
does, step by step, with real dependencies (no root, no side effects).

Every GPU gets a list of ops; an op starts when the ops it depends on (its own GPU's)
are done. Cross-GPU dependencies are messages: a ``recv`` completes when the peer's
matching ``send`` has arrived in full. Messages between two GPUs on one link are matched
in the order they were planned (one reliable-connected QP per direction delivers in
order; the agent posts sends and receives of a connection in planned order).

Ranks (Megatron's order): GPUs are taken server by server; ``tensor`` consecutive GPUs of
a server form a tensor-parallel group (NVLink); groups are numbered u = 0, 1, ...; pipeline
stage = u // data, data-parallel rank = u % data. ``mapping`` orders each data-parallel
ring: ``rail`` walks one rail across the servers first (consecutive ranks share a rail
leaf), ``sequential`` keeps GPU order, a list gives the GPU order itself.

Per iteration: without pipelining, forward and backward compute (each followed by a
tensor-parallel AllReduce on NVLink when tensor > 1), then the data-parallel collective
of every gradient bucket. With pipelining (GPipe or 1F1B over ``micro_batches``), each
stage runs its forward/backward per micro-batch, receiving activations from the stage
before and gradients from the stage after, then the data-parallel collective among the
ranks of its stage.
The collectives' analytical ideal and bus bandwidth are in ``collectives``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from testbed.model.collectives import chunk_sizes, collective_ideal_ns
from testbed.errors import ConfigError
from testbed.config.workload import Workload


@dataclass(frozen=True)
class Op:
    id: int
    kind: str  # "compute" | "send" | "recv"
    iteration: int
    phase: str  # "forward" | "backward" | "compute" | "dp" | "tp" | "pp"
    collective: int  # index into the plan's collectives, -1 for compute and pipeline sends
    step: int  # step within the collective, -1 otherwise
    peer: str | None  # GPU name for send/recv
    bytes: int
    duration_ns: int  # compute: real time
    deps: tuple  # op ids of the same GPU
    link: str = "fabric"  # "fabric" | "nvlink"
    micro_batch: int = -1


@dataclass
class Layout:
    order: list  # GPUs in global rank order
    stage: dict  # gpu -> pipeline stage
    dp_rank: dict
    tp_rank: dict
    dp_groups: dict = field(default_factory=dict)  # (stage, tp_rank) -> GPUs in ring order
    tp_groups: dict = field(default_factory=dict)  # (stage, dp_rank) -> GPUs
    chains: dict = field(default_factory=dict)  # (dp_rank, tp_rank) -> GPUs by stage


def layout(workload: Workload, hosts) -> Layout:
    by_name = {h.name: h for h in hosts}
    if isinstance(workload.mapping, tuple):
        order = list(workload.mapping)
    else:
        order = [h.name for h in sorted(hosts, key=lambda h: (h.server, h.local_rank))]
    tp, dp = workload.tensor, workload.data
    lay = Layout(order=order, stage={}, dp_rank={}, tp_rank={})
    for r, name in enumerate(order):
        u, t = divmod(r, tp)
        lay.stage[name], lay.dp_rank[name], lay.tp_rank[name] = u // dp, u % dp, t
        lay.tp_groups.setdefault((u // dp, u % dp), []).append(name)
        lay.dp_groups.setdefault((u // dp, t), []).append(name)
        lay.chains.setdefault((u % dp, t), []).append(name)
    for members in lay.tp_groups.values():
        if len({by_name[m].server for m in members}) > 1:
            raise ConfigError(f"workload.parallelism.tensor: tensor group {', '.join(members)} spans servers; "
                              f"tensor parallelism stays on one server's NVLink (tensor must divide "
                              f"gpus_per_server, and a mapping list must keep each group on one server)")
    if workload.mapping == "rail":
        for members in lay.dp_groups.values():
            members.sort(key=lambda g: (by_name[g].local_rank, by_name[g].server))
    return lay


def ranks(workload: Workload, hosts) -> list:
    """GPU names in data-parallel ring order (the first data-parallel group)."""
    lay = layout(workload, hosts)
    return lay.dp_groups[(0, 0)]


class _Builder:
    """Builds the collectives and the ops of the GPUs in ``members`` (None: every GPU). With
    no members it lists the collectives alone, in time linear in the GPUs: a 1024-GPU ring
    has millions of ops, which only a run needs (and runs are far smaller)."""

    def __init__(self, names, members=None):
        self.ops = {name: [] for name in names}
        self.collectives = []
        self.members = None if members is None else set(members)

    def wants(self, name) -> bool:
        return self.members is None or name in self.members

    def add(self, name, **kw) -> int:
        if not self.wants(name):
            return -1
        op = Op(id=len(self.ops[name]), **kw)
        self.ops[name].append(op)
        return op.id

    def collective(self, **meta) -> int:
        self.collectives.append({"id": len(self.collectives), **meta})
        return len(self.collectives) - 1

    # -- collectives: each takes {gpu: deps} and returns {gpu: end deps} ---------------------
    def ring(self, group, size, deps, it, phase, cid, link, half=None):
        """Ring AllReduce, or one half of it (``half``: "reduce-scatter" | "all-gather")."""
        n = len(group)
        chunks = chunk_sizes(size, n)
        steps = range(2 * (n - 1))
        if half == "reduce-scatter":
            steps = range(n - 1)
        elif half == "all-gather":
            steps = range(n - 1, 2 * (n - 1))
        ends = {}
        for r, name in enumerate(group):
            if not self.wants(name):
                ends[name] = ()
                continue
            right, left = group[(r + 1) % n], group[(r - 1) % n]
            prev_recv, mine = None, []
            for step in steps:
                k, offset = (step, 0) if step < n - 1 else (step - (n - 1), 1)
                s = self.add(name, kind="send", iteration=it, phase=phase, collective=cid, step=step, peer=right,
                             bytes=chunks[(r - k + offset) % n], duration_ns=0,
                             deps=deps[name] if prev_recv is None else (prev_recv,), link=link)
                prev_recv = self.add(name, kind="recv", iteration=it, phase=phase, collective=cid, step=step,
                                     peer=left, bytes=chunks[(r - k - 1 + offset) % n], duration_ns=0,
                                     deps=deps[name], link=link)
                mine += [s, prev_recv]
            ends[name] = tuple(mine)
        return ends

    def halving_doubling(self, group, size, deps, it, phase, cid, link):
        n = len(group)
        rounds = int(math.log2(n))
        ends = {}
        for r, name in enumerate(group):
            if not self.wants(name):
                ends[name] = ()
                continue
            prev, mine, step = None, [], 0
            sizes = [size // 2 ** (i + 1) for i in range(rounds)]
            plan = [(r ^ (1 << (rounds - 1 - i)), sizes[i]) for i in range(rounds)]  # halving
            plan += [(r ^ (1 << i), sizes[rounds - 1 - i]) for i in range(rounds)]  # doubling
            for partner, nbytes in plan:
                nbytes = max(4, nbytes - nbytes % 4)
                s = self.add(name, kind="send", iteration=it, phase=phase, collective=cid, step=step,
                             peer=group[partner], bytes=nbytes, duration_ns=0,
                             deps=deps[name] if prev is None else (prev,), link=link)
                prev = self.add(name, kind="recv", iteration=it, phase=phase, collective=cid, step=step,
                                peer=group[partner], bytes=nbytes, duration_ns=0,
                                deps=deps[name] if prev is None else (prev,), link=link)
                mine += [s, prev]
                step += 1
            ends[name] = tuple(mine)
        return ends

    def all_to_all(self, group, size, deps, it, phase, cid, link):
        n = len(group)
        share = chunk_sizes(size, n)[0]
        ends = {}
        for r, name in enumerate(group):
            if not self.wants(name):
                ends[name] = ()
                continue
            mine = []
            for j in range(1, n):  # staggered so every rank starts on a different peer
                peer = group[(r + j) % n]
                mine.append(self.add(name, kind="send", iteration=it, phase=phase, collective=cid, step=j - 1,
                                     peer=peer, bytes=share, duration_ns=0, deps=deps[name], link=link))
            for j in range(1, n):
                peer = group[(r - j) % n]
                mine.append(self.add(name, kind="recv", iteration=it, phase=phase, collective=cid, step=j - 1,
                                     peer=peer, bytes=share, duration_ns=0, deps=deps[name], link=link))
            ends[name] = tuple(mine)
        return ends

    def data_parallel(self, wl, group, size, deps, it, hosts, meta):
        """One gradient bucket's collective over a data-parallel group."""
        algo = wl.algorithm
        cid = self.collective(iteration=it, phase="dp", algorithm=algo, bytes=size, ranks=len(group),
                              gpus=list(group), **meta)
        if algo == "ring":
            return self.ring(group, size, deps, it, "dp", cid, "fabric")
        if algo in ("reduce-scatter", "all-gather"):
            return self.ring(group, size, deps, it, "dp", cid, "fabric", half=algo)
        if algo == "halving-doubling":
            return self.halving_doubling(group, size, deps, it, "dp", cid, "fabric")
        if algo == "all-to-all":
            return self.all_to_all(group, size, deps, it, "dp", cid, "fabric")
        # hierarchical: NVLink reduce-scatter per server, rail rings across servers, NVLink all-gather
        by_server = {}
        for g in group:
            by_server.setdefault(hosts[g].server, []).append(g)
        servers = [sorted(m, key=lambda g: hosts[g].local_rank) for _, m in sorted(by_server.items())]
        gsize = len(servers[0])
        ends = dict(deps)
        if gsize > 1:
            for members in servers:
                ends.update(self.ring(members, size, {m: ends[m] for m in members}, it, "dp", cid, "nvlink",
                                      half="reduce-scatter"))
        if len(servers) > 1:
            for k in range(gsize):
                rail = [members[k] for members in servers]
                ends.update(self.ring(rail, max(4, size // gsize), {m: ends[m] for m in rail}, it, "dp", cid,
                                      "fabric"))
        if gsize > 1:
            for members in servers:
                ends.update(self.ring(members, size, {m: ends[m] for m in members}, it, "dp", cid, "nvlink",
                                      half="all-gather"))
        return ends


def build(workload: Workload, hosts) -> dict:
    """{gpu name: [Op, ...]} for every GPU of the fabric."""
    return build_plan(workload, hosts)[0]


def build_plan(workload: Workload, hosts, link_bps: float = 0.0, nvlink_bps: float = 0.0,
               latency_ns: float = 0.0, members=None) -> tuple:
    """(ops per GPU, collectives): the collectives list every collective with its group,
    bytes and (when rates are given) analytical ideal. Ops are built for ``members`` only
    (None: every GPU; an empty set: none, the collectives alone)."""
    wl = workload
    hosts_by = {h.name: h for h in hosts}
    lay = layout(wl, hosts)
    b = _Builder(lay.order, members)
    last = {name: () for name in lay.order}
    for it in range(wl.iterations):
        if wl.pipeline == 1:
            for name in lay.order:
                f = b.add(name, kind="compute", iteration=it, phase="forward", collective=-1, step=-1, peer=None,
                          bytes=0, duration_ns=wl.forward_ns, deps=last[name])
                last[name] = (f,)
            last = _tensor_parallel(b, wl, lay, last, it, "forward")
            for name in lay.order:
                bw = b.add(name, kind="compute", iteration=it, phase="backward", collective=-1, step=-1, peer=None,
                           bytes=0, duration_ns=wl.backward_ns, deps=last[name])
                last[name] = (bw,)
            last = _tensor_parallel(b, wl, lay, last, it, "backward")
        else:
            last = _pipeline(b, wl, lay, last, it)
        if wl.data > 1:
            for bucket, size in enumerate(wl.allreduce_bytes):
                for key, group in sorted(lay.dp_groups.items()):
                    ends = b.data_parallel(wl, group, size, {g: last[g] for g in group}, it, hosts_by,
                                           {"bucket": bucket, "stage": key[0], "tp_rank": key[1]})
                    last.update(ends)
    for c in b.collectives:
        if c["algorithm"] == "hierarchical":
            c["per_server"] = c["ranks"] // len({hosts_by[x].server for x in c["gpus"]})
        if link_bps and c["phase"] == "dp":
            g = c.get("per_server", 1)
            c["ideal_ns"] = collective_ideal_ns(c["algorithm"], c["bytes"], c["ranks"], link_bps, wl.mtu_bytes,
                                                latency_ns, nvlink_bps, g)
        elif nvlink_bps and c["phase"] == "tp":
            c["ideal_ns"] = collective_ideal_ns("ring", c["bytes"], c["ranks"], nvlink_bps, wl.mtu_bytes)
    return b.ops, b.collectives


def _tensor_parallel(b: _Builder, wl, lay: Layout, last: dict, it: int, when: str, micro_batch: int = -1,
                     members_only=None) -> dict:
    """Megatron's tensor-parallel AllReduce of activations (forward) or their gradients
    (backward), on the server's NVLink: a ring over each tensor group."""
    if wl.tensor == 1:
        return last
    out = dict(last)
    for key, group in sorted(lay.tp_groups.items()):
        if members_only is not None and group[0] not in members_only:
            continue
        cid = b.collective(iteration=it, phase="tp", algorithm="ring", bytes=wl.tensor_bytes, ranks=len(group),
                           gpus=list(group), when=when, micro_batch=micro_batch)
        out.update(b.ring(group, wl.tensor_bytes, {g: last[g] for g in group}, it, "tp", cid, "nvlink"))
    return out


def pipeline_order(schedule: str, stages: int, stage: int, micro_batches: int) -> list:
    """The order a stage runs its micro-batches: [("F", k) | ("B", k)]. GPipe: every forward,
    then every backward in reverse; 1F1B: (stages - stage - 1) warm-up forwards, then one
    forward / one backward alternately, then the remaining backwards."""
    m = micro_batches
    if schedule == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in reversed(range(m))]
    warm = min(stages - stage - 1, m)
    order = [("F", k) for k in range(warm)]
    f, bk = warm, 0
    while f < m:
        order.append(("F", f))
        f += 1
        order.append(("B", bk))
        bk += 1
    order += [("B", k) for k in range(bk, m)]
    return order


def _pipeline(b: _Builder, wl, lay: Layout, last: dict, it: int) -> dict:
    """One iteration of pipeline-parallel training. The members of a stage's tensor group
    run the same order in lockstep: per micro-batch, receive from the neighbouring stage,
    compute, AllReduce inside the tensor group (NVLink), send to the next stage."""
    out = dict(last)
    stages = wl.pipeline
    for (stage, dp_rank), group in sorted(lay.tp_groups.items()):
        chain_of = {g: lay.chains[(dp_rank, lay.tp_rank[g])] for g in group}
        prev = {g: last[g] for g in group}
        for kind, k in pipeline_order(wl.pipeline_schedule, stages, stage, wl.micro_batches):
            phase = "forward" if kind == "F" else "backward"
            src = stage - 1 if kind == "F" else stage + 1
            dst = stage + 1 if kind == "F" else stage - 1
            for g in group:
                deps = prev[g]
                if 0 <= src < stages:
                    r = b.add(g, kind="recv", iteration=it, phase="pp", collective=-1, step=-1,
                              peer=chain_of[g][src], bytes=wl.pipeline_bytes, duration_ns=0, deps=last[g],
                              micro_batch=k)
                    deps = deps + (r,)
                c = b.add(g, kind="compute", iteration=it, phase=phase, collective=-1, step=-1, peer=None, bytes=0,
                          duration_ns=wl.forward_ns if kind == "F" else wl.backward_ns, deps=deps, micro_batch=k)
                prev[g] = (c,)
            prev = _tensor_parallel(b, wl, lay, prev, it, phase, micro_batch=k, members_only=set(group))
            for g in group:
                if 0 <= dst < stages:
                    b.add(g, kind="send", iteration=it, phase="pp", collective=-1, step=-1, peer=chain_of[g][dst],
                          bytes=wl.pipeline_bytes, duration_ns=0, deps=prev[g], micro_batch=k)
        for g in group:
            # the iteration ends for this GPU when every op it had in it is done
            out[g] = tuple(op.id for op in b.ops[g] if op.iteration == it)
    return out


def to_json(ops: dict) -> dict:
    return {name: [asdict(op) for op in lst] for name, lst in ops.items()}
