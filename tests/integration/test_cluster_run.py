"""``testbed run --cluster HERE,SERVER``: the whole run across two servers, this machine
and a second server on it (cluster_server.LocalServer, whose clock runs 1000 s ahead), as
a user starts it: one results folder with both servers' records and queues."""

import json
import os
import subprocess
import sys

import pytest

from helpers.cluster_server import MONOTONIC_OFFSET_S, LocalServer
from testbed.paths import ROOT

pytestmark = pytest.mark.integration


def run_testbed(server: LocalServer, *argv, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESTBED_SSH_CONFIG=str(server.ssh_config))
    return subprocess.run([sys.executable, "-m", "testbed", *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.datapath_independent  # the second server runs OVS's userspace datapath everywhere
def test_run_across_two_servers_trains_and_gathers_one_results_folder(clean_slate, tmp_path):
    from testbed.analysis.training import load_records
    from testbed.config import scenario as scenarios
    from testbed.model import placement
    from testbed.model import plan as planning

    source = tmp_path / "leaf-spine-dp.yaml"
    sets = ["--set", "workload.iterations=1", "--set", "workload.collective.bytes=256KB"]
    with LocalServer(tmp_path, 2) as s2:
        for argv in (["ip", "link", "set", "dev", s2.root_intf, "mtu", "9000"],
                     s2.inside("ip", "link", "set", "dev", "eth0", "mtu", "9000")):
            subprocess.run(argv, check=True, timeout=30)
        # the servers in the scenario (cluster:), as a user keeps them with the fabric
        source.write_text((ROOT / "scenarios" / "leaf-spine.yaml").read_text() + "traffic: dp-ring\n"
                          f"cluster: [{s2.root_address}, {s2.address}]\n")
        # bad input: this machine must come first, by an address it has (--cluster overrides cluster:)
        done = run_testbed(s2, "run", str(source), *sets, "--cluster", f"{s2.address},{s2.root_address}",
                           "--results", str(tmp_path / "refused"))
        assert done.returncode == 2 and "--cluster: the first server must be this machine's address" in done.stderr, (
            done.stderr)
        assert "Traceback" not in done.stderr and not (tmp_path / "refused").exists()
        done = run_testbed(s2, "run", str(source), *sets, "--results", str(tmp_path / "res"))
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        left = subprocess.run(s2.inside("ovs-vsctl", "list-br"), capture_output=True, text=True, timeout=30,
                              check=True).stdout
        assert left == "", left  # the other server's share came down with the run
    run_dir = tmp_path / "res" / done.stdout.strip().splitlines()[-1].split("/")[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok", manifest["reason"]
    c = manifest["cluster"]
    assert c["servers"] == [s2.root_address, s2.address] and c["controller_address"] == s2.root_address
    clock = c["clocks"][s2.address]
    assert abs(clock["offset_ns"] - MONOTONIC_OFFSET_S * 10**9) <= clock["error_ns"] + 1000, clock
    assert manifest["reachability"]["pairs"] == 8 * 7

    sc = scenarios.load(str(source), ["workload.iterations=1", "workload.collective.bytes=256KB"])
    plan = planning.build(sc, manifest["datapath"])
    here, there = placement.shares(plan, placement.place(plan, (s2.root_address, s2.address)))
    assert c["placement"][s2.address]["gpus"] == list(there.hosts)
    # both servers' records, every planned op, one completed iteration
    records = load_records(run_dir / "agents")
    assert {r["gpu"] for r in records} == {h.name for h in plan.hosts}
    assert len([r for r in records if r["type"] == "op"]) == sum(len(v) for v in plan.training.ops.values())
    training = json.loads((run_dir / "training.json").read_text())
    assert len(training["iterations"]) == 1 and training["iterations"][0]["complete"]
    # both servers' queues in the run's telemetry, on one time line
    queues = [json.loads(line) for line in (run_dir / "queues.jsonl").read_text().splitlines()]
    seen = {q["intf"] for q in queues}
    assert len({(q["intf"], q["t_ns"]) for q in queues}) == len(queues)  # each poll once
    assert {pq.intf for pq in plan.queues} == seen
    ours = [q["t_ns"] for q in queues if q["switch"] in here.switches]
    theirs = [q["t_ns"] for q in queues if q["switch"] in there.switches]
    assert abs(min(theirs) - min(ours)) < 60 * 10**9 and abs(max(theirs) - max(ours)) < 60 * 10**9
    assert (run_dir / "servers" / s2.address / "polls.jsonl").read_text()
    # a lossless class on every port: one PFC process per server, each for its own ports,
    # their totals in one pfc.jsonl and the manifest
    ports = [json.loads(line) for line in (run_dir / "pfc.jsonl").read_text().splitlines()]
    assert sorted(p["port"] for p in ports if p["event"] == "port") == sorted(pq.intf for pq in plan.queues)
    assert manifest["pfc"] is not None and manifest["queues"]["pfc"]
    summary = json.loads((run_dir / "summary.json").read_text())
    checks = {ch["name"]: ch for ch in summary["fidelity"]["checks"]}
    assert checks["cluster_clock"]["ok"], checks["cluster_clock"]
    assert (run_dir / "report.html").exists()
