"""Checking a lab: find its runs, load them, ask the lab's ``check.py`` for its
observations, and say per observation whether it held, in words (no root needed).

A lab's ``check.py`` defines ``observe(runs)`` returning ``Observation``s; ``runs`` maps
each run's scenario name (``lab04-buffer-16KB``) to a ``RunView``. Every check starts with
``trusted(runs)``: a run the fidelity guard did not trust cannot answer the lab's
question, whatever its numbers say.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from testbed.errors import ConfigError


@dataclass(frozen=True)
class Observation:
    """One expectation of a lab: ``claim`` in words, what was ``measured``, what was
    ``expected`` (with its tolerance) and ``why`` the physics expects it."""

    claim: str
    ok: bool
    measured: str
    expected: str
    why: str


class RunView:
    """One run folder: its summary, plan, manifest and scenario as dicts; its DataFrames
    (``results.load``) on first use."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.manifest = _json(self.dir / "manifest.json")
        self.name = self.manifest.get("scenario", "")

    @cached_property
    def summary(self) -> dict:
        from testbed.views.report import load_summary

        return load_summary(self.dir)

    @cached_property
    def plan(self) -> dict:
        return _json(self.dir / "plan.json")

    @cached_property
    def results(self):
        from testbed.analysis import results

        return results.load(self.dir)

    @cached_property
    def training(self) -> dict:
        return _json(self.dir / "training.json")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path.parent}: not a run folder (no {path.name})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc})") from None


def run_names(lab, parse_args) -> list[str]:
    """The scenario name of each of the lab's runs, in the README's order; ``parse_args``
    is the CLI's (argv -> its namespace), given by the CLI: labs sit below it."""
    from testbed.config import scenario

    names = []
    for cmd in lab.runs:
        args = parse_args(list(cmd.argv))
        names.append(scenario.load(args.scenario, args.overrides).name)
    return names


def newest(results_dir: Path, name: str) -> Path | None:
    """The newest run folder of scenario ``name`` in ``results_dir`` (by its UTC stamp)."""
    if not results_dir.is_dir():
        return None
    found = []  # (start, folder name, folder): each manifest read once
    for p in results_dir.iterdir():
        if p.is_dir() and p.name.startswith(name + "-") and (p / "manifest.json").is_file():
            manifest = _json(p / "manifest.json")
            if manifest.get("scenario") == name:
                found.append((manifest.get("started_utc", ""), p.name, p))
    return max(found)[2] if found else None


def collect(lab, results_dir: Path, given: list[Path], parse_args) -> dict:
    """name -> RunView: the given run folders (each must be one of the lab's runs), the
    newest in ``results_dir`` for the others. A missing or foreign run is a ConfigError."""
    names = run_names(lab, parse_args)
    runs = {}
    for d in given:
        if not Path(d).is_dir():
            raise ConfigError(f"{d}: no such run folder")
        view = RunView(d)
        if view.name not in names:
            raise ConfigError(f"{d}: a run of scenario {view.name!r}, not one of lab {lab.number}'s runs "
                              f"({', '.join(names)})")
        runs[view.name] = view
    for name in names:
        if name not in runs:
            path = newest(results_dir, name)
            if path is None:
                raise ConfigError(f"no run of {name} in {results_dir}: python -m testbed lab run {lab.number} "
                                  f"makes it")
            runs[name] = RunView(path)
    return runs


def load_check(lab):
    spec = importlib.util.spec_from_file_location(f"testbed_lab_{lab.number:02d}", lab.path / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trusted(runs: dict) -> Observation:
    """Every run finished and the fidelity guard trusted it (the first observation of every lab)."""
    bad = []
    for name, view in runs.items():
        s = view.summary
        status, fid = s["run"].get("status"), s.get("fidelity", {})
        if status != "ok":
            bad.append(f"{name}: status {status} ({s['run'].get('reason')})")
        elif fid.get("verdict") == "not trusted":
            bad.append(f"{name}: not trusted ({fid.get('text')})" + (
                f"; rerun with --set dilation={fid['suggested_dilation']}" if fid.get("suggested_dilation") else ""))
    return Observation("every run finished and the fidelity guard trusted it", not bad,
                       "; ".join(bad) or f"{len(runs)} run(s) ok and trusted", "status ok, fidelity trusted",
                       "a run the machine could not keep up with measures the machine, not the fabric")


def check(lab, results_dir: Path, given: list[Path], parse_args) -> tuple[dict, list[Observation]]:
    runs = collect(lab, results_dir, given, parse_args)
    first = trusted(runs)
    return runs, [first] + list(load_check(lab).observe(runs))


def render(lab, runs: dict, observations: list[Observation]) -> str:
    lines = [f"lab {lab.number}: {lab.title}"]
    lines += [f"  run {name}: {view.dir}" for name, view in runs.items()]
    for o in observations:
        lines.append(f"  {'PASS' if o.ok else 'FAIL'}  {o.claim}")
        lines.append(f"        measured: {o.measured}")
        if not o.ok:
            lines.append(f"        expected: {o.expected}")
            lines.append(f"        why: {o.why}")
    held = sum(o.ok for o in observations)
    lines.append(f"lab {lab.number}: {held} of {len(observations)} observations hold"
                 + ("" if held == len(observations) else "; the FAIL lines say which changed and why"))
    return "\n".join(lines)
