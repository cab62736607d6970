"""What splitting a fabric over two servers costs, against the same run on one machine, and
the docs' model of busy cores checked against both (docs/cluster.md, "How many GPUs a
cluster should hold"). A benchmark, not a test.

    .venv/bin/python bench/cluster.py [--iterations N] [--dilation D] [--repeat R]   (as root)

The scenario is leaf-spine with the default job (dp-ring, 2 MB per iteration), PFC off (it
does not cross servers yet). Three runs per repeat, side by side: ``testbed run`` on this
machine, the same with PFC on (the model was fitted on runs with it), and ``testbed run --cluster`` over this machine and a second server on it
(tests/helpers/cluster_server.LocalServer: its own namespaces, sshd and Open vSwitch,
so both servers' fixed costs land on this one host). For each: bring-up, training and
teardown wall time (the manifest's timings), the training's mean busy cores of the host
(its polls during the training: ``host_busy`` x cores), the JCT ratio and the fidelity
verdict. Then the model's prediction, ``cores ~= 0.78 + 960 G / D`` per server's fixed
part: once for one machine, twice (two servers' fixed parts) for the split run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers.cluster_server import LocalServer  # noqa: E402

from testbed.analysis import fidelity, results  # noqa: E402

FIXED_CORES = 0.78  # docs/cluster.md's least-squares line: cores ~= 0.78 + 960 G / D
PER_GPU_RATE = 960


def one_run(work: Path, scenario: Path, sets: list, env: dict, cluster: str = "", name: str = "") -> dict:
    out = work / (name or ("cluster" if cluster else "single"))
    argv = [sys.executable, "-m", "testbed", "run", str(scenario), *sets, "--results", str(out)]
    if cluster:
        argv += ["--cluster", cluster]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    m = json.loads((run_dir / "manifest.json").read_text())
    r = results.load(run_dir)
    judged = fidelity.judged_polls(r)
    f = fidelity.check(r)
    summary = json.loads((run_dir / "summary.json").read_text())
    jct = (summary.get("jct") or {}).get("mean_ratio")
    t = m["timings_s"]
    return {"bring_up_s": t.get("flows_installed"), "training_s": t.get("training"), "teardown_s": t.get("teardown"),
            "total_s": t.get("total"), "busy_cores": float(judged.host_busy.mean()) * os.cpu_count(),
            "polls": len(judged), "jct_ratio": jct, "verdict": f["verdict"], "dilation": m["dilation"],
            "gpus": len(r.plan.hosts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--dilation", type=float, default=None, help="default: the scenario's automatic choice")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/cluster.py: run as root (it builds fabrics)")
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        scenario = work / "leaf-spine-dp.yaml"
        scenario.write_text((ROOT / "scenarios" / "leaf-spine.yaml").read_text() + "traffic: dp-ring\n")
        sets = ["--set", f"workload.iterations={args.iterations}"]
        if args.dilation:
            sets += ["--set", f"dilation={args.dilation:g}"]
        sets += ["--set", "queues.pfc=off"]
        rows = []
        with LocalServer(work, 2) as s2:
            for argv in (["ip", "link", "set", "dev", s2.root_intf, "mtu", "9000"],
                         s2.inside("ip", "link", "set", "dev", "eth0", "mtu", "9000")):
                subprocess.run(argv, check=True, timeout=30)
            env = dict(os.environ, TESTBED_SSH_CONFIG=str(s2.ssh_config))
            for k in range(args.repeat):
                rep = work / f"r{k}"
                rep.mkdir()
                rows.append(("one machine", one_run(rep, scenario, sets, env)))
                # the docs' model was fitted on runs with PFC on: the same run with it, for its fixed part
                with_pfc = sets[:-2]  # without the trailing "--set queues.pfc=off"
                rows.append(("one, PFC on", one_run(rep, scenario, with_pfc, env, name="pfc")))
                rows.append(("two servers", one_run(rep, scenario, sets, env, f"{s2.root_address},{s2.address}")))
    print(f"{'run':<12} {'GPUs':>4} {'D':>7} {'bring-up s':>10} {'train s':>8} {'teardown s':>10} {'busy cores':>10} "
          f"{'model':>6} {'JCT ratio':>9}  verdict")
    for name, row in rows:
        fixed = FIXED_CORES * (2 if name == "two servers" else 1)
        model = fixed + PER_GPU_RATE * row["gpus"] / row["dilation"]
        print(f"{name:<12} {row['gpus']:>4} {row['dilation']:>7g} {row['bring_up_s']:>10.1f} {row['training_s']:>8.1f} "
              f"{row['teardown_s']:>10.1f} {row['busy_cores']:>10.2f} {model:>6.2f} "
              f"{row['jct_ratio'] if row['jct_ratio'] is not None else float('nan'):>9.3f}  {row['verdict']} "
              f"({row['polls']} polls)")
    single = [r for n, r in rows if n == "one machine"]
    split = [r for n, r in rows if n == "two servers"]
    pfc = [r for n, r in rows if n == "one, PFC on"]
    print(f"the PFC process's share of the busy cores: "
          f"{sum(r['busy_cores'] for r in pfc) / len(pfc) - sum(r['busy_cores'] for r in single) / len(single):+.2f}")
    for key in ("bring_up_s", "training_s", "teardown_s", "busy_cores"):
        a = sum(r[key] for r in single) / len(single)
        b = sum(r[key] for r in split) / len(split)
        print(f"two servers / one machine, {key}: {b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
