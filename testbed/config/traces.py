"""A Chakra execution trace as plain data, read and checked for what a replay needs (no
root): input the user gives, checked with the rest of the scenario (config stage), before
``model.replay`` turns it into the schedule.

A trace is one file per rank, ``PREFIX.<rank>.et`` (ranks 0 .. n-1, none missing), and
optionally a communicator-group file (ASTRA-sim's ``comm_group`` JSON: ``{"pg name":
[rank, ...]}``) naming the ranks of each process group a collective's ``pg_name`` attribute
refers to; ``PREFIX.groups.json`` is read when it exists and no other file is given.

What a node must hold (the attributes ASTRA-sim's ETFeeder reads):
- ``COMP_NODE``: ``duration_micros`` (the compute's time; a node without it is 0 us);
- ``COMM_COLL_NODE``: ``comm_type`` (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL or
  BROADCAST), ``comm_size`` (bytes, > 0) and optionally ``pg_name`` (the whole job when
  absent);
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_dst`` / ``comm_src`` (a rank),
  ``comm_size`` and optionally ``comm_tag``;
- ``METADATA_NODE``: nothing (skipped, its dependants wait on what it waits on).
Dependencies are ``data_deps`` and ``ctrl_deps`` alike (a node starts when both are done);
they refer to nodes of the same rank, and form no cycle. Anything else is one TraceError
line naming the file and the node id.
"""

from __future__ import annotations

import glob
import heapq
import json
from dataclasses import dataclass
from pathlib import Path

from testbed.paths import TRAFFIC_DIR
from testbed.wire import chakra
from testbed.wire.chakra import TraceError

MAX_RANKS = 4096
MAX_NODES = 1_000_000  # per rank
COLLECTIVES = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
               "ALL_TO_ALL": "all-to-all", "BROADCAST": "broadcast"}
KINDS = {"COMP_NODE": "compute", "COMM_COLL_NODE": "collective", "COMM_SEND_NODE": "send",
         "COMM_RECV_NODE": "recv", "METADATA_NODE": "metadata"}


@dataclass(frozen=True)
class TraceNode:
    id: int
    name: str
    kind: str  # compute | collective | send | recv | metadata
    deps: tuple  # node ids of the same rank (data and control)
    duration_ns: int = 0  # compute
    collective: str = ""  # all-reduce | all-gather | reduce-scatter | all-to-all | broadcast
    bytes: int = 0
    peer: int = -1  # send: comm_dst, recv: comm_src
    tag: int = 0
    group: str = ""  # pg_name ("" : every rank)


@dataclass(frozen=True)
class RankTrace:
    rank: int
    file: str  # as messages name it
    version: str
    nodes: tuple  # TraceNode in an order that respects the dependencies (ties by id)


@dataclass(frozen=True)
class Trace:
    prefix: str
    ranks: tuple  # RankTrace by rank
    groups: tuple  # ((pg name, (ranks...)), ...)
    groups_file: str = ""

    def group(self, name: str) -> tuple:
        return dict(self.groups).get(name, tuple(range(len(self.ranks)))) if name else tuple(range(len(self.ranks)))


def resolve_prefix(prefix: str) -> Path:
    """A trace prefix as written: absolute, or relative to the current folder, or to the
    repository's traffic/ folder (where shipped traces live)."""
    p = Path(prefix)
    if p.is_absolute():
        return p
    for base in (Path.cwd(), TRAFFIC_DIR):
        if (base / f"{prefix}.0.et").is_file():
            return base / p
    return p


def rank_files(prefix: str) -> list:
    """``PREFIX.0.et`` .. ``PREFIX.<n-1>.et``; a gap or no file at all is a TraceError."""
    if "\0" in prefix or len(prefix) > 4096:
        raise TraceError(f"{prefix[:80]!r}: not a path prefix")
    base = resolve_prefix(prefix)
    folder = base.parent
    found = {}
    stem = base.name + "."
    for path in folder.glob(f"{glob.escape(base.name)}.*.et") if folder.is_dir() else ():
        middle = path.name[len(stem):-3]
        if middle.isdigit():
            found[int(middle)] = path
    if not found:
        raise TraceError(f"{prefix}.0.et: no such file (a trace is one file per rank, PREFIX.<rank>.et)")
    if len(found) > MAX_RANKS:
        raise TraceError(f"{prefix}: {len(found)} rank files (this replays at most {MAX_RANKS})")
    for r in range(max(found) + 1):
        if r not in found:
            raise TraceError(f"{prefix}.{r}.et: rank file missing (found ranks {_ranges(sorted(found))})")
    return [found[r] for r in range(len(found))]


def _ranges(values: list) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}..{v}")
            start = None
    return ", ".join(out)


def load(prefix: str, groups_file: str | None = None) -> Trace:
    """Every rank's file read and checked (see the module docstring)."""
    paths = rank_files(prefix)
    n = len(paths)
    ranks = []
    for r, path in enumerate(paths):
        label = _label(path)
        try:
            if path.stat().st_size > chakra.MAX_FILE_BYTES:
                raise TraceError(f"{label}: {path.stat().st_size} bytes: more than this replays "
                                 f"({chakra.MAX_FILE_BYTES})")
            raw = path.read_bytes()
        except OSError as exc:
            raise TraceError(f"{label}: cannot read: {exc.strerror}") from None
        meta, nodes = chakra.decode_stream(raw, label)
        ranks.append(RankTrace(rank=r, file=label, version=meta.version, nodes=_check_rank(nodes, label, n)))
    groups, gfile = _groups(prefix, groups_file, n)
    trace = Trace(prefix=prefix, ranks=tuple(ranks), groups=groups, groups_file=gfile)
    for rt in trace.ranks:
        for node in rt.nodes:
            if node.kind == "collective":
                if node.group and node.group not in dict(groups):
                    raise TraceError(f"{rt.file}: node {node.id}: pg_name {node.group!r} is not in "
                                     f"{gfile or 'a communicator-group file (none given)'}")
                if rt.rank not in trace.group(node.group):
                    raise TraceError(f"{rt.file}: node {node.id}: rank {rt.rank} is not a member of its "
                                     f"process group {node.group!r} ({gfile})")
    return trace


def _label(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _groups(prefix: str, groups_file: str | None, n: int) -> tuple:
    if groups_file is None:
        default = Path(f"{resolve_prefix(prefix)}.groups.json")
        if not default.is_file():
            return (), ""
        path = default
    else:
        if "\0" in groups_file or len(groups_file) > 4096:
            raise TraceError(f"{groups_file[:80]!r}: not a path")
        path = Path(groups_file)
        if not path.is_absolute() and not path.is_file():
            path = resolve_prefix(prefix).parent / groups_file
    label = _label(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise TraceError(f"{label}: cannot read: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{label}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{label}: expected a mapping of process-group name to its ranks")
    out = []
    for name, members in doc.items():
        if not isinstance(members, list) or not members or not all(
                isinstance(m, int) and not isinstance(m, bool) and 0 <= m < n for m in members) \
                or len(set(members)) != len(members):
            raise TraceError(f"{label}: {name}: expected a list of distinct ranks 0..{n - 1}")
        out.append((str(name), tuple(members)))
    return tuple(out), label


def _int(attrs: dict, key: str, label: str, node_id: int, minimum: int = 0) -> int:
    v = attrs.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TraceError(f"{label}: node {node_id}: attribute {key}: expected an integer >= {minimum}, got {v!r}")
    return v


def _check_rank(messages: list, label: str, n: int) -> tuple:
    if len(messages) > MAX_NODES:
        raise TraceError(f"{label}: {len(messages)} nodes (this replays at most {MAX_NODES} per rank)")
    nodes = {}
    for m in messages:
        type_name = chakra.node_type_name(m.type)
        kind = KINDS.get(type_name)
        if kind is None:
            raise TraceError(f"{label}: node {m.id}: {type_name} is not replayed (supported: "
                             f"{', '.join(KINDS)})")
        if m.id in nodes:
            raise TraceError(f"{label}: node {m.id}: a second node with this id")
        attrs = chakra.attributes(m)
        fields = {}
        if kind == "compute":
            fields["duration_ns"] = m.duration_micros * 1000
        elif kind == "collective":
            ctype = chakra.collective_name(attrs.get("comm_type"))
            if ctype not in COLLECTIVES:
                raise TraceError(f"{label}: node {m.id}: {ctype} is not replayed (supported: "
                                 f"{', '.join(COLLECTIVES)})")
            group = attrs.get("pg_name", "")
            fields.update(collective=COLLECTIVES[ctype], bytes=_int(attrs, "comm_size", label, m.id, 1),
                          group=group if isinstance(group, str) else str(group))
        elif kind in ("send", "recv"):
            key = "comm_dst" if kind == "send" else "comm_src"
            peer = _int(attrs, key, label, m.id)
            if peer >= n:
                raise TraceError(f"{label}: node {m.id}: {key} {peer} is not a rank of this trace (0..{n - 1})")
            fields.update(peer=peer, bytes=_int(attrs, "comm_size", label, m.id, 1),
                          tag=attrs.get("comm_tag", 0) if isinstance(attrs.get("comm_tag", 0), int) else 0)
        nodes[m.id] = TraceNode(id=m.id, name=m.name, kind=kind,
                                deps=tuple(dict.fromkeys(list(m.data_deps) + list(m.ctrl_deps))), **fields)
    for node in nodes.values():
        for d in node.deps:
            if d not in nodes:
                raise TraceError(f"{label}: node {node.id}: depends on node {d}, which this file does not hold")
    return _ordered(nodes, label)


def _ordered(nodes: dict, label: str) -> tuple:
    """Kahn's order, the smallest id first among the ready ones: a rank's collectives are
    matched across ranks in this order."""
    waiting = {i: len(n.deps) for i, n in nodes.items()}
    children = {i: [] for i in nodes}
    for n in nodes.values():
        for d in n.deps:
            children[d].append(n.id)
    ready = [i for i, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, c)
    if len(out) != len(nodes):
        stuck = min(i for i, w in waiting.items() if w > 0)
        raise TraceError(f"{label}: node {stuck}: its dependencies form a cycle")
    return tuple(out)


def critical_path_ns(rank: RankTrace) -> int:
    """The compute time on the rank's longest dependency chain (communication counted as 0)."""
    done = {}
    for node in rank.nodes:
        done[node.id] = max((done[d] for d in node.deps), default=0) + (node.duration_ns if node.kind == "compute"
                                                                        else 0)
    return max(done.values(), default=0)


def summary(trace: Trace) -> dict:
    """What ``testbed show chakra:PREFIX`` prints: ranks, nodes by type, bytes per collective
    type and point to point (all ranks together; a collective's bytes are its buffer, counted
    once per rank as the trace lists it), compute on the critical path."""
    by_kind, by_coll, p2p = {}, {}, 0
    for rt in trace.ranks:
        for node in rt.nodes:
            by_kind[node.kind] = by_kind.get(node.kind, 0) + 1
            if node.kind == "collective":
                entry = by_coll.setdefault(node.collective, {"count": 0, "bytes": 0})
                entry["count"] += 1
                entry["bytes"] += node.bytes
            elif node.kind == "send":
                p2p += node.bytes
    paths = [critical_path_ns(rt) for rt in trace.ranks]
    return {"prefix": trace.prefix, "ranks": len(trace.ranks), "versions": sorted({rt.version for rt in trace.ranks}),
            "nodes": by_kind, "collectives": by_coll, "send_bytes": p2p, "groups": dict(trace.groups),
            "groups_file": trace.groups_file, "critical_path_compute_ns": max(paths, default=0),
            "critical_path_rank": paths.index(max(paths)) if paths else 0}


def check(trace):
    """What must hold across ranks before anything runs: point-to-point messages pair up
    (a send of B bytes to rank q is the next receive from this rank that q lists, of B
    bytes). Collectives are matched while building (``build_plan``)."""
    sends, recvs = {}, {}
    for rt in trace.ranks:
        for node in rt.nodes:
            if node.kind == "send":
                sends.setdefault((rt.rank, node.peer), []).append((node, rt))
            elif node.kind == "recv":
                recvs.setdefault((node.peer, rt.rank), []).append((node, rt))
    for pair in sorted(set(sends) | set(recvs)):
        s, r = sends.get(pair, []), recvs.get(pair, [])
        for i in range(max(len(s), len(r))):
            if i >= len(r):
                node, rt = s[i]
                raise TraceError(f"{rt.file}: node {node.id}: send {i + 1} to rank {pair[1]} has no matching receive "
                                 f"(rank {pair[1]} receives {len(r)} message(s) from rank {pair[0]})")
            if i >= len(s):
                node, rt = r[i]
                raise TraceError(f"{rt.file}: node {node.id}: receive {i + 1} from rank {pair[0]} has no matching "
                                 f"send (rank {pair[0]} sends {len(s)} message(s) to rank {pair[1]})")
            if s[i][0].bytes != r[i][0].bytes:
                node, rt = r[i]
                raise TraceError(f"{rt.file}: node {node.id}: receives {node.bytes} bytes from rank {pair[0]}, whose "
                                 f"matching send (node {s[i][0].id}) sends {s[i][0].bytes}")
