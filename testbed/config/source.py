"""Reading what the user wrote: scenario, topology and workload files (by name in the repo's
folders, or by path), merged into one document, with ``--set PATH=VALUE`` overrides
applied; every part of the document remembers the file (or ``--set``) it came from, so a
problem can name it with its YAML path."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import ConfigError
from testbed.paths import ROOT, SCENARIO_DIR, TOPOLOGY_DIR, TRAFFIC_DIR

DEFAULT_SCENARIO = "default"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


class Origins:
    """Remembers which file (or --set) each part of the resolved document came from."""

    def __init__(self):
        self._entries: list[tuple[tuple, str, tuple]] = []

    def add(self, path: tuple, label: str, base: tuple = ()):
        self._entries.append((tuple(path), label, tuple(base)))

    def locate(self, path: tuple) -> str:
        best = None
        for entry_path, label, base in self._entries:
            if path[: len(entry_path)] == entry_path and (best is None or len(entry_path) >= len(best[0])):
                best = (entry_path, label, base)
        if best is None:
            return format_path(path)
        entry_path, label, base = best
        rest = format_path(base + path[len(entry_path):])
        return f"{label}: {rest}" if rest else label


def short(text: str, limit: int = 100) -> str:
    """A --set argument as messages name it: cut, so a huge value stays one readable line."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def format_path(path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        try:
            return str(path.resolve().relative_to(ROOT))
        except ValueError:
            return str(path)


MAX_DEPTH = 32  # no scenario, topology or workload nests deeper than a few levels
MAX_FILE_BYTES = 1_000_000


def _read_yaml(path: Path, label: str) -> dict:
    """A YAML mapping from a UTF-8 text file; every way it can be something else is one
    ConfigError naming the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{label}: {len(data)} bytes is not a scenario, topology or workload file (at most "
                          f"{MAX_FILE_BYTES})")
    if b"\0" in data:
        raise ConfigError(f"{label}: a binary file, not YAML text (a NUL byte at offset {data.index(0)})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{label}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{label}: nested more than {MAX_DEPTH} levels deep") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{label}: expected a mapping at the top level, got {type(doc).__name__}")
    too_deep = _deeper_than(doc, MAX_DEPTH)
    if too_deep is not None:
        raise ConfigError(f"{label}: {format_path(too_deep)}: nested more than {MAX_DEPTH} levels deep")
    return doc


def _deeper_than(doc, limit: int):
    """The path of the first value nested deeper than ``limit`` (None if there is none),
    without recursion (a document may be nested thousands deep)."""
    stack, seen = [(doc, ())], set()
    while stack:
        node, path = stack.pop()
        if len(path) > limit:
            return path[:limit + 1]
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue  # YAML aliases share a node: walk it once (a "billion laughs" file stays cheap)
        seen.add(id(node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((v, path + (k,)) for k, v in items)
    return None


def _find(ref, directory: Path, what: str, label: str, any_path: bool = False) -> Path:
    """A scenario, topology or workload by name (``rail-2x4``: ``directory/rail-2x4.yaml``)
    or by path. ``any_path``: the command line's scenario may be any file of the user's;
    a file's ``topology:`` and ``traffic:`` are read from the repository's folders only (a
    name, or a path that stays inside ``directory``)."""
    folder = f"{directory.name}/"
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{label}: expected the name of a file in {folder}, got {ref!r}")
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not any_path:
            inside = [c.resolve() for c in (ROOT / candidate, directory / candidate)
                      if c.resolve().is_relative_to(directory.resolve())]
            if not inside:
                raise ConfigError(f"{label}: expected the name of a file in {folder}, got {ref!r} (a scenario "
                                  f"reads its {what} from the repository's {folder} only)")
            candidate = inside[0]
        if candidate.is_file():
            return candidate
        raise ConfigError(f"{label}: {what} file {ref!r} not found")
    if not NAME_RE.fullmatch(ref):
        raise ConfigError(f"{label}: {what} name {ref!r} is not valid (lowercase letters, digits, - and _)")
    path = directory / f"{ref}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ConfigError(f"{label}: unknown {what} {ref!r} (known: {', '.join(known)})")
    return path


def _deep_merge(base: dict, top: dict, origins: Origins, path: tuple, label: str, base_path: tuple):
    for key, value in top.items():
        here = path + (key,)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value, origins, here, label, base_path + (key,))
        else:
            base[key] = copy.deepcopy(value)
            origins.add(here, label, base_path + (key,))


_SET_RE = re.compile(r"(?P<path>[A-Za-z_][A-Za-z0-9_]*(?:\[[0-9]+\]|\.[A-Za-z_][A-Za-z0-9_]*)*)=(?P<value>.*)", re.S)


def parse_set(text: str) -> tuple[tuple, Any]:
    """``"fabric.leaves[1].hosts=4"`` -> (("fabric", "leaves", 1, "hosts"), 4)."""
    m = _SET_RE.fullmatch(text)
    if not m:
        raise ConfigError(f"--set {short(text)}: expected PATH=VALUE, for example fabric.spines=4")
    path = tuple(
        int(tok[1:-1]) if tok.startswith("[") else tok
        for tok in re.findall(r"\[[0-9]+\]|[A-Za-z_][A-Za-z0-9_]*", m.group("path"))
    )
    try:
        value = yaml.safe_load(m.group("value")) if m.group("value").strip() else None
    except yaml.YAMLError:
        value = m.group("value")
    except RecursionError:
        raise ConfigError(f"--set {short(text)}: nested more than {MAX_DEPTH} levels deep") from None
    too_deep = _deeper_than(value, MAX_DEPTH - len(path))
    if too_deep is not None:
        raise ConfigError(f"--set {short(text)}: nested more than {MAX_DEPTH} levels deep")
    return path, value


def _apply_set(doc: dict, path: tuple, value, text: str):
    node = doc
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError(f"--set {short(text)}: {format_path(path[: i + 1])} does not exist")
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"--set {short(text)}: {format_path(path[:i])} is not a mapping")
        if node.get(part) is None or (isinstance(nxt, str) and not isinstance(node[part], dict)):
            if isinstance(nxt, int):
                raise ConfigError(f"--set {short(text)}: {format_path(path[: i + 1])} is not a list")
            node[part] = {}
        node = node[part]
    last = path[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"--set {short(text)}: {format_path(path)} does not exist")
    elif not isinstance(node, dict):
        raise ConfigError(f"--set {short(text)}: {format_path(path[:-1])} is not a mapping")
    node[last] = value


CHAKRA = "chakra:"


def _workload(traffic_ref, overrides, target: dict, origins: Origins, path: tuple, scenario_label: str):
    """``target["workload"]`` from a ``traffic:`` reference (a file in traffic/, or a Chakra
    trace) with a ``workload:`` mapping of overrides merged in; ``path`` is where ``target``
    sits in the resolved document (``()`` or ``("jobs", i)``)."""
    where = f"{scenario_label}: {format_path(path + ('traffic',))}"
    if isinstance(traffic_ref, str) and traffic_ref.startswith(CHAKRA):
        # a Chakra trace (PREFIX.<rank>.et) replayed as the workload (config.workload._chakra)
        prefix = traffic_ref[len(CHAKRA):]
        target["traffic"] = traffic_ref
        target["workload"] = {"name": _trace_name(prefix), "chakra": {"prefix": prefix}}
        origins.add(path + ("workload",), f"{where} {traffic_ref}")
    elif traffic_ref is not None:
        if not isinstance(traffic_ref, str):
            raise ConfigError(f"{where}: expected the name of a file in traffic/, got {traffic_ref!r}")
        traffic_path = _find(traffic_ref, TRAFFIC_DIR, "workload", where)
        traffic_label = _display(traffic_path)
        target["traffic"] = traffic_label
        target["workload"] = _read_yaml(traffic_path, traffic_label)
        origins.add(path + ("workload",), traffic_label)
    if isinstance(overrides, dict):
        target.setdefault("workload", {})
        _deep_merge(target["workload"], overrides, origins, path + ("workload",), scenario_label, path + ("workload",))
    elif overrides is not None:
        raise ConfigError(f"{scenario_label}: {format_path(path + ('workload',))}: expected a mapping of workload "
                          f"fields to override")


def _trace_name(prefix: str) -> str:
    """A workload name from a trace prefix: ``chakra/dp8/step`` -> ``dp8-step``."""
    parts = [p for p in Path(prefix).parts[-2:] if p not in ("/", "..", ".")]
    name = re.sub(r"[^a-z0-9_-]+", "-", "-".join(parts).lower()).strip("-_")[:32]
    return name if name and NAME_RE.fullmatch(name) else "chakra"


def resolve(ref: str | None = None, overrides: list[str] | tuple = ()) -> tuple:
    """The scenario document by name or path (a topology file is accepted too) with its
    topology and workload merged in and ``--set`` overrides applied: (document, origins,
    scenario label, topology label). Raises ConfigError for what stops reading."""
    ref = ref or DEFAULT_SCENARIO
    path = _find(ref, SCENARIO_DIR, "scenario", "scenario", any_path=True)
    label = _display(path)
    doc = _read_yaml(path, label)
    origins = Origins()
    if "kind" in doc and "topology" not in doc:
        # A bare topology file: run it with the default scenario settings.
        topo_doc, topo_label = doc, label
        doc = {"name": re.sub(r"[^a-z0-9_-]", "-", path.stem.lower())[:32] or "topology"}
        scenario_label = "(defaults)"
    else:
        scenario_label = label
        topo_ref = doc.get("topology")
        if not isinstance(topo_ref, str):
            raise ConfigError(f"{label}: topology: expected the name of a file in topologies/, got {topo_ref!r}")
        topo_path = _find(topo_ref, TOPOLOGY_DIR, "topology", f"{label}: topology")
        topo_label = _display(topo_path)
        topo_doc = _read_yaml(topo_path, topo_label)
    origins.add((), scenario_label)
    resolved = {k: copy.deepcopy(v) for k, v in doc.items() if k not in ("topology", "fabric")}
    resolved["topology"] = topo_label
    resolved["fabric"] = copy.deepcopy(topo_doc)
    origins.add(("fabric",), topo_label)
    if isinstance(doc.get("fabric"), dict):
        _deep_merge(resolved["fabric"], doc["fabric"], origins, ("fabric",), scenario_label, ("fabric",))
    elif doc.get("fabric") is not None:
        raise ConfigError(f"{scenario_label}: fabric: expected a mapping of topology fields to override")
    _workload(doc.get("traffic"), doc.get("workload"), resolved, origins, (), scenario_label)
    for text in overrides:
        set_path, value = parse_set(text)
        if set_path[0] == "topology":
            raise ConfigError(f"--set {short(text)}: choose the topology with the scenario argument, not --set")
        if set_path[0] == "traffic":
            raise ConfigError(f"--set {short(text)}: choose the workload with traffic: in the scenario file; "
                              f"override its fields with --set workload.FIELD=VALUE")
        _apply_set(resolved, set_path, value, text)
        origins.add(set_path, f"--set {short(text)}")
    for i, job in enumerate(resolved.get("jobs") if isinstance(resolved.get("jobs"), list) else ()):
        if isinstance(job, dict) and "traffic" in job:  # each job's workload, as traffic: and workload: give one
            traffic, job_overrides = job.pop("traffic"), job.pop("workload", None)
            _workload(traffic, job_overrides, job, origins, ("jobs", i), scenario_label)
    return resolved, origins, label, topo_label
