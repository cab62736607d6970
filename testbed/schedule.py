"""The training schedule as pure data: which GPU holds which rank, and what each GPU
does, step by step, with real dependencies (no root, no side effects).

Every GPU gets a list of ops; an op starts when the ops it depends on (its own GPU's)
are done. Cross-GPU dependencies are messages: a ``recv`` completes when the peer's
matching ``send`` has arrived in full. Messages between two GPUs are matched in the order
they were planned (one reliable-connected QP per direction delivers in order).

Ring AllReduce of S bytes over n ranks (NCCL's ring, Patarasuk & Yuan 2009): S is cut
into n chunks; in each of n-1 reduce-scatter steps and n-1 all-gather steps every rank
sends one chunk to its right neighbour and receives one from its left; the chunk a rank
sends in step k+1 is the one it received in step k, so that send waits for that receive.
Ideal time: 2(n-1)/n x S / B + 2(n-1) x a, with B the payload rate of a link and a the
per-step latency: the propagation delay of the ring's longest hop where link delay is
emulated, else 0 (the switch queues release a packet as soon as the port rate allows, so
the emulation adds no store-and-forward delay of its own).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import roce
from .traffic import Workload


@dataclass(frozen=True)
class Op:
    id: int
    kind: str  # "compute" | "send" | "recv"
    iteration: int
    phase: str  # "compute" | "allreduce"
    collective: int  # index of the AllReduce (bucket) within the iteration, -1 for compute
    step: int  # ring step (0 .. 2n-3), -1 for compute
    peer: str | None  # GPU name for send/recv
    bytes: int
    duration_ns: int  # compute: real time
    deps: tuple  # op ids of the same GPU


def ranks(workload: Workload, hosts) -> list:
    """GPU names in DP rank order. ``sequential``: h1, h2, ...; ``rail``: the ring walks one
    rail across all servers before moving to the next, so consecutive ranks share a rail leaf;
    a list: exactly that order."""
    if isinstance(workload.mapping, tuple):
        return list(workload.mapping)
    if workload.mapping == "rail":
        hosts = sorted(hosts, key=lambda h: (h.local_rank, h.server))
    return [h.name for h in hosts]


def chunk_sizes(total_bytes: int, n: int) -> list:
    """S cut into n chunks, each a multiple of 4 bytes (RoCE payloads are 4-byte aligned)."""
    words = -(-total_bytes // 4)
    base, extra = divmod(words, n)
    return [4 * (base + (1 if i < extra else 0)) for i in range(n)]


def build(workload: Workload, hosts) -> dict:
    """{gpu name: [Op, ...]} for every GPU of the fabric."""
    order = ranks(workload, hosts)
    n = len(order)
    ops = {name: [] for name in order}

    def add(name, **kw):
        op = Op(id=len(ops[name]), **kw)
        ops[name].append(op)
        return op.id

    last = {name: () for name in order}
    for it in range(workload.iterations):
        for name in order:
            cid = add(name, kind="compute", iteration=it, phase="compute", collective=-1, step=-1, peer=None,
                      bytes=0, duration_ns=workload.compute_ns, deps=last[name])
            last[name] = (cid,)
        for b, size in enumerate(workload.allreduce_bytes):
            chunks = chunk_sizes(size, n)
            for r, name in enumerate(order):
                right, left = order[(r + 1) % n], order[(r - 1) % n]
                prev_recv, ends = None, []
                for step in range(2 * (n - 1)):
                    k = step if step < n - 1 else step - (n - 1)
                    offset = 0 if step < n - 1 else 1  # all-gather sends the chunk it owns reduced
                    send_chunk = chunks[(r - k + offset) % n]
                    recv_chunk = chunks[(r - k - 1 + offset) % n]
                    deps = last[name] if prev_recv is None else (prev_recv,)
                    s = add(name, kind="send", iteration=it, phase="allreduce", collective=b, step=step, peer=right,
                            bytes=send_chunk, duration_ns=0, deps=deps)
                    prev_recv = add(name, kind="recv", iteration=it, phase="allreduce", collective=b, step=step,
                                    peer=left, bytes=recv_chunk, duration_ns=0, deps=last[name])
                    ends += [s, prev_recv]
                last[name] = tuple(ends)
    return ops


def ring_ideal_ns(size_bytes: int, n: int, link_bps: float, mtu_bytes: int, step_latency_ns: float = 0.0) -> float:
    """Ideal ring AllReduce time (real ns) on links of ``link_bps``: 2(n-1)/n x S at the
    link's payload rate (every packet carries ``roce.HEADER_BYTES`` of headers) plus
    2(n-1) x the per-step latency (path propagation)."""
    payload_bps = link_bps * mtu_bytes / roce.wire_bytes(mtu_bytes)
    return 2 * (n - 1) / n * size_bytes * 8 / payload_bps * 1e9 + 2 * (n - 1) * step_latency_ns


def bus_bandwidth_bps(size_bytes: int, n: int, elapsed_ns: float) -> float:
    """nccl-tests: algbw = S / t; busbw = algbw x 2(n-1)/n for AllReduce (bits/s)."""
    return size_bytes * 8 / (elapsed_ns / 1e9) * 2 * (n - 1) / n


def to_json(ops: dict) -> dict:
    return {name: [asdict(op) for op in lst] for name, lst in ops.items()}
