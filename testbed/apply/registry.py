"""What a run created, recorded before it is created, so ``testbed clean`` removes exactly ours.

Each run writes ``/run/testbed/<run_id>.json``: its own PID (and start time, so a
reused PID is never mistaken for it), the OVS bridges, root-namespace interfaces
and processes it made. Bridges also carry ``external_ids:testbed-run=<run_id>``
and interfaces the alias ``testbed:<run_id>``, so a resource is removed only if it
is tagged with a dead run's id (or, untagged, is listed by that dead run).
Nothing here matches processes by name.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

LOG = logging.getLogger(__name__)
REGISTRY_DIR = Path(os.environ.get("TESTBED_REGISTRY", "/run/testbed"))
TAG_KEY = "testbed-run"
ALIAS_PREFIX = "testbed:"
CMD_TIMEOUT_S = 30


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, waiting to be reaped: gone for our purposes
        return None
    return int(fields[19])


def process_alive(pid: int, start_time: int | None) -> bool:
    current = proc_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


class RunRecord:
    """The registry file of one run. Updated as resources are about to be created."""

    def __init__(self, run_id: str, results_dir: str):
        self.path = REGISTRY_DIR / f"{run_id}.json"
        self.data = {"run_id": run_id, "pid": os.getpid(), "start_time": proc_start_time(os.getpid()),
                     "results_dir": results_dir, "bridges": [], "interfaces": [], "processes": []}

    def __enter__(self):
        REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
        self._save()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
        return False

    def add(self, bridges=(), interfaces=(), processes=()):
        """``processes``: PIDs; their start times are recorded now."""
        self.data["bridges"] += list(bridges)
        self.data["interfaces"] += list(interfaces)
        self.data["processes"] += [{"pid": p, "start_time": proc_start_time(p)} for p in processes]
        self._save()

    def _save(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def _run(argv, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=check)


def tag_bridges(run_id: str, bridges) -> None:
    argv = ["ovs-vsctl"]
    for br in bridges:
        argv += ["--", "set", "Bridge", br, f"external_ids:{TAG_KEY}={run_id}"]
    if len(argv) > 1:
        _run(argv)


def tag_interfaces(run_id: str, interfaces) -> None:
    """Set the interface alias (IFLA_IFALIAS) of each root-namespace interface."""
    lines = "".join(f"link set dev {i} alias {ALIAS_PREFIX}{run_id}\n" for i in interfaces)
    if lines:
        subprocess.run(["ip", "-batch", "-"], input=lines, text=True, capture_output=True,
                       timeout=CMD_TIMEOUT_S, check=True)


def live_runs() -> dict:
    """run_id -> record for every registered run whose owner process still exists."""
    out = {}
    for path in sorted(REGISTRY_DIR.glob("*.json")) if REGISTRY_DIR.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if process_alive(data["pid"], data.get("start_time")):
            out[data["run_id"]] = data
    return out


def _tagged_bridges() -> dict:
    """bridge -> run id, for every OVS bridge carrying our tag."""
    try:
        res = _run(["ovs-vsctl", "--format=json", "--columns=name,external_ids", "list", "Bridge"])
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for name, ext in json.loads(res.stdout)["data"]:
        ids = dict(ext[1]) if ext[0] == "map" else {}
        if TAG_KEY in ids:
            out[name] = ids[TAG_KEY]
    return out


def _interfaces() -> dict:
    """root-namespace interface -> alias (or None)."""
    res = _run(["ip", "-json", "link", "show"])
    return {link["ifname"]: link.get("ifalias") for link in json.loads(res.stdout)}


def clean(dry_run: bool = False) -> list[str]:
    """Remove what dead runs left behind. Returns one line per action."""
    live = live_runs()
    actions = []
    records = []
    for path in sorted(REGISTRY_DIR.glob("*.json")) if REGISTRY_DIR.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data["run_id"] not in live:
            records.append((path, data))
    # 1. processes (host shells, controller, agents), by PID and verified start time
    for _, data in records:
        for proc in data.get("processes", []):
            if process_alive(proc["pid"], proc["start_time"]):
                actions.append(f"kill process {proc['pid']} (run {data['run_id']})")
                if not dry_run:
                    try:
                        os.kill(proc["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    # 2. OVS bridges tagged with a dead run, or listed by a dead run and untagged
    tagged = _tagged_bridges()
    listed = {br: data["run_id"] for _, data in records for br in data.get("bridges", [])}
    doomed = sorted(br for br, rid in tagged.items() if rid not in live)
    try:
        existing = set(_run(["ovs-vsctl", "list-br"]).stdout.split())
    except (OSError, subprocess.SubprocessError):
        existing = set()
    doomed += sorted(br for br in listed if br in existing and br not in tagged)
    for br in doomed:
        actions.append(f"delete OVS bridge {br} (run {tagged.get(br) or listed[br]})")
        if not dry_run:
            _run(["ovs-vsctl", "--if-exists", "del-br", br], check=False)
    # 3. interfaces (veth ends, NVLink bridges) with a dead run's alias, or listed and untagged
    listed_if = {i: data["run_id"] for _, data in records for i in data.get("interfaces", [])}
    for name, alias in sorted(_interfaces().items()):
        rid = alias[len(ALIAS_PREFIX):] if alias and alias.startswith(ALIAS_PREFIX) else None
        if (rid and rid not in live) or (rid is None and not alias and name in listed_if):
            actions.append(f"delete interface {name} (run {rid or listed_if[name]})")
            if not dry_run:
                _run(["ip", "link", "del", "dev", name], check=False)
    # 4. pinned BPF programs and maps of runs that are not live
    pin_root = Path("/sys/fs/bpf/testbed")
    for pins in sorted(pin_root.iterdir()) if pin_root.is_dir() else []:
        if pins.name not in live:
            actions.append(f"unpin BPF objects {pins}")
            if not dry_run:
                shutil.rmtree(pins, ignore_errors=True)
    # 5. the registry files themselves
    for path, data in records:
        actions.append(f"forget run {data['run_id']} (results kept in {data.get('results_dir')})")
        if not dry_run:
            path.unlink(missing_ok=True)
    return actions


def wait_gone(pids, deadline_s: float) -> None:
    """Poll until the given processes have exited (raises TimeoutError naming the survivors)."""
    end = time.monotonic() + deadline_s
    while True:
        alive = [p for p in pids if proc_start_time(p) is not None]
        if not alive:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"processes still running after {deadline_s}s: {alive}")
        time.sleep(0.05)
