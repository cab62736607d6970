"""Chakra execution traces: the wire format (golden bytes), what a bad trace says, and the
replay against the native workload it stands for (no root)."""

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from testbed.config import scenario
from testbed.errors import ConfigError
from testbed.config import traces
from testbed.model import plan as planning
from testbed.paths import ROOT, TRAFFIC_DIR
from testbed.wire import chakra as wire

sys.path.insert(0, str(TRAFFIC_DIR / "chakra"))
import generate  # noqa: E402  (traffic/chakra/generate.py)

# Node {id 3, name "x", type COMM_COLL_NODE, ctrl_deps [1], duration_micros 5,
#       attr [comm_type int64 0, comm_size int64 1024]}, after GlobalMetadata {version "0.0.4"}:
# each message's length as a varint, then the message (protolib's encodeMessage)
GOLDEN = bytes.fromhex("070a05302e302e34" "2b" "0803" "120178" "1807" "22010138" "05"
                       "520d0a09636f6d6d5f747970654800" "520e0a09636f6d6d5f73697a65488008")


def golden_messages():
    node = wire.Node(id=3, name="x", type=7, ctrl_deps=[1], duration_micros=5)
    node.attr.append(wire.attribute("comm_type", 0))
    node.attr.append(wire.attribute("comm_size", 1024))
    return [wire.GlobalMetadata(version="0.0.4"), node]


def test_the_stream_is_byte_for_byte_chakras_encoding():
    assert wire.encode_stream(golden_messages()) == GOLDEN
    meta, nodes = wire.decode_stream(GOLDEN, "t")
    assert meta.version == "0.0.4" and [n.id for n in nodes] == [3]
    assert wire.attributes(nodes[0]) == {"comm_type": 0, "comm_size": 1024}
    assert list(nodes[0].ctrl_deps) == [1] and nodes[0].type == 7
    # gzip, as Chakra's converters may write it
    assert wire.decode_stream(gzip.compress(GOLDEN), "t")[1][0].id == 3


def test_unknown_fields_of_newer_schemas_are_skipped():
    """Node.storage (field 11, added to et_def.proto in 2026) is not declared here."""
    extra = bytes.fromhex("5a020801")  # field 11, length 2: {level: 1}
    node = golden_messages()[1].SerializeToString() + extra
    data = GOLDEN[:8] + wire.varint(len(node)) + node
    assert wire.decode_stream(data, "t")[1][0].id == 3


@pytest.mark.parametrize("cut", [9, 20, len(GOLDEN) - 1])
def test_a_truncated_stream_names_the_file_and_where(cut):
    with pytest.raises(wire.TraceError) as err:
        wire.decode_stream(GOLDEN[:cut], "f.0.et")
    msg = str(err.value)
    assert msg.startswith("f.0.et: ") and "truncated" in msg
    assert "the first node" in msg or "after node" in msg


def write_trace(folder: Path, ranks: list, groups: dict | None = None, name: str = "t") -> str:
    """``ranks``: per rank a list of (id, type, deps, attrs, duration_us)."""
    for r, nodes in enumerate(ranks):
        msgs = [wire.GlobalMetadata(version="0.0.4")]
        for node_id, type_, deps, attrs, dur in nodes:
            n = wire.Node(id=node_id, name=f"n{node_id}", type=type_, data_deps=list(deps), duration_micros=dur)
            for k, v in attrs.items():
                n.attr.append(wire.attribute(k, v))
            msgs.append(n)
        (folder / f"{name}.{r}.et").write_bytes(wire.encode_stream(msgs))
    if groups is not None:
        (folder / f"{name}.groups.json").write_text(json.dumps(groups))
    return str(folder / name)


def ar(size=1024, **extra):
    return {"comm_type": 0, "comm_size": size, **extra}


def two_ranks(folder, first, second=None):
    return write_trace(folder, [first, second if second is not None else first])


@pytest.mark.parametrize("nodes, expect", [
    ([(1, 2, (), {}, 0)], "node 1: MEM_LOAD_NODE is not replayed"),
    ([(1, 7, (), {"comm_type": 1, "comm_size": 8}, 0)], "node 1: REDUCE is not replayed"),
    ([(1, 7, (), {"comm_type": 0}, 0)], "node 1: attribute comm_size: expected an integer >= 1, got None"),
    ([(1, 4, (2,), {}, 1), (2, 4, (1,), {}, 1)], "node 1: its dependencies form a cycle"),
    ([(1, 4, (9,), {}, 1)], "node 1: depends on node 9, which this file does not hold"),
    ([(1, 4, (), {}, 1), (1, 4, (), {}, 1)], "node 1: a second node with this id"),
    ([(1, 5, (), {"comm_dst": 5, "comm_size": 8}, 0)], "node 1: comm_dst 5 is not a rank of this trace (0..1)"),
    ([(1, 7, (), ar(pg_name="g"), 0)], "node 1: pg_name 'g' is not in a communicator-group file (none given)"),
])
def test_a_bad_node_is_one_line_naming_file_and_node(tmp_path, nodes, expect):
    prefix = two_ranks(tmp_path, nodes)
    with pytest.raises(wire.TraceError) as err:
        traces.load(prefix)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{tmp_path}/t.0.et: {expect}")


def test_a_missing_rank_file_is_named(tmp_path):
    prefix = write_trace(tmp_path, [[(1, 4, (), {}, 1)]] * 3)
    (tmp_path / "t.1.et").unlink()
    with pytest.raises(wire.TraceError) as err:
        traces.load(prefix)
    assert str(err.value) == f"{prefix}.1.et: rank file missing (found ranks 0, 2)"
    with pytest.raises(wire.TraceError, match=r"t\.0\.et: no such file"):
        traces.load(str(tmp_path / "nothing" / "t"))


def test_unmatched_messages_and_collectives_are_named(tmp_path):
    send = (1, 5, (), {"comm_dst": 1, "comm_size": 64}, 0)
    recv = (1, 6, (), {"comm_src": 0, "comm_size": 32}, 0)
    trace = traces.load(two_ranks(tmp_path, [send], [recv]))
    with pytest.raises(wire.TraceError) as err:
        traces.check(trace)
    assert str(err.value) == (f"{tmp_path}/t.1.et: node 1: receives 32 bytes from rank 0, whose matching send "
                              f"(node 1) sends 64")
    trace = traces.load(two_ranks(tmp_path, [send], [(1, 4, (), {}, 1)]))
    with pytest.raises(wire.TraceError, match=r"t\.0\.et: node 1: send 1 to rank 1 has no matching receive"):
        traces.check(trace)


def scenario_with(tmp_path, prefix, *sets):
    doc = tmp_path / "s.yaml"
    doc.write_text(f"name: s\ntopology: leaf-spine\ntraffic: chakra:{prefix}\n")
    return scenario.load(str(doc), list(sets))


def test_collectives_out_of_order_across_ranks_stop_the_plan(tmp_path):
    a = [(1, 7, (), ar(1024), 0), (2, 7, (1,), ar(2048, pg_name="g"), 0)]
    b = [(1, 7, (), ar(2048, pg_name="g"), 0), (2, 7, (1,), ar(1024), 0)]
    groups = {"g": list(range(8))}
    prefix = write_trace(tmp_path, [a] * 4 + [b] * 4, groups)
    with pytest.raises(ConfigError) as err:
        planning.build(scenario_with(tmp_path, prefix))
    assert err.value.problems[0].startswith(f"{tmp_path}/t.0.et: node 1: collective 1 of process group (all ranks) "
                                            f"is never reached by rank 4")
    prefix = write_trace(tmp_path, [[(1, 7, (), ar(1024), 0)]] * 7 + [[(1, 7, (), ar(4096), 0)]], name="u")
    with pytest.raises(ConfigError, match=r"u\.7\.et: node 1: all-reduce of 4096 bytes, but the matching"):
        planning.build(scenario_with(tmp_path, prefix))


def test_a_trace_for_another_fabric_size_is_a_config_problem(tmp_path):
    prefix = two_ranks(tmp_path, [(1, 7, (), ar(), 0)])
    with pytest.raises(ConfigError) as err:
        scenario_with(tmp_path, prefix)
    assert err.value.problems == [f"{tmp_path}/s.yaml: traffic chakra:{prefix}: chakra.prefix: the trace has 2 "
                                  f"ranks and the fabric 8 GPUs (one rank per GPU)"]
    with pytest.raises(ConfigError, match=r": parallelism: not used with chakra"):
        scenario_with(tmp_path, prefix, "workload.parallelism.data=2")


def test_show_of_a_bad_trace_exits_2_with_one_line(tmp_path):
    prefix = two_ranks(tmp_path, [(1, 4, (), {}, 1)])
    data = Path(f"{prefix}.1.et").read_bytes()
    Path(f"{prefix}.1.et").write_bytes(data[:-2])
    out = subprocess.run([sys.executable, "-m", "testbed", "show", f"chakra:{prefix}"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {prefix}.1.et: the first node (byte 8): truncated: "
                                               f"{len(data) - 9} bytes announced, {len(data) - 11} left"]


def test_show_summarises_a_trace():
    out = subprocess.run([sys.executable, "-m", "testbed", "show", "chakra:chakra/megatron32/step"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, check=True).stdout
    assert "32 ranks" in out and "128 recv, 128 send" in out and "16 in all" in out
    # rank 0 (stage 0 of 2): 4 forwards of 10us and 4 backwards of 20us on its chain
    assert "critical path: 120us of compute" in out


def test_the_shipped_traces_are_the_generators(tmp_path):
    for path in generate.write(tmp_path):
        rel = path.relative_to(tmp_path)
        assert (TRAFFIC_DIR / "chakra" / rel).read_bytes() == path.read_bytes(), rel


def sends_per_pair(p) -> Counter:
    out = Counter()
    for gpu, ops in p.training.ops.items():
        for op in ops:
            if op.kind == "send":
                out[(gpu, op.peer, op.link, op.iteration)] += op.bytes
    return out


def test_dp8_replay_is_the_default_job_op_for_op():
    native = planning.build(scenario.load("default"))
    replayed = planning.build(scenario.load("chakra-dp8"))
    strip = lambda op: (op.kind, op.iteration, op.collective, op.step, op.peer, op.bytes, op.duration_ns,  # noqa: E731
                        op.deps, op.link)
    assert {g: [strip(o) for o in ops] for g, ops in replayed.training.ops.items()} == \
        {g: [strip(o) for o in ops] for g, ops in native.training.ops.items()}
    assert replayed.training.ideal["iteration_ns"] == pytest.approx(native.training.ideal["iteration_ns"])
    assert replayed.training.ideal["compute_ns"] == native.training.ideal["compute_ns"] == 60_000


def test_megatron32_replay_sends_what_the_native_job_sends():
    """The same Megatron step written natively (TP 4, PP 2 with 1F1B, DP 4 on rail-4x8):
    every GPU sends the same bytes to the same peer on the same link."""
    m = generate.MEGATRON
    assert m["layers_per_stage"] == 1  # natively, tensor AllReduces of 2 x activations without a model
    native = planning.build(scenario.load("topologies/rail-4x8.yaml", [
        f"workload.parallelism.tensor={m['tensor']}", f"workload.parallelism.pipeline={m['pipeline']}",
        f"workload.micro_batches={m['micro_batches']}", f"workload.compute.forward={m['forward_us']}us",
        f"workload.compute.backward={m['backward_us']}us", f"workload.activations={m['activations']}",
        "workload.mapping=sequential",
        "workload.iterations=1", f"workload.collective.bytes={m['gradient_bytes']}"]))
    replayed = planning.build(scenario.load("topologies/rail-4x8.yaml", ["workload.chakra.prefix=chakra/megatron32/step",
                                                         "workload.iterations=1", "workload.mapping=sequential"]))
    got, want = sends_per_pair(replayed), sends_per_pair(native)
    assert got == want and sum(got.values()) > 0
    links = {k[2] for k in got}
    assert links == {"fabric", "nvlink"}
