"""A run across servers, from the coordinator (``testbed run --cluster HERE,SERVER,...``;
docs/cluster.md): which servers, where the plan is placed, what each is sent
(``Layout``); training (its own GPUs' agents and every other server's share,
``apply.cluster.remote_share.RemoteShare`` and run/share.py, start on one deadline, run to the end,
and their records land in one folder on one time line); and each share's queue telemetry
gathered into the run folder.

The start time is this machine's CLOCK_MONOTONIC plus a margin; each server gets it
shifted by its clock offset, measured over its share's own session just before (the best
of CLOCK_SAMPLES round trips, ``apply.cluster.ssh.best_offset``). A server's records come back
in its clock and are shifted back (``model.placement.to_coordinator_clock``). The offsets
and their errors are returned, for the run's manifest and the fidelity guard.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.apply.processes.agents import READY_TIMEOUT_S
from testbed.errors import ConfigError
from testbed.model import placement
from testbed.model.placement import to_coordinator_clock

LOG = logging.getLogger(__name__)
START_MARGIN_S = 2.0  # the train command crosses ssh to every server before the start
RECORDS_TIMEOUT_S = 60
CMD_TIMEOUT_S = 20


def local_addresses() -> set:
    """This machine's IPv4 addresses (``ip -j -4 addr``)."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                         check=True).stdout
    return {a["local"] for link in json.loads(out) for a in link.get("addr_info", []) if "local" in a}


def underlay_address(server: str, where: str = "--cluster") -> str:
    """A server's IPv4 address (the tunnels' far end): itself, or what its name resolves to."""
    try:
        return str(ipaddress.IPv4Address(server))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(server)
    except OSError as exc:
        raise ConfigError(f"{where}: server {server!r} does not resolve to an IPv4 address ({exc})") from None


@dataclass(frozen=True)
class Layout:
    """A cluster run's servers: the first is this machine (its address on the servers'
    network: the controller listens there and the tunnels reach it there), each with its
    underlay address, and the plan's placement on them."""

    machines: tuple
    underlay: dict
    placement: object  # model.placement.Placement

    @property
    def here(self) -> str:
        return self.machines[0]

    @property
    def others(self) -> tuple:
        return self.machines[1:]

    def shares(self, plan) -> list:
        return placement.shares(plan, self.placement)

    def to_dict(self, plan) -> dict:
        return {"servers": list(self.machines), "controller_address": self.underlay[self.here],
                "underlay": self.underlay,
                "placement": {s.machine: {"switches": list(s.switches), "gpus": list(s.hosts),
                                          "tunnels": [t.intf for t in s.tunnels]} for s in self.shares(plan)}}


def unsupported(plan, options) -> list:
    """What a cluster run cannot do yet (docs/cluster.md), as the settings to change."""
    out = []
    if plan.events:
        out.append("events: link events are applied on one machine only (remove them)")
    if plan.routing == "adaptive":
        out.append("routing: adaptive routing steers from one machine only (use ecmp)")
    if options.pcap:
        out.append("--pcap: captures run on one machine only")
    if options.cli:
        out.append("--cli: the Mininet CLI sees one machine's nodes only")
    if options.isolate_baseline:
        out.append("--isolate-baseline: not with --cluster yet")
    return out


def layout(plan, text: str, options, where: str = "--cluster") -> Layout:
    """``--cluster HERE,SERVER,...`` (or the scenario's ``cluster:``) checked against the
    plan and this machine: ConfigError naming what is wrong."""
    machines = placement.parse_machines(text, where)
    if len(machines) < 2:
        raise ConfigError(f"{where}: {text!r} lists one server; a cluster run needs this machine's address and "
                          f"at least one other server")
    underlay = {m: underlay_address(m, where) for m in machines}
    mine = local_addresses()
    if underlay[machines[0]] not in mine or underlay[machines[0]].startswith("127."):
        raise ConfigError(f"{where}: the first server must be this machine's address on the servers' network "
                          f"(the controller listens there and tunnels end there), got {machines[0]!r}; this "
                          f"machine has {', '.join(sorted(a for a in mine if not a.startswith('127.'))) or 'none'}")
    mixed = [m for m in machines[1:] if underlay[m] in mine]
    if mixed:
        raise ConfigError(f"{where}: {mixed[0]!r} is this machine; list every other server once")
    blocked = unsupported(plan, options)
    if blocked:
        raise ConfigError(f"{where}: not built for a cluster run yet: " + "; ".join(blocked))
    return Layout(machines=machines, underlay=underlay, placement=placement.place(plan, machines))


def bring_up_others(stack, layout: Layout, run_dir: Path, scenario, plan, manifest, controller_port: int,
                    telemetry_interval_real_ns: int) -> list:
    """Every other server's share, entered on ``stack`` (torn down before this machine's),
    their clocks measured into ``manifest.cluster``; on the way down, each share's queue
    telemetry is gathered first (kept when the run failed: the data so far)."""
    from testbed.apply.cluster.remote_share import RemoteShare
    from testbed.run.share import make_request

    far = []
    for server in layout.others:
        request = make_request(run_id=manifest.run_id, scenario=scenario.resolved, plan=plan,
                               datapath=manifest.datapath, link_delay=manifest.link_delay_emulated,
                               telemetry_interval_real_ns=telemetry_interval_real_ns,
                               slowdown=(manifest.machine_speed or {}).get("slowdown", 1.0), machines=layout.machines,
                               machine=server, underlay=layout.underlay,
                               controller_address=layout.underlay[layout.here], controller_port=controller_port)
        far.append(stack.enter_context(RemoteShare(server, request)))
        LOG.info("%s: its share is up (%d switches, %d GPUs, %d tunnel ends)", server, len(far[-1].ready["switches"]),
                 len(far[-1].ready["hosts"]), len(far[-1].ready["tunnels"]))
    manifest.cluster["clocks"] = measure_clocks(far)

    def gather_on_exit(exc_type, exc, tb):
        try:
            gather_telemetry(far, manifest.cluster.get("clocks", {}), run_dir)
        except Exception as err:  # noqa: BLE001 - the run's own failure is the one to report
            if exc_type is None:
                raise
            LOG.warning("could not gather the other servers' queue telemetry: %s", err)
        return False

    stack.push(gather_on_exit)
    return far


def gather_telemetry(far: list, clocks: dict, run_dir: Path):
    """Each share's queue records appended to the run's ``queues.jsonl`` and its PFC
    process's records to ``pfc.jsonl`` (on the coordinator's time line: the run's totals
    and reaction then cover every server), its polls (its host's CPU) to
    ``servers/SERVER/polls.jsonl``."""
    for f in far:
        files = f.ask("telemetry", "telemetry", RECORDS_TIMEOUT_S, "its queue telemetry did not arrive")["files"]
        offset = clocks.get(f.server, {}).get("offset_ns", 0)
        with open(run_dir / "queues.jsonl", "a") as out:
            out.write(to_coordinator_clock(files["queues"], offset))
        if "pfc" in files:
            with open(run_dir / "pfc.jsonl", "a") as out:
                out.write(to_coordinator_clock(files["pfc"], offset))
        folder = run_dir / "servers" / f.server
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "polls.jsonl").write_text(to_coordinator_clock(files["polls"], offset))


def measure_clocks(far: list) -> dict:
    """Each server's CLOCK_MONOTONIC offset and its error, over its share's session."""
    clocks = {}
    for f in far:
        offset_ns, error_ns = f.clock_offset()
        clocks[f.server] = {"offset_ns": round(offset_ns), "error_ns": round(error_ns)}
        LOG.info("%s: clock offset %+d ns (error %d ns)", f.server, round(offset_ns), round(error_ns))
    return clocks


def train_across(agents, far: list, records_dir: Path, timeout_s: float, progress=None) -> dict:
    """``agents``: this machine's entered ``apply.processes.agents.Agents``; ``far``: the other servers'
    entered RemoteShares. Returns ``{"start_ns": ..., "clocks": {server: {offset_ns, error_ns}}}``
    once every GPU has finished and every server's records are in ``records_dir``."""
    clocks = measure_clocks(far)
    for f in far:
        f.send("agents")
    for f in far:
        f.answer("agents", READY_TIMEOUT_S, "its agents did not open their sockets")
    start_ns = time.monotonic_ns() + int(START_MARGIN_S * 1e9)
    deadline_ns = start_ns + int(timeout_s * 1e9)
    hang_s = timeout_s + START_MARGIN_S + 5
    for f in far:
        shift = clocks[f.server]["offset_ns"]
        f.send(f"train {start_ns + shift} {deadline_ns + shift} {hang_s}")
    LOG.info("training on %d servers from one start; the progress below counts this server's GPUs", len(far) + 1)
    agents.start(start_ns, deadline_ns)
    agents.wait_done(time.monotonic() + hang_s, progress)
    for f in far:
        f.answer("trained", hang_s, "its agents did not finish their schedule")
    records_dir.mkdir(exist_ok=True)
    for f in far:  # every GPU is done: none needs an answer from another server any more
        files = f.ask("records", "records", RECORDS_TIMEOUT_S, "its agents' records did not arrive")["files"]
        for name, text in files.items():
            (records_dir / Path(name).name).write_text(to_coordinator_clock(text, clocks[f.server]["offset_ns"]))
    return {"start_ns": start_ns, "clocks": clocks}
