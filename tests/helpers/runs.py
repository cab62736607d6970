"""Leftover checks and the rerun-once rule for runs whose test bounds depend on timing."""

import json
import subprocess
from pathlib import Path


def snapshot() -> dict:
    """What a run could leave behind: root-namespace links, OVS bridges, named namespaces."""
    links = {link["ifname"] for link in json.loads(
        subprocess.run(["ip", "-json", "link", "show"], capture_output=True, text=True, check=True,
                       timeout=30).stdout)}
    bridges = set(subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True,
                                 timeout=30).stdout.split())
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True,
                               timeout=30).stdout.split())
    return {"links": links, "bridges": bridges, "netns": netns}


def run_trusted(load, options, results_dir: Path):
    """A run whose test bounds depend on timing: ``load(extra_overrides)`` gives the
    scenario, ``options(results_dir)`` the run options. If the fidelity guard does not trust
    the run, it is rerun once at the dilation the guard suggests. Returns (result, fidelity);
    the caller asserts the verdict (its text in the message) before its timing bounds."""
    from testbed import run

    result = run.run(load([]), options(results_dir))
    fidelity = json.loads((result.run_dir / "summary.json").read_text())["fidelity"]
    if result.status == "ok" and fidelity["verdict"] == "not trusted" and fidelity["suggested_dilation"]:
        again = results_dir / "rerun"
        again.mkdir(exist_ok=True)
        result = run.run(load([f"dilation={fidelity['suggested_dilation']}"]), options(again))
        fidelity = json.loads((result.run_dir / "summary.json").read_text())["fidelity"]
    return result, fidelity
