"""A Chakra trace replayed on the real fabric reproduces the native job it was written from,
and a bad trace stops the run before anything exists."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from testbed import run
from testbed.analysis import results
from testbed.analysis.kpis import last_poll
from testbed.analysis.training import load_records
from testbed.config import scenario
from testbed.paths import ROOT
from testbed.wire import chakra as wire
from helpers.runs import run_trusted

pytestmark = pytest.mark.integration


def replay_run(tmp_path, ref):
    folder = tmp_path / ref
    folder.mkdir()
    result, fidelity = run_trusted(lambda extra: scenario.load(ref, ["workload.iterations=2", *extra]),
                                   lambda f: run.RunOptions(results_dir=f), folder)
    assert result.status == "ok", result.reason
    assert fidelity["verdict"] == "trusted", fidelity["text"]
    return result.run_dir


def what_was_sent(run_dir) -> tuple:
    """(payload bytes the agents sent per (GPU, peer, link), bytes every switch port sent,
    mean step time in real ns)."""
    sent = Counter()
    for r in load_records(run_dir / "agents"):
        if r.get("type") == "op" and r["kind"] == "send":
            sent[(r["gpu"], r["peer"], r["link"])] += r["bytes"]
    ports = results.load(run_dir).ports
    first = ports.sort_values("t_ns").groupby("intf").head(1).set_index("intf").tx_bytes
    port_bytes = (last_poll(ports).set_index("intf").tx_bytes - first).to_dict()
    training = json.loads((run_dir / "training.json").read_text())
    steps = [i["step_ns"] for i in training["iterations"]]
    assert len(steps) == 2 and not training["incomplete_iterations"]
    return sent, port_bytes, sum(steps) / len(steps)


def test_a_replayed_trace_is_the_native_job_on_every_link(tmp_path, clean_slate):
    """chakra-dp8 (traffic/chakra/dp8) against the default scenario it was written from:
    the agents send the same bytes to the same peers, every switch port carries the same
    bytes (within 1 %: acknowledgements and CNPs follow timing), the step time is within 5 %."""
    native = what_was_sent(replay_run(tmp_path, "default"))
    replayed = what_was_sent(replay_run(tmp_path, "chakra-dp8"))
    assert replayed[0] == native[0] and sum(native[0].values()) == 2 * 8 * 14 * 250_000
    assert set(replayed[1]) == set(native[1])
    for intf, b in native[1].items():
        assert abs(replayed[1][intf] - b) <= 0.01 * max(b, 100_000), (intf, b, replayed[1][intf])
    assert replayed[2] == pytest.approx(native[2], rel=0.05)


def test_a_bad_trace_exits_2_and_creates_nothing(tmp_path, clean_slate):
    folder = tmp_path / "trace"
    folder.mkdir()
    for r in range(8):
        node = wire.Node(id=7, name="load", type=2)  # MEM_LOAD_NODE: not replayed
        (folder / f"t.{r}.et").write_bytes(wire.encode_stream([wire.GlobalMetadata(version="0.0.4"), node]))
    doc = tmp_path / "bad.yaml"
    doc.write_text(f"name: bad\ntopology: rail-2x4\ntraffic: chakra:{folder}/t\n")
    results_dir = tmp_path / "results"
    out = subprocess.run([sys.executable, "-m", "testbed", "run", str(doc), "--results", str(results_dir)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: {folder}/t.0.et: node 7: MEM_LOAD_NODE is not replayed "
                                               f"(supported: COMP_NODE, COMM_COLL_NODE, COMM_SEND_NODE, "
                                               f"COMM_RECV_NODE, METADATA_NODE)"]
    assert not results_dir.exists()
