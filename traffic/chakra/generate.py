"""Writes the shipped Chakra execution traces (one ``.et`` file per rank, the stream format
of Chakra's protolib) and their communicator-group files:

- ``dp8/step``: 8 ranks of data parallelism: forward 20 us, backward 40 us, a ring
  AllReduce of 2 MB of gradients (the default scenario's workload, ``traffic/dp-ring.yaml``);
- ``megatron32/step``: 32 ranks, a Megatron-style step with TP 4 (NVLink AllReduce after
  every forward and backward), PP 2 (1F1B over 4 micro-batches, activations sent between the
  stages) and DP 4 (the gradients' AllReduce per pipeline stage and tensor rank).

Ranks follow Megatron's order: tensor rank fastest, then data-parallel rank, then pipeline
stage. Usage: ``python3 traffic/chakra/generate.py [OUT_DIR]`` (default: next to this file).
The traces are committed; tests regenerate them and compare bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from testbed.wire import chakra  # noqa: E402  (the schema as data, shared with the reader)

VERSION = "0.0.4"
COMP, SEND, RECV, COLL = 4, 5, 6, 7
ALL_REDUCE = 0

# the Megatron-style step (tests/unit/test_chakra.py builds the same job natively)
MEGATRON = {"tensor": 4, "pipeline": 2, "data": 4, "micro_batches": 4, "forward_us": 10, "backward_us": 20,
            "activations": 262144, "layers_per_stage": 1, "gradient_bytes": 500_000}  # gradients: one rank's shard


class Rank:
    """One rank's nodes, ids in creation order."""

    def __init__(self):
        self.nodes = []

    def add(self, name: str, type_: int, deps=(), duration_us: int = 0, **attrs) -> int:
        node = chakra.Node(id=len(self.nodes), name=name, type=type_, data_deps=list(deps),
                           duration_micros=duration_us)
        node.attr.append(chakra.attribute("is_cpu_op", False))
        for key, value in attrs.items():
            node.attr.append(chakra.attribute(key, value))
        self.nodes.append(node)
        return node.id

    def encode(self) -> bytes:
        return chakra.encode_stream([chakra.GlobalMetadata(version=VERSION)] + self.nodes)


def dp8() -> tuple:
    ranks = []
    for _ in range(8):
        r = Rank()
        f = r.add("forward", COMP, duration_us=20)
        b = r.add("backward", COMP, (f,), duration_us=40)
        r.add("allreduce_grads", COLL, (b,), comm_type=ALL_REDUCE, comm_size=2_000_000)
        ranks.append(r)
    return ranks, {}


def megatron32() -> tuple:
    m = MEGATRON
    tp, pp, dp, mb = m["tensor"], m["pipeline"], m["data"], m["micro_batches"]
    tp_bytes = 2 * m["layers_per_stage"] * m["activations"]
    grad = m["gradient_bytes"]
    n = tp * pp * dp

    def rank_of(stage, d, t):
        return (stage * dp + d) * tp + t

    groups = {}
    for stage in range(pp):
        for d in range(dp):
            groups[f"tp_{stage}_{d}"] = [rank_of(stage, d, t) for t in range(tp)]
        for t in range(tp):
            groups[f"dp_{stage}_{t}"] = [rank_of(stage, d, t) for d in range(dp)]
    ranks = []
    for r in range(n):
        t, u = r % tp, r // tp
        stage, d = u // dp, u % dp
        rank = Rank()
        prev, sends = None, []
        for kind, k in one_f_one_b(pp, stage, mb):
            forward = kind == "F"
            src = stage - 1 if forward else stage + 1
            dst = stage + 1 if forward else stage - 1
            deps = [prev] if prev is not None else []
            if 0 <= src < pp:
                deps.append(rank.add(f"recv_{kind}{k}", RECV, comm_src=rank_of(src, d, t), comm_size=m["activations"],
                                     comm_tag=k))
            c = rank.add(f"{'forward' if forward else 'backward'}_mb{k}", COMP, deps,
                         duration_us=m["forward_us"] if forward else m["backward_us"])
            prev = rank.add(f"tp_allreduce_{kind}{k}", COLL, (c,), comm_type=ALL_REDUCE, comm_size=tp_bytes,
                            pg_name=f"tp_{stage}_{d}")
            if 0 <= dst < pp:
                sends.append(rank.add(f"send_{kind}{k}", SEND, (prev,), comm_dst=rank_of(dst, d, t),
                                      comm_size=m["activations"], comm_tag=k))
        rank.add("dp_allreduce_grads", COLL, [prev] + sends, comm_type=ALL_REDUCE, comm_size=grad,
                 pg_name=f"dp_{stage}_{t}")
        ranks.append(rank)
    return ranks, groups


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> list:
    """1F1B: (stages - stage - 1) warm-up forwards, one forward / one backward alternately,
    then the remaining backwards."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", k) for k in range(warm)]
    f, b = warm, 0
    while f < micro_batches:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return order + [("B", k) for k in range(b, micro_batches)]


TRACES = {"dp8/step": dp8, "megatron32/step": megatron32}


def write(out_dir: Path) -> list:
    written = []
    for prefix, make in TRACES.items():
        ranks, groups = make()
        base = out_dir / prefix
        base.parent.mkdir(parents=True, exist_ok=True)
        for r, rank in enumerate(ranks):
            path = Path(f"{base}.{r}.et")
            path.write_bytes(rank.encode())
            written.append(path)
        if groups:
            path = Path(f"{base}.groups.json")
            path.write_text(json.dumps(groups, indent=1) + "\n")
            written.append(path)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in write(out):
        print(p)
