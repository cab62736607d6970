"""Scenario parsing: golden invalid files with exact messages, overrides, valid files."""

import subprocess
import sys

import pytest

from helpers import GOLDEN
from testbed.paths import ROOT
from testbed.config import scenario
from testbed.errors import ConfigError

INVALID = sorted((GOLDEN / "invalid").glob("*.yaml"))


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_golden(path, in_repo):
    """The CLI prints exactly the expected messages, exits 2, no traceback, creates nothing."""
    rel = path.relative_to(ROOT)
    before = set((ROOT / "results").iterdir())
    res = subprocess.run([sys.executable, "-m", "testbed", "show", str(rel)], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == path.with_suffix(".expected").read_text()
    assert "Traceback" not in res.stderr
    assert set((ROOT / "results").iterdir()) == before


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml")))
def test_shipped_scenarios_are_valid(name):
    sc = scenario.load(name)
    assert sc.name == name
    assert sc.fabric.leaves


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "topologies").glob("*.yaml")))
def test_topology_file_runs_as_a_scenario(name):
    sc = scenario.load(f"topologies/{name}")
    assert sc.topology_source.endswith(name)


def test_overrides_are_applied_and_validated_like_the_file():
    sc = scenario.load("default", ["fabric.spines=4", "fabric.uplinks.count=4", "queues.ecn.kmin=100KB",
                                   "queues.ecn.kmax=200KB", "dilation=2000"])
    assert sc.fabric.spines == 4
    assert sc.fabric.leaves[0].uplinks.count == 4
    assert sc.queues.ecn.kmin_bytes == 100_000
    assert sc.dilation == 2000
    assert sc.resolved["fabric"]["spines"] == 4  # the manifest records what ran
    with pytest.raises(ConfigError) as err:
        scenario.load("default", ["fabric.spines=three", "queues.ecn.kmin=lots"])
    assert err.value.problems == [
        "--set fabric.spines=three: expected an integer, got 'three'",
        "--set queues.ecn.kmin=lots: expected a size like 32MB, 100KB, 9000B, got 'lots'",
    ]


def test_override_into_a_list_and_off_switches():
    sc = scenario.load("topologies/leaf-spine.yaml", ["fabric.leaves=[{hosts: 2}, {hosts: 4}]",
                                                      "fabric.leaves[1].hosts=6", "queues.ecn=off",
                                                      "queues.pfc=off"])
    assert [leaf.hosts for leaf in sc.fabric.leaves] == [2, 6]
    assert sc.queues.ecn is None and sc.queues.pfc is None


@pytest.mark.parametrize("text,message", [
    ("spines", "--set spines: expected PATH=VALUE, for example fabric.spines=4"),
    ("fabric.leaves[9].hosts=1", "--set fabric.leaves[9].hosts=1: fabric.leaves is not a list"),
    ("topology=rail-4x8", "--set topology=rail-4x8: choose the topology with the scenario argument, not --set"),
])
def test_bad_overrides(text, message):
    with pytest.raises(ConfigError) as err:
        scenario.load("default", [text])
    assert err.value.problems == [message]


def test_missing_scenario_lists_known(in_repo):
    with pytest.raises(ConfigError) as err:
        scenario.load("nope")
    assert err.value.problems[0].startswith("scenario: unknown scenario 'nope' (known: chakra-dp8, collisions, default, incast, leaf-spine, rail-32, two-jobs")


def test_names_reaching_paths_are_validated():
    with pytest.raises(ConfigError) as err:
        scenario.load("../etc/passwd")
    assert "not found" in err.value.problems[0]
    with pytest.raises(ConfigError):
        scenario.load("default", ["name=a" * 20])


def test_run_with_bad_input_creates_nothing(in_repo, tmp_path):
    """run validates before it touches the machine: exit 2, no traceback, no results folder."""
    res = subprocess.run([sys.executable, "-m", "testbed", "run", "default", "--set", "fabric.spines=-1",
                          "--results", str(tmp_path / "results")], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert res.returncode == 2
    assert res.stderr == ("error: --set fabric.spines=-1: expected an integer between 0 and 64, got -1\n")
    assert not (tmp_path / "results").exists()


def test_routing_is_ecmp_or_adaptive_with_at_most_16_choices():
    assert scenario.load("collisions").fabric.routing == "ecmp"
    assert scenario.load("collisions", ["fabric.routing=adaptive"]).fabric.routing == "adaptive"
    with pytest.raises(ConfigError) as err:
        scenario.load("collisions", ["fabric.routing=cheapest"])
    assert err.value.problems == ["--set fabric.routing=cheapest: expected one of ecmp, adaptive, got 'cheapest'"]
    with pytest.raises(ConfigError) as err:
        scenario.load("collisions", ["fabric.routing=adaptive", "fabric.spines=2", "fabric.uplinks.count=18"])
    assert err.value.problems == ["--set fabric.routing=adaptive: adaptive routing chooses among at most 16 ports "
                                  "per hop; leaf 1 has 18 uplinks"]
