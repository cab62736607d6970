"""A Chakra trace as the training schedule: the same ``schedule.Op`` lists and collectives
list a native workload builds, so agents, analysis and report see no difference (pure data).

Ranks map to GPUs the way a native data-parallel ring does (``workload.mapping``: rank r on
the r-th GPU of the first data-parallel group: ``sequential`` in GPU order, ``rail`` rail by
rail, or a list). Per rank, nodes are taken in dependency order:
- a compute node is a timed compute op (``duration_micros``, real time);
- the k-th collective of a process group on each of its ranks is one collective: ring
  AllReduce, ring reduce-scatter or all-gather (``comm_size`` is the whole buffer, n chunks,
  as nccl-tests counts it), all-to-all, or a pipelined chain broadcast from the group's first
  rank; on NVLink when every member is on one server, else on the fabric. Members must agree
  on the type and size;
- a send / recv is a point-to-point message (NVLink inside a server); a rank's sends to
  a peer and the peer's receives from it are matched in order and must agree in size;
- a node waits for its data and control dependencies; a node without any waits for the
  previous iteration's last nodes on its GPU (those nothing depends on; ``iterations``
  repeats the trace).

The ideal of one iteration is the trace's critical path across ranks: compute at its
duration, a collective at its analytical ideal once its last member is ready, a message at
the link's payload rate plus propagation; the path's time is split into compute, NVLink
and fabric communication (the ``ideal`` entries a native workload fills from its phases).
"""

from __future__ import annotations

from testbed.model import schedule
from testbed.model.collectives import chunk_sizes, collective_ideal_ns, payload_bps
from testbed.wire.chakra import TraceError

ALGORITHM = {"all-reduce": "ring", "reduce-scatter": "reduce-scatter", "all-gather": "all-gather",
             "all-to-all": "all-to-all", "broadcast": "broadcast"}


def gpus_of_ranks(workload, hosts) -> list:
    """Rank r -> GPU name."""
    return schedule.ranks(workload, hosts)


class _Replay(schedule._Builder):
    def broadcast(self, group, size, deps, it, phase, cid, link):
        """Pipelined chain from group[0]: the buffer in n chunks, each forwarded as soon as it
        arrived (what NCCL's ring broadcast does)."""
        n = len(group)
        chunks = chunk_sizes(size, n)
        ends = {}
        for i, name in enumerate(group):
            if not self.wants(name):
                ends[name] = ()
                continue
            mine, got = [], None
            for j, nbytes in enumerate(chunks):
                if i > 0:
                    got = self.add(name, kind="recv", iteration=it, phase=phase, collective=cid, step=j,
                                   peer=group[i - 1], bytes=nbytes, duration_ns=0, deps=deps[name], link=link)
                    mine.append(got)
                if i < n - 1:
                    mine.append(self.add(name, kind="send", iteration=it, phase=phase, collective=cid, step=j,
                                         peer=group[i + 1], bytes=nbytes, duration_ns=0,
                                         deps=deps[name] if got is None else (got,), link=link))
            ends[name] = tuple(mine)
        return ends


def build_plan(workload, hosts, link_bps: float = 0.0, nvlink_bps: float = 0.0, latency_ns: float = 0.0,
               members=None) -> tuple:
    """(ops per GPU, collectives, ideal of one iteration in real ns), like
    ``schedule.build_plan``."""
    trace = workload.chakra
    gpu = gpus_of_ranks(workload, hosts)
    server = {h.name: h.server for h in hosts}
    b = _Replay(gpu, members)
    last = {g: () for g in gpu}
    ideal = None
    mtu = workload.mtu_bytes
    for it in range(workload.iterations):
        step = _Iteration(b, trace, gpu, server, it, last, link_bps, nvlink_bps, latency_ns, mtu)
        step.run()
        ideal = ideal or {"iteration_ns": step.span[0], "compute_ns": step.span[1], "tensor_parallel_ns": step.span[2],
                          "data_parallel_ns": step.span[3]}
        last = step.sink_ends()
    for c in b.collectives:
        rate = nvlink_bps if c["link"] == "nvlink" else link_bps
        if rate:
            c["ideal_ns"] = ideal_of(c, rate, mtu, 0.0 if c["link"] == "nvlink" else latency_ns)
    return b.ops, b.collectives, ideal


def ideal_of(c: dict, rate_bps: float, mtu: int, latency_ns: float) -> float:
    return collective_ideal_ns(c["algorithm"], c["bytes"], c["ranks"], rate_bps, mtu, latency_ns)


class _Iteration:
    """One pass over the trace: ops added to the builder, collectives matched across ranks,
    and the critical path's length (``span_ns``) worked out alongside."""

    def __init__(self, b, trace, gpu, server, it, last, link_bps, nvlink_bps, latency_ns, mtu):
        self.b, self.trace, self.gpu, self.server, self.it, self.last = b, trace, gpu, server, it, last
        self.rates = {"fabric": link_bps, "nvlink": nvlink_bps}
        self.latency = {"fabric": latency_ns, "nvlink": 0.0}
        self.mtu = mtu
        self.ends = {}  # (rank, node id) -> op ids ending it
        # ideal finish times: (t, compute, NVLink, fabric) along the path that sets t
        self.done_ns = {}  # (rank, node id) -> finish
        self.sent_ns = {}  # (src, dst) -> finishes of its sends, in order
        self.recv_count = {}
        self.span = (0.0, 0.0, 0.0, 0.0)

    def _link(self, gpus) -> str:
        return "nvlink" if len({self.server[g] for g in gpus}) == 1 else "fabric"

    def _transfer_ns(self, nbytes: int, link: str) -> float:
        rate = self.rates[link]
        return nbytes * 8 / payload_bps(rate, self.mtu) * 1e9 + self.latency[link] if rate else 0.0

    @staticmethod
    def _plus(t: tuple, ns: float, part: int) -> tuple:
        out = list(t)
        out[0] += ns
        out[part] += ns
        return tuple(out)

    def _deps(self, r: int, node) -> tuple:
        if not node.deps:
            return self.last[self.gpu[r]], (0.0, 0.0, 0.0, 0.0)
        ops = tuple(o for d in node.deps for o in self.ends[(r, d)])
        return tuple(dict.fromkeys(ops)), max(self.done_ns[(r, d)] for d in node.deps)

    def _finish(self, r, node, ops, t: tuple):
        self.ends[(r, node.id)] = ops
        self.done_ns[(r, node.id)] = t
        self.span = max(self.span, t)

    def sink_ends(self) -> dict:
        """GPU -> the ops ending its nodes no other node depends on: where the next
        iteration's first nodes start."""
        out = {}
        for rt in self.trace.ranks:
            needed = {d for node in rt.nodes for d in node.deps}
            ops = [o for node in rt.nodes if node.id not in needed for o in self.ends[(rt.rank, node.id)]]
            out[self.gpu[rt.rank]] = tuple(dict.fromkeys(ops))
        return out

    def run(self):
        trace, n = self.trace, len(self.trace.ranks)
        pos = [0] * n
        seen = [{} for _ in range(n)]  # rank -> {group: collectives passed}
        waiting = {}  # (group, k) -> {rank: node}
        while any(pos[r] < len(trace.ranks[r].nodes) for r in range(n)):
            moved = False
            for r in range(n):
                nodes = trace.ranks[r].nodes
                while pos[r] < len(nodes):
                    node = nodes[pos[r]]
                    if node.kind == "collective":
                        k = seen[r].get(node.group, 0)
                        members = waiting.setdefault((node.group, k), {})
                        if r in members:
                            break  # already waiting for the other members
                        members[r] = node
                        group = trace.group(node.group)
                        if len(members) < len(group):
                            break
                        self._collective(group, members, pos, seen)
                        del waiting[(node.group, k)]
                        moved = True
                        continue
                    if node.kind == "recv" and len(self.sent_ns.get((node.peer, r), ())) <= \
                            self.recv_count.get((node.peer, r), 0):
                        break  # its send has not been reached yet (for the ideal's arrival time)
                    self._local(r, node)
                    pos[r] += 1
                    moved = True
            if not moved:
                raise self._stuck(waiting, pos)

    def _local(self, r: int, node):
        g = self.gpu[r]
        deps, t = self._deps(r, node)
        common = dict(iteration=self.it, collective=-1, step=-1, deps=deps)
        if node.kind == "compute":
            op = self.b.add(g, kind="compute", phase="compute", peer=None, bytes=0, duration_ns=node.duration_ns,
                            **common)
            self._finish(r, node, (op,) if op >= 0 else (), self._plus(t, node.duration_ns, 1))
        elif node.kind == "metadata":
            self._finish(r, node, deps, t)
        else:
            peer = self.gpu[node.peer]
            link = self._link((g, peer))
            op = self.b.add(g, kind=node.kind, phase="pp", peer=peer, bytes=node.bytes, duration_ns=0, link=link,
                            **common)
            if node.kind == "send":
                t = self._plus(t, self._transfer_ns(node.bytes, link), 2 if link == "nvlink" else 3)
                self.sent_ns.setdefault((r, node.peer), []).append(t)
            else:
                key = (node.peer, r)
                k = self.recv_count.get(key, 0)
                self.recv_count[key] = k + 1
                t = max(t, self.sent_ns[key][k])
            self._finish(r, node, (op,) if op >= 0 else (), t)

    def _collective(self, group: tuple, members: dict, pos: list, seen: list):
        first_rank = group[0]
        ref = members[first_rank]
        for r in group:
            node = members[r]
            if (node.collective, node.bytes) != (ref.collective, ref.bytes):
                rt, rt0 = self.trace.ranks[r], self.trace.ranks[first_rank]
                raise TraceError(f"{rt.file}: node {node.id}: {node.collective} of {node.bytes} bytes, but the "
                                 f"matching collective of process group {node.group or '(all ranks)'} on rank "
                                 f"{first_rank} ({rt0.file} node {ref.id}) is {ref.collective} of {ref.bytes} bytes")
        gpus = [self.gpu[r] for r in group]
        link = self._link(gpus)
        phase = "tp" if link == "nvlink" else "dp"
        algorithm = ALGORITHM[ref.collective]
        deps, start = {}, (0.0, 0.0, 0.0, 0.0)
        for r in group:
            deps[self.gpu[r]], t = self._deps(r, members[r])
            start = max(start, t)
        cid = self.b.collective(iteration=self.it, phase=phase, algorithm=algorithm, bytes=ref.bytes,
                                ranks=len(group), gpus=gpus, link=link, node=ref.id, name=ref.name,
                                group=ref.group or "(all ranks)")
        if algorithm == "ring":
            ends = self.b.ring(gpus, ref.bytes, deps, self.it, phase, cid, link)
        elif algorithm in ("reduce-scatter", "all-gather"):
            ends = self.b.ring(gpus, ref.bytes, deps, self.it, phase, cid, link, half=algorithm)
        elif algorithm == "all-to-all":
            ends = self.b.all_to_all(gpus, ref.bytes, deps, self.it, phase, cid, link)
        else:
            ends = self.b.broadcast(gpus, ref.bytes, deps, self.it, phase, cid, link)
        rate = self.rates[link]
        took = ideal_of({"algorithm": algorithm, "bytes": ref.bytes, "ranks": len(group)}, rate, self.mtu,
                        self.latency[link]) if rate else 0.0
        for r in group:
            self._finish(r, members[r], ends[self.gpu[r]], self._plus(start, took, 2 if link == "nvlink" else 3))
            seen[r][ref.group] = seen[r].get(ref.group, 0) + 1
            pos[r] += 1

    def _stuck(self, waiting: dict, pos: list) -> TraceError:
        """No rank can go on: a collective some members never reach, or a receive whose send
        comes after it."""
        for (group, k), members in sorted(waiting.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            missing = [r for r in self.trace.group(group) if r not in members]
            r0 = min(members)
            node = members[r0]
            rt = self.trace.ranks[r0]
            other = self.trace.ranks[missing[0]]
            at = other.nodes[pos[missing[0]]] if pos[missing[0]] < len(other.nodes) else None
            where = f"node {at.id} ({at.kind})" if at is not None else "its end"
            return TraceError(f"{rt.file}: node {node.id}: collective {k + 1} of process group "
                              f"{group or '(all ranks)'} is never reached by rank {missing[0]} ({other.file} stops "
                              f"at {where}): the ranks' collectives do not match in order")
        r = next(r for r in range(len(pos)) if pos[r] < len(self.trace.ranks[r].nodes))
        rt = self.trace.ranks[r]
        node = rt.nodes[pos[r]]
        return TraceError(f"{rt.file}: node {node.id}: waits for a message from rank {node.peer} that is sent only "
                          f"after it (a cycle across ranks)")
