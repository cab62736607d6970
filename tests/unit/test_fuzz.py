"""Bad input, generated: a seeded fuzz over every field of the shipped scenarios, topologies
and workloads (through files and through --set) and over raw bytes. Every case must end
in exit 2 with one line per problem that names the file (or --set) and the YAML path, no
traceback, and nothing created; values the physics forbids are refused with the reason."""

import json
import math
import random
import re

import pytest
import yaml

from testbed.paths import ROOT
from testbed import cli
from testbed.config import source

SEED = 20261203
CASES = 400
LINE = re.compile(r"^error: (?P<where>[^:]+(?::[^:]+)?): .+$")

# values no field of any kind accepts (each field gets those of the wrong kind for it)
BAD = {
    "number": [float("inf"), float("nan"), -1, -1e300, 1e300, 0.5e-300, "abc", [1], {"a": 1}, True],
    "count": [-1, 1.5, 10 ** 9, "two", [2], {"n": 2}, True, float("inf")],
    "unit": ["0.1bps", "-5G", "1e300km", ".inf", "nanMB", "1e400G", "5 parsecs", "G", -4, [1], {"r": 1}, True],
    "name": ["../../../etc/passwd", "/etc/passwd", "..\\..\\x", "a" * 500, "", "UPPER", "x/../../y", 7, [1]],
    "mapping": ["text", 3, [1, 2], True],
    "switch": ["maybe", 3, [1], {"x": 1}, 0.5],
    "list": ["text", 3, {"a": 1}],
}


def leaves(doc, path=()):
    """(path, value) of every scalar and the containers themselves."""
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            yield from leaves(v, path + (k,))
    elif isinstance(doc, list):
        yield path, doc
        for i, v in enumerate(doc):
            yield from leaves(v, path + (i,))
    else:
        yield path, doc


def kind_of(path, value) -> str:
    last = path[-1] if path else ""
    if last in ("dcqcn", "ecn", "pfc"):
        return "switch"  # on, off (or a mapping of settings)
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if last in ("name", "topology", "traffic", "kind", "datapath", "algorithm", "mapping", "pipeline_schedule"):
        return "name"
    if isinstance(value, str) or last in ("rate", "cable", "buffer", "kmin", "kmax", "xoff", "xon", "headroom",
                                           "bytes", "bucket", "forward", "backward", "activations"):
        return "unit"
    if isinstance(value, bool) or isinstance(value, int):
        return "count"
    return "number"


def documents():
    """Every shipped scenario as resolved (its topology and workload merged in)."""
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        doc, *_ = source.resolve(path.stem)
        yield path.stem, doc


def field_cases(rng):
    docs = list(documents())
    out = []
    for _ in range(CASES):
        name, doc = rng.choice(docs)
        candidates = [(p, v) for p, v in leaves(doc) if p and p[0] not in ("description",)
                      and p[-1] != "description"]
        path, value = rng.choice(candidates)
        bad = rng.choice(BAD[kind_of(path, value)])
        out.append((name, path, bad, rng.random() < 0.5))
    return out


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    before = set((ROOT / "results").iterdir())
    code = cli.main(["show", *map(str, argv)])
    out, err = capsys.readouterr()
    assert set((ROOT / "results").iterdir()) == before  # nothing created
    return code, out, err


def check_refused(code, out, err, names):
    assert code == 2, (code, out[-500:], err[-2000:])
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert lines and all(LINE.match(line) for line in lines), err[-2000:]
    assert all(any(n in line for n in names) for line in lines), (names, err[-2000:])


def as_yaml(value) -> str:
    """A value as --set takes it (YAML on one line)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value)


def path_text(path) -> str:
    return source.format_path(path)


@pytest.mark.parametrize("case", range(CASES))
def test_fuzzed_fields_are_refused(case, capsys, tmp_path):
    name, path, bad, as_file = field_cases(random.Random(SEED))[case]
    if not as_file or not _writable(path):
        text = f"{path_text(path)}={as_yaml(bad)}"
        code, out, err = run_cli(capsys, name, "--set", text)
        check_refused(code, out, err, ["--set", f"scenarios/{name}.yaml", "topologies/", "traffic/"])
    else:
        doc, *_ = source.resolve(name)
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = bad
        doc.pop("topology", None), doc.pop("traffic", None)
        scenario = {"name": doc.pop("name"), "topology": _topology_of(name), **{k: v for k, v in doc.items()
                                                                                 if k != "fabric"},
                    "fabric": doc.get("fabric")}
        f = tmp_path / "fuzz.yaml"
        f.write_text(yaml.safe_dump(scenario))
        code, out, err = run_cli(capsys, f)
        check_refused(code, out, err, [str(f)])


def _writable(path) -> bool:
    return path[0] not in ("topology", "traffic")


def _topology_of(name) -> str:
    return yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())["topology"]


RAW = {
    "binary": bytes(range(256)) * 4,
    "latin1": "name: caf\xe9\n".encode("latin-1"),
    "utf16": "name: x\n".encode("utf-16"),
    "deep-flow": b"a: " + b"[" * 20000 + b"]" * 20000,
    "deep-block": "".join("  " * i + f"k{i}:\n" for i in range(200)).encode(),
    "laughs": b"a: &a [x,x,x,x,x,x,x,x,x]\n" + b"".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi")),
    "list": b"- 1\n- 2\n",
    "scalar": b"42\n",
    "not-yaml": b"a: [1, 2\n",
    "tabs": b"name:\t\tx\n\tkind: y\n",
    "huge": b"name: " + b"x" * 2_000_000 + b"\n",
}


@pytest.mark.parametrize("kind", sorted(RAW))
def test_raw_bytes_are_refused(kind, capsys, tmp_path):
    f = tmp_path / f"{kind}.yaml"
    f.write_bytes(RAW[kind])
    code, out, err = run_cli(capsys, f)
    check_refused(code, out, err, [str(f)])
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("sets,reason", [
    (["fabric.host_link.rate=0.1bps"], "expected a rate of at least 1Kbit/s"),
    (["queues.buffer=0"], "kmax (400KB) must not exceed the buffer (0B)"),
    (["queues.buffer=0", "queues.ecn=off", "queues.pfc=off"], "a 0-byte buffer cannot hold the 8428 bytes"),
    (["workload.collective.bytes=0"], "each rank's share must be at least one 4-byte word"),
    (["dilation=.inf"], "expected 'auto' or a number from 1 to 1e+07"),
    (["fabric.host_link.rate=10G", "dilation=1e7"], "the slowest link (10Gbit/s real) runs at 1000 bit/s here"),
    (["fabric.host_link.cable=1e300km"], "expected a cable length of at most 100km"),
    (["queues.ecn.kmax=5MB"], "kmax (5MB) must not exceed the buffer"),
    (["workload.activations=0"], "expected at least 4 bytes of activations"),
    (["queues.ecn.pmax=1.0e-12"], "pmax 1e-12 is below the marker's resolution (1/4294967296 = 2.3e-10)"),
    # a kmin the user set is never lowered to a derived kmax: 200 KB at 40G is 2 MB at 400G
    (["queues.ecn={kmin: 3MB}"], "kmin 3MB is above the kmax derived at 400G (2MB"),
])
def test_physics_refuses_with_the_reason(sets, reason, capsys):
    argv = ["default"]
    for s in sets:
        argv += ["--set", s]
    code, out, err = run_cli(capsys, *argv)
    check_refused(code, out, err, ["--set", "scenarios/default.yaml"])
    assert reason in err, err


@pytest.mark.parametrize("argv", [
    ["run", "--set", "dilation=.inf"], ["run", "--set", "topology=../../etc/passwd"],
    ["run", "tests/golden/invalid/path-traversal.yaml"], ["run", "--set", "fabric.host_link.rate=0"],
])
def test_run_refuses_before_creating_anything(argv, capsys):
    before = set((ROOT / "results").iterdir())
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and err.startswith("error: ")
    assert set((ROOT / "results").iterdir()) == before
