"""A run: plan -> fabric up -> controller programs it -> every GPU reaches every other over
the planned routes -> results folder -> teardown.

Every resource is entered on one ExitStack, so it is torn down in reverse order on
success, error, Ctrl-C (KeyboardInterrupt) and SIGTERM (turned into ``Terminated``).
The manifest is written at the start (status ``running``) and rewritten at the end
with the outcome, so even an interrupted run leaves a folder that says what happened.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import yaml

from testbed import __version__, units
from testbed.apply import capabilities, registry
from testbed.controller import collector, telemetry
from testbed.model import plan as planning
from testbed.errors import RunError, TestbedError
from testbed.apply.marker import PIN_ROOT
from testbed.apply.process import Controller, free_tcp_port
from testbed.config.scenario import Scenario
from testbed.paths import RESULTS_DIR, ROOT

LOG = logging.getLogger(__name__)
CONTROLLER_LISTEN_TIMEOUT_S = 30
FABRIC_READY_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 10
DEFAULT_TTL = 64


class Terminated(BaseException):
    """SIGTERM arrived: unwind like Ctrl-C so every context manager tears down."""


@contextmanager
def sigterm_unwinds():
    def handler(signum, frame):
        # the first SIGTERM unwinds; a second one must not interrupt the teardown it started
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class RunOptions:
    results_dir: Path = RESULTS_DIR
    cli: bool = False
    hold_s: float = 0.0  # keep the fabric up this long after the checks (watch it from another shell)
    datapath: str | None = None  # overrides the scenario's
    hook: object = None  # callable(RunContext) run after reachability (tests and labs use it)
    train: bool = True  # run the scenario's workload (if it has one) after reachability
    before_training: object = None  # callable(RunContext) run after reachability, before training
    pcap: str = ""  # comma-separated ports to capture during training (capture.parse_ports)
    telemetry_interval_real_ns: int = telemetry.DEFAULT_INTERVAL_REAL_NS  # collection interval, real-fabric time


@dataclass
class RunContext:
    """What a hook can use while the fabric is up."""

    fabric: object  # fabric.MininetFabric
    plan: planning.Plan
    egress: object  # egress.EgressQueues
    run_dir: Path


@dataclass
class RunResult:
    run_dir: Path
    status: str
    reason: str = ""
    manifest: dict = field(default_factory=dict)


def _pkg_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    return {
        "testbed": __version__,
        "python": sys.version.split()[0],
        "kernel": platform.release(),
        "openvswitch": capabilities.tool_version(["ovs-vsctl", "--version"]),
        "mininet": _pkg_version("mininet"),
        "os-ken": _pkg_version("os-ken"),
        "pyroute2": _pkg_version("pyroute2"),
        "scapy": _pkg_version("scapy"),
        "iproute2": capabilities.tool_version(["ip", "-V"]),
    }


def new_run_dir(base: Path, name: str) -> tuple[str, Path]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base.mkdir(parents=True, exist_ok=True)
    for n in range(100):
        run_id = f"{name}-{stamp}" + (f"-{n}" if n else "")
        path = base / run_id
        try:
            path.mkdir()
            return run_id, path
        except FileExistsError:
            continue
    raise RunError(f"cannot create a run folder under {base}")


def check_reachability(fab, plan: planning.Plan) -> dict:
    """Every GPU pings every other GPU at once; each reply's TTL must show the planned
    number of switch hops. Returns a report; raises RunError listing failures."""
    procs = {}
    for h in plan.hosts:
        targets = [o.addr for o in plan.hosts if o.name != h.name]
        procs[h.name] = fab.host(h.name).popen(
            [sys.executable, "-m", "testbed.apply.probe", "--timeout", str(PROBE_TIMEOUT_S), *targets],
            cwd=str(ROOT))
    by_addr = {h.addr: h for h in plan.hosts}
    failures, pairs = [], 0
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S + 20)
        if proc.returncode:
            raise RunError(f"reachability probe in {name} failed: {err.decode().strip()}")
        for addr, ttl in json.loads(out).items():
            dst = by_addr[addr]
            pairs += 1
            expected = len(plan.ecmp_paths(name, dst.name, limit=1)[0]) - 2
            if ttl is None:
                failures.append(f"{name} -> {dst.name} ({addr}): no reply in {PROBE_TIMEOUT_S}s")
            elif DEFAULT_TTL - ttl != expected:
                failures.append(f"{name} -> {dst.name}: reply crossed {DEFAULT_TTL - ttl} switches, "
                                f"planned {expected}")
    report = {"pairs": pairs, "failures": failures}
    if failures:
        more = f" (and {len(failures) - 10} more)" if len(failures) > 10 else ""
        raise RunError(f"{len(failures)} of {pairs} GPU pairs failed: " + "; ".join(failures[:10]) + more)
    return report


def run(scenario: Scenario, options: RunOptions) -> RunResult:
    if not capabilities.is_root():
        raise RunError("run needs root (network namespaces, OVS): sudo python3 -m testbed run")
    datapath = capabilities.choose_datapath(options.datapath or scenario.datapath)
    plan = planning.build(scenario, datapath)
    from testbed.apply.capture import Captures, parse_ports

    pcap_ports = parse_ports(options.pcap, plan) if options.pcap else []
    netem = capabilities.qdisc_support().get("netem", False)
    run_id, run_dir = new_run_dir(options.results_dir, scenario.name)
    manifest = {
        "run_id": run_id, "scenario": scenario.name, "status": "running", "reason": "",
        "started_utc": datetime.now(timezone.utc).isoformat(), "ended_utc": None,
        "datapath": datapath, "dilation": plan.dilation.factor, "dilation_reason": plan.dilation_reason,
        "seed": scenario.seed, "link_delay_emulated": netem,
        "link_delay_note": ("every link's cable delay x dilation, with netem on both ends' egress"
                            if netem else "cable delay is NOT emulated: this kernel has no netem (sch_netem); "
                                          "planned delays are in plan.json, the lab VM emulates them"),
        "queues": None,
        "versions": versions(), "timings_s": {}, "reachability": None,
    }
    (run_dir / "scenario.yaml").write_text(yaml.safe_dump(scenario.resolved, sort_keys=False))
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan.to_dict(), indent=1))
    write_manifest(run_dir, manifest)
    LOG.info("run %s: %d GPUs, %d switches, %s datapath, dilation %g", run_id, len(plan.hosts),
             len(plan.switches), datapath, plan.dilation.factor)
    status, reason = "failed", ""
    pfcd = None
    t_start = time.monotonic()
    timings = manifest["timings_s"]
    try:
        with sigterm_unwinds(), ExitStack() as stack:
            record = stack.enter_context(registry.RunRecord(run_id, str(run_dir)))
            work = run_dir / "work"
            work.mkdir()
            port = free_tcp_port()
            interval_ns = int(plan.dilation.duration_ns(options.telemetry_interval_real_ns))
            manifest["telemetry"] = {"files": [f"{name}.jsonl" for name in collector.FILES],
                                     "interval_real_ns": options.telemetry_interval_real_ns,
                                     "interval_emulated_ns": interval_ns}
            ctl = stack.enter_context(Controller(plan_path, run_dir, port,
                                                 on_start=lambda pid: record.add(processes=[pid]),
                                                 stats_interval_ns=interval_ns, pins=PIN_ROOT / run_id))
            ctl.wait_listening(CONTROLLER_LISTEN_TIMEOUT_S)
            t0 = time.monotonic()
            from testbed.apply.fabric import MininetFabric

            fab = stack.enter_context(MininetFabric(plan, run_id, datapath, port, record, work, link_delay=netem))
            from testbed.apply.queues import EgressQueues

            egress = stack.enter_context(EgressQueues(plan, run_id, link_delay=netem))
            if any(pq.pfc for pq in egress.ports):
                from testbed.apply.pfc import PfcDaemon

                pfcd = stack.enter_context(PfcDaemon(plan, egress, run_dir, record))
            # runs first when the stack unwinds: marks the start of teardown
            stack.callback(lambda: timings.__setitem__("teardown_started", time.monotonic()))
            timings["fabric_up"] = round(time.monotonic() - t0, 3)
            manifest["queues"] = {"ports": len(egress.ports), "shaper": "tbf", "marker": "bpf clsact egress",
                                  "pins": str(egress.marker.dir), "classes": "data (TX queue 0, TBF) + control "
                                  "(DSCP 48, TX queue 1)",
                                  "pfc": "802.1Qbb frames from congested queues to their feeders (switch ports "
                                         "and GPU NICs), testbed.apply.pfc" if pfcd else "off"}
            ready = ctl.wait_fabric_ready(len(plan.switches), FABRIC_READY_TIMEOUT_S)
            timings["flows_installed"] = round(time.monotonic() - t0, 3)
            LOG.info("fabric up in %.1fs; controller programmed %d switches (%d flows, %d groups); "
                     "queues (shaper + ECN marker) on %d switch ports", timings["flows_installed"], len(ready),
                     sum(e["flows"] for e in ready), sum(e["groups"] for e in ready), len(egress.ports))
            t1 = time.monotonic()
            manifest["reachability"] = check_reachability(fab, plan)
            timings["reachability"] = round(time.monotonic() - t1, 3)
            manifest["status"] = "up"
            write_manifest(run_dir, manifest)
            LOG.info("reachability: all %d GPU pairs answered over the planned number of hops",
                     manifest["reachability"]["pairs"])
            if pcap_ports:
                stack.enter_context(Captures(fab, pcap_ports, run_dir / "pcap", record))
                manifest["pcap"] = {"ports": pcap_ports, "folder": "pcap"}
            if options.before_training:
                options.before_training(RunContext(fabric=fab, plan=plan, egress=egress, run_dir=run_dir))
            if scenario.workload is not None and options.train:
                manifest["workload"] = {"iterations": scenario.workload.iterations}
                manifest["training"] = _train(fab, plan, scenario.workload, run_dir, record, ctl, timings, netem,
                                              interval_ns)
                write_manifest(run_dir, manifest)
            if options.hook:
                options.hook(RunContext(fabric=fab, plan=plan, egress=egress, run_dir=run_dir))
            if options.cli:
                LOG.info("Mininet CLI: try 'h1 ping h8', 'sh ovs-ofctl -O OpenFlow13 dump-flows leaf1', "
                         "'sh ovs-ofctl -O OpenFlow15 dump-groups leaf1'; exit to tear down")
                fab.cli()
            if options.hold_s > 0:
                LOG.info("holding the fabric up for %gs (Ctrl-C tears it down)", options.hold_s)
                hold_until = time.monotonic() + options.hold_s
                while time.monotonic() < hold_until:
                    ctl.check_alive()
                    time.sleep(min(0.2, max(0.0, hold_until - time.monotonic())))
            ctl.check_alive()
            if pfcd is not None:
                pfcd.check_alive()
            status = "ok"
    except KeyboardInterrupt:
        status, reason = "interrupted", "SIGINT (Ctrl-C)"
        raise
    except Terminated:
        status, reason = "interrupted", "SIGTERM"
        raise
    except TestbedError as exc:
        reason = str(exc)
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if "teardown_started" in timings:
            timings["teardown"] = round(time.monotonic() - timings.pop("teardown_started"), 3)
        timings["total"] = round(time.monotonic() - t_start, 3)
        if pfcd is not None:
            manifest["pfc"] = p = pfcd.totals()
            LOG.info("PFC: %d pause frames sent (%d XOFF), %d received; paused %s in all (real time) on %d "
                     "ports; headroom high-water %s; %d drops", p["frames_sent"], p["xoff_sent"],
                     p["frames_received"], units.format_duration(plan.dilation.real_duration_ns(p["paused_ns"])),
                     len(p["paused_ports"]), units.format_size(p["headroom_high_water_bytes"]), p["drops"])
        manifest.update(status=status, reason=reason, ended_utc=datetime.now(timezone.utc).isoformat())
        write_manifest(run_dir, manifest)
        _summarise(run_dir)
        LOG.info("run %s %s%s; results in %s", run_id, status, f" ({reason})" if reason else "",
                 _relative(run_dir))
    return RunResult(run_dir=run_dir, status=status, reason=reason, manifest=manifest)


def _train(fab, plan, workload, run_dir, record, ctl, timings, link_delay: bool, interval_ns: int) -> dict:
    """Run the workload on the GPU agents; writes training.json and returns its headline."""
    from testbed.apply.agents import Progress, Training, load_records, summarise

    t0 = time.monotonic()
    training = Training(fab, plan, workload, run_dir, record, link_delay=link_delay)
    ideal = training.ideal()
    progress = None
    try:
        with training:
            ideal_emulated_s = workload.iterations * plan.dilation.duration_ns(ideal["iteration_ns"]) / 1e9
            LOG.info("training: %d GPUs (DP %d x PP %d x TP %d), %d iterations; gradients %s by %s; ideal %s per "
                     "iteration (%.1fs emulated in all)", training.n, workload.data, workload.pipeline,
                     workload.tensor, workload.iterations,
                     " + ".join(units.format_size(b) for b in workload.allreduce_bytes), workload.algorithm,
                     units.format_duration(ideal["iteration_ns"]), ideal_emulated_s)
            progress = Progress(training.ops, training.records_dir, workload.iterations)
            training.train(timeout_s=max(120.0, 20 * ideal_emulated_s), progress=progress)  # a guard, not a bound
    finally:
        if progress is not None:
            progress.close()
        # after the agents have exited: their per-QP counters are the last lines they write
        timings["training"] = round(time.monotonic() - t0, 3)
        summary = summarise(load_records(training.records_dir), workload, training.collectives, ideal,
                            plan.dilation.factor)
        (run_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    ctl.check_alive()
    # the counters' last poll must come after the last packet (a poll takes well under one interval)
    ctl.wait_poll_after(time.monotonic_ns(), 3 * interval_ns / 1e9 + 5)
    t = summary["transport"]
    LOG.info("training done: %d iterations, %d packets, %d retransmitted, %d CNPs", len(summary["iterations"]),
             t["packets_sent"], t["retransmitted"], t["cnps_sent"])
    return {"iterations": len(summary["iterations"]), "collectives": len(summary["collectives"]),
            "records": str(training.records_dir.relative_to(run_dir)), "summary": "training.json"}


def _summarise(run_dir: Path):
    """summary.json and report.html from whatever the run collected (also when it failed or
    was interrupted: the summary then says incomplete, and why), and the terminal summary.
    A failure here is reported, never raised over the run's own outcome."""
    try:
        from testbed.analysis.kpis import terminal
        from testbed.analysis.report import build

        summary, report_path = build(run_dir)
        LOG.info("%s", terminal(summary, _relative(report_path)))
    except Exception as exc:  # noqa: BLE001 - the run's data is kept either way
        LOG.warning("could not build summary.json and report.html in %s: %s: %s (rebuild with: python3 -m "
                    "testbed report %s)", _relative(run_dir), type(exc).__name__, exc, _relative(run_dir))


def write_manifest(run_dir: Path, manifest: dict):
    tmp = run_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, run_dir / "manifest.json")


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

