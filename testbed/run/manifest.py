"""The run's manifest (``manifest.json``): what ran, on what, with what outcome, as typed
fields. Written when the run starts (status ``running``), after the checks (``up``) and at
the end, so even an interrupted run leaves a folder that says what happened."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from testbed import __version__


@dataclass
class Queues:
    ports: int
    pins: str  # the run's bpffs folder (marker and PFC maps)
    pfc: bool  # a PFC process sends 802.1Qbb frames from congested queues to their feeders
    shaper: str = "tbf"
    marker: str = "bpf-clsact-egress"


@dataclass
class Manifest:
    run_id: str
    scenario: str
    datapath: str
    dilation: float
    dilation_reason: str
    seed: int
    link_delay_emulated: bool  # netem holds every packet for its cable delay x dilation
    versions: dict
    status: str = "running"  # running | up | ok | failed | interrupted
    reason: str = ""
    started_utc: str = field(default_factory=lambda: now_utc())
    ended_utc: str | None = None
    telemetry: dict | None = None  # the plan's telemetry settings
    queues: Queues | None = None
    reachability: dict | None = None  # {"pairs": N, "failures": [...]}
    pcap: dict | None = None
    workload: dict | None = None  # {"iterations": N}
    training: dict | None = None  # headline of training.json
    pfc: dict | None = None  # the PFC process's totals
    routing: dict | None = None  # adaptive routing: {"mode", "decisions", "moved"}
    cluster: dict | None = None  # a run across servers: servers, placement, clock offsets (run.coordination)
    machine_speed: dict | None = None  # the speed probe behind an automatic dilation (apply.speed)
    timings_s: dict = field(default_factory=dict)

    def write(self, run_dir: Path):
        tmp = run_dir / "manifest.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, run_dir / "manifest.json")


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat()


def _pkg_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(tool_version) -> dict:
    """The software a run ran on; ``tool_version(argv)`` asks a command for its version."""
    return {"testbed": __version__, "python": sys.version.split()[0], "kernel": platform.release(),
            "openvswitch": tool_version(["ovs-vsctl", "--version"]), "mininet": _pkg_version("mininet"),
            "os-ken": _pkg_version("os-ken"), "pyroute2": _pkg_version("pyroute2"), "scapy": _pkg_version("scapy"),
            "iproute2": tool_version(["ip", "-V"])}
