"""Every lab as a trainee runs it: `lab run N`, then the other commands of the README's
`Run it` block (`lab check N`), through the CLI. Every observation must hold. Then the
knob that removes the lab's phenomenon: one of the lab's runs again with it, and
`lab check N` must fail, naming the observation that no longer holds.

A check's first observation is the fidelity verdict of each run; when a run was not
trusted, the lab is rerun once at the dilation the guard suggests, then the test fails
with the check's output (never skipped)."""

import json
import subprocess
import sys

import pytest

from testbed.labs import catalog
from testbed.paths import ROOT

pytestmark = pytest.mark.integration

# lab -> (the run to repeat, the knob that removes the phenomenon, the observation that must fail)
KNOBS = {
    1: ("burst.yaml", ["workload.compute.forward=0us", "workload.compute.backward=0us"],
        "between the bursts, during compute, the GPU ports idled"),
    2: ("tor.yaml", ["workload.mapping=sequential"], "top-of-rack sends twice the rail fabric's bytes"),
    3: ("one-to-one.yaml", ["workload.mapping=sequential"], "1:1: ECMP hashed two or more flows onto one link"),
    4: ("buffer-64KB.yaml", ["queues.buffer=1MB"], "a buffer of more than one chunk still drops"),
    5: ("kmin-100KB.yaml", ["queues.ecn=off"], "lab05-kmin-100kb: ECN marked"),
    6: ("headroom-4KB.yaml", ["queues.pfc={}"], "with 4 KB of headroom the lossless class drops"),
    7: ("pipeline-slow.yaml", ["fabric.leaves=[{hosts: 4}, {hosts: 4}]"],
        "pipeline: the stages behind the slow hop start their first forward later"),
    8: ("tensor.yaml", ["workload.parallelism.tensor=1"], "the tensor-parallel AllReduces ran on NVLink"),
    9: ("hierarchical.yaml", ["workload.collective.algorithm=ring"],
        "hierarchical keeps the fabric part on the rails"),
}


def cli(*argv, timeout=1800):
    out = subprocess.run([sys.executable, "-m", "testbed", *argv], capture_output=True, text=True, timeout=timeout,
                         cwd=ROOT)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out


def untrusted(results):
    """The suggested dilation of the lab's newest runs that the fidelity guard did not trust."""
    suggested = []
    for summary in results.glob("lab*/summary.json"):
        fid = json.loads(summary.read_text()).get("fidelity", {})
        if fid.get("verdict") == "not trusted":
            suggested.append(fid.get("suggested_dilation"))
    return max(suggested, default=None)


def run_and_check(lab, results, extra=()):
    out = cli("lab", "run", str(lab.number), "--results", str(results), *extra)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    checks = [c for c in lab.commands if not c.is_run]
    assert [c.argv[:2] for c in checks] == [("lab", "check")], checks
    return cli(*checks[0].argv, "--results", str(results))


@pytest.mark.parametrize("number", sorted(KNOBS))
def test_lab_holds_as_written_and_fails_without_its_phenomenon(number, tmp_path, clean_slate):
    lab = catalog.find(str(number))
    assert sorted(KNOBS) == [x.number for x in catalog.all_labs()]
    results = tmp_path / "results"
    check = run_and_check(lab, results)
    if check.returncode != 0 and untrusted(results):
        check = run_and_check(lab, tmp_path / "rerun", ["--set", f"dilation={untrusted(results)}"])
        results = tmp_path / "rerun"
    assert check.returncode == 0, check.stdout + check.stderr
    assert "FAIL" not in check.stdout and f"lab {number}: " in check.stdout

    name, knob, claim = KNOBS[number]
    (cmd,) = [c for c in lab.runs if c.argv[1].endswith("/" + name)]
    argv = [*cmd.argv, "--results", str(results)] + [a for k in knob for a in ("--set", k)]
    out = cli(*argv)
    assert out.returncode == 0, out.stderr[-3000:]
    without = cli("lab", "check", str(number), "--results", str(results))
    failed = [line for line in without.stdout.splitlines() if line.strip().startswith("FAIL")]
    assert without.returncode == 1, without.stdout
    assert any(claim in line for line in failed), (claim, without.stdout)
