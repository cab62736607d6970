"""The run-folder loader: documented frames, real-time columns, a cut-short last line."""

import json

import pytest

from helpers import plans
from testbed.analysis import results
from testbed import errors


def write(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_load_builds_frames_with_real_time_columns(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "x", "dilation": 1000, "status": "ok"}))
    (tmp_path / "agents").mkdir()
    op = {"type": "op", "iteration": 0, "phase": "dp", "collective": 0, "step": 0, "link": "fabric",
          "micro_batch": -1}
    write(tmp_path / "agents" / "h1.jsonl", [
        {**op, "gpu": "h1", "id": 0, "kind": "send", "peer": "h2", "bytes": 4096, "ready_ns": 1_000_000,
         "start_ns": 1_000_000, "end_ns": 3_000_000},
        {**op, "gpu": "h1", "id": 1, "kind": "recv", "peer": "h2", "bytes": 4096, "ready_ns": 1_000_000,
         "start_ns": 1_000_000, "end_ns": 5_000_000},
        {"gpu": "h1", "type": "rate", "t_ns": 2_000_000, "peer": "h2", "link": "fabric", "rate_bps": 2e11,
         "alpha": 0.5},
        {"gpu": "h1", "type": "qp", "peer": "h2", "link": "fabric", "packets_sent": 1, "retransmitted": 0},
    ], tail='{"gpu": "h1", "type": "op", "id"')  # an interrupted run's last line
    write(tmp_path / "pfc.jsonl", [{"t_ns": 1_500_000, "event": "xoff_sent", "port": "leaf1-eth1", "quanta": 65535},
                                   {"event": "port", "port": "leaf1-eth1", "frames_sent": 1, "drops": 0}])
    r = results.load(tmp_path)
    assert list(r.ops.kind) == ["send", "recv"]
    assert list(r.ops.end_real_ns) == [2000.0, 4000.0]  # (end - first ready) / dilation
    assert list(r.ops.wait_real_ns) == [0.0, 4000.0]  # only receives wait on a peer
    assert r.rates.t_real_ns.tolist() == [1000.0] and r.rates.rate_bps.tolist() == [2e11]
    assert r.qps.packets_sent.tolist() == [1]
    assert r.pfc_events.port.tolist() == ["leaf1-eth1"] and r.pfc_events.t_real_ns.tolist() == [500.0]
    assert r.pfc_ports.frames_sent.tolist() == [1]
    assert r.iterations.empty and r.collectives.empty and r.pauses.empty


def test_not_a_run_folder(tmp_path):
    with pytest.raises(errors.TestbedError, match="not a run folder"):
        results.load(tmp_path)


def test_port_rates_use_the_switch_counter_times_not_the_reply_times(tmp_path):
    """A 400G port (8 Mbit/s at D = 50000) sending 500 KB every 0.5 s: the controller handled
    the second reply 30 ms late and the third on time, so by its receive times the port sent
    at 375G, then 428G, faster than its wire. The switch's own counter times say 400G both."""
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "x", "dilation": 50000, "status": "ok"}))
    (tmp_path / "plan.json").write_text(json.dumps(plans.plan_json(
        dilation=50000, queues=[plans.queue(intf="leaf1-eth1", rate_bps=400e9)])))
    rows = [{"t_ns": t, "duration_ns": d, "switch": "leaf1", "port": 1, "intf": "leaf1-eth1", "tx_bytes": b,
             "rx_bytes": 0} for t, d, b in ((0, 10**9, 0), (530_000_000, 1_500_000_000, 500_000),
                                            (1_000_000_000, 2_000_000_000, 1_000_000))]
    write(tmp_path / "ports.jsonl", rows)
    assert results.load(tmp_path).ports.tx_bps.dropna().round(-6).tolist() == [400e9, 400e9]
    write(tmp_path / "ports.jsonl", [{k: v for k, v in r.items() if k != "duration_ns"} for r in rows])
    by_reply = results.load(tmp_path).ports.tx_bps.dropna().round(-9).tolist()  # a run from before the fix
    assert by_reply == [377e9, 426e9]
