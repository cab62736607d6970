"""A run, stage by stage: plan -> bring up (controller, fabric, queues, PFC) -> program
(every switch confirmed its flows) -> check reachability -> train -> collect -> report ->
tear down.

Every resource is entered on one ExitStack, so it is torn down in reverse order on
success, error, Ctrl-C (KeyboardInterrupt) and SIGTERM (turned into ``Terminated``).
Collection and the report run after teardown whatever the outcome: a failed or
interrupted run keeps what it collected and says why it is incomplete.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from testbed import units
from testbed.apply import capabilities, registry, speed
from testbed.apply.processes.controller import Controller
from testbed.apply.datapath.marker import PIN_ROOT
from testbed.apply.processes.child import free_tcp_port
from testbed.controller import collector
from testbed.config.scenario import Scenario
from testbed.errors import RunError, TestbedError
from testbed.model.placement import WHOLE, Site
from testbed.model.plan import DEFAULT_TELEMETRY_INTERVAL_REAL_NS, Plan, build
from testbed.paths import RESULTS_DIR
from testbed.run.manifest import Manifest, Queues, now_utc, versions

LOG = logging.getLogger(__name__)
# deadlines against a hang, not performance bounds: under QEMU software emulation (the lab VM
# CI boots) the 6-switch default fabric is up in 40-46 s, and once took over 60 s to connect
CONTROLLER_LISTEN_TIMEOUT_S = 60
FABRIC_READY_TIMEOUT_S = 120


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
    hook: object = None  # callable(RunContext) run after reachability and training (tests and labs use it)
    train: bool = True  # run the scenario's workload (if it has one) after reachability
    before_training: object = None  # callable(RunContext) run after reachability, before training
    pcap: str = ""  # comma-separated ports to capture during training (capture.parse_ports)
    telemetry_interval_real_ns: int = DEFAULT_TELEMETRY_INTERVAL_REAL_NS
    isolate_baseline: bool = False  # with jobs: run each job alone afterwards (run.baseline)
    cluster: str = ""  # HERE,SERVER,...: run across servers (run.coordination; docs/cluster.md)


@dataclass
class RunContext:
    """What a hook can use while the fabric is up."""

    fabric: object  # apply.fabric.MininetFabric
    plan: Plan
    egress: object  # apply.datapath.egress.EgressQueues
    run_dir: Path


@dataclass
class RunResult:
    run_dir: Path
    status: str
    reason: str = ""
    manifest: dict = field(default_factory=dict)


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


@dataclass
class Up:
    """What bring-up started, each entered on the run's stack (torn down in reverse order when
    it unwinds); filled as each comes up, so a bring-up that fails half way still says what
    it had started."""

    record: registry.RunRecord
    ctl: Controller | None = None
    t_up: float = 0.0  # when the controller listened: the fabric's bring-up is timed from here
    fab: object = None  # apply.fabric.MininetFabric
    egress: object = None  # apply.datapath.egress.EgressQueues
    far: list = field(default_factory=list)  # the other servers' shares (apply.cluster.remote_share.RemoteShare)
    pfcd: object = None  # apply.processes.pfc_daemon.PfcDaemon, when a port is lossless or an event slows a link
    pfc_on: bool = False  # some port's data class is lossless (the PFC process then also sends pauses)
    adaptive: object = None  # apply.datapath.steering.AdaptiveRouting, with routing: adaptive


class Run:
    """One run, stage by stage (``execute``): what each stage makes is set here, in order."""

    def __init__(self, scenario: Scenario, options: RunOptions):
        self.scenario, self.options = scenario, options
        self.timings: dict = {}
        self.t_start = 0.0
        # 1. plan
        self.plan: Plan | None = None
        self.run_id, self.run_dir, self.plan_path = "", Path(), Path()
        self.manifest: Manifest | None = None
        self.layout = None  # a cluster run's servers and placement (run.coordination.Layout)
        self.site = WHOLE  # where this machine's part runs: all of it, or its cluster share
        self.pcap_ports: list = []
        # 2. bring up
        self.up: Up | None = None

    # -- 1. plan ---------------------------------------------------------------------------
    def make_plan(self):
        """The run's one plan, from the scenario and what this machine offers; the run
        folder with the scenario as resolved, plan.json and the manifest."""
        if not capabilities.is_root():
            raise RunError("run needs root (network namespaces, OVS): sudo python -m testbed run")
        sc, opts = self.scenario, self.options
        datapath = capabilities.choose_datapath(opts.datapath or sc.datapath)
        netem = capabilities.qdisc_support().get("netem", False)
        machine = speed.measure() if sc.dilation is None else None  # only an automatic dilation uses it
        self.plan = build(sc, datapath, link_delay=netem, telemetry_interval_real_ns=opts.telemetry_interval_real_ns,
                          slowdown=machine.slowdown if machine else 1.0)
        from testbed.apply.processes.capture import parse_ports

        self.pcap_ports = parse_ports(opts.pcap, self.plan) if opts.pcap else []
        servers = opts.cluster or ",".join(sc.cluster)  # --cluster over the scenario's cluster:
        if servers:
            from testbed.run import coordination

            self.layout = coordination.layout(self.plan, servers, opts,
                                              "--cluster" if opts.cluster else sc.where(("cluster",)))
            self.site = Site(self.layout.shares(self.plan)[0], self.layout.underlay,
                             self.layout.underlay[self.layout.here])
        self.run_id, self.run_dir = new_run_dir(opts.results_dir, sc.name)
        (self.run_dir / "scenario.yaml").write_text(yaml.safe_dump(sc.resolved, sort_keys=False))
        self.plan_path = self.run_dir / "plan.json"
        self.plan_path.write_text(json.dumps(self.plan.to_dict(), indent=1))
        self.manifest = Manifest(run_id=self.run_id, scenario=sc.name, datapath=datapath,
                                 dilation=self.plan.dilation.factor, dilation_reason=self.plan.dilation_reason,
                                 seed=sc.seed, link_delay_emulated=netem, versions=versions(capabilities.tool_version),
                                 telemetry={"files": [f"{name}.jsonl" for name in collector.FILES],
                                            "interval_real_ns": self.plan.telemetry.interval_real_ns,
                                            "interval_emulated_ns": self.plan.telemetry.interval_emulated_ns})
        self.manifest.timings_s = self.timings
        self.manifest.machine_speed = machine.to_dict() if machine else None
        if self.layout is not None:
            self.manifest.cluster = self.layout.to_dict(self.plan)
        self.manifest.write(self.run_dir)
        LOG.info("run %s: %d GPUs, %d switches, %s datapath, dilation %s", self.run_id, len(self.plan.hosts),
                 len(self.plan.switches), datapath, self.plan.dilation)

    # -- 2. bring up -----------------------------------------------------------------------
    def bring_up(self, stack: ExitStack) -> Up:
        """The controller, then the fabric exactly as planned, its queues and PFC."""
        self.up = up = Up(stack.enter_context(registry.RunRecord(self.run_id, str(self.run_dir))))
        work = self.run_dir / "work"
        work.mkdir()
        port = free_tcp_port()
        site = self.site
        up.ctl = stack.enter_context(Controller(self.plan_path, self.run_dir, port,
                                                on_start=lambda pid: up.record.add(processes=[pid]),
                                                telemetry=True, pins=PIN_ROOT / self.run_id, site=site))
        up.ctl.wait_listening(CONTROLLER_LISTEN_TIMEOUT_S)
        up.t_up = time.monotonic()
        from testbed.apply.fabric import MininetFabric  # Mininet is imported only when a fabric is built
        from testbed.apply.datapath.egress import EgressQueues  # pyroute2 and the BPF marker, only for a run

        netem = self.manifest.link_delay_emulated
        up.fab = stack.enter_context(MininetFabric(self.plan, self.run_id, self.manifest.datapath, port, up.record,
                                                   work, link_delay=netem, site=site))
        up.egress = stack.enter_context(EgressQueues(self.plan, self.run_id, link_delay=netem, site=site))
        if self.layout is not None:
            from testbed.run import coordination

            up.far = coordination.bring_up_others(stack, self.layout, self.run_dir, self.scenario, self.plan,
                                                  self.manifest, port, self.options.telemetry_interval_real_ns)
        # the PFC process also owns the data class's rate: a run whose events slow a link needs it
        up.pfc_on = any(pq.pfc for pq in self.plan.queues)
        if up.pfc_on or any(e.rate_bps for e in self.plan.events):
            from testbed.apply.processes.pfc_daemon import PfcDaemon

            up.pfcd = stack.enter_context(PfcDaemon(self.plan_path, up.egress.marker.dir, self.run_dir, up.record,
                                                    site=site))
        if self.plan.routing == "adaptive":
            from testbed.apply.datapath.steering import AdaptiveRouting

            up.adaptive = stack.enter_context(AdaptiveRouting(self.plan, up.egress, up.fab))
        # runs first when the stack unwinds: marks the start of teardown
        stack.callback(lambda: self.timings.__setitem__("teardown_started", time.monotonic()))
        self.timings["fabric_up"] = round(time.monotonic() - up.t_up, 3)
        self.manifest.queues = Queues(ports=len(self.plan.queues), pins=str(up.egress.marker.dir), pfc=up.pfc_on)
        return up

    # -- 3. program ------------------------------------------------------------------------
    def program(self):
        ready = self.up.ctl.wait_fabric_ready(len(self.plan.switches), FABRIC_READY_TIMEOUT_S)
        self.timings["flows_installed"] = round(time.monotonic() - self.up.t_up, 3)
        LOG.info("fabric up in %.1fs; controller programmed %d switches (%d flows, %d groups); "
                 "queues (shaper + ECN marker) on %d switch ports", self.timings["flows_installed"], len(ready),
                 sum(e["flows"] for e in ready), sum(e["groups"] for e in ready), len(self.plan.queues))

    # -- 4. check reachability -------------------------------------------------------------
    def check_reachability(self):
        from testbed.apply import reachability

        t = time.monotonic()
        self.manifest.reachability = reachability.check(self.up.fab, self.plan, self.up.far)
        self.timings["reachability"] = round(time.monotonic() - t, 3)
        self.manifest.status = "up"
        self.manifest.write(self.run_dir)
        LOG.info("reachability: all %d GPU pairs answered over the planned number of hops",
                 self.manifest.reachability["pairs"])

    def context(self) -> RunContext:
        return RunContext(fabric=self.up.fab, plan=self.plan, egress=self.up.egress, run_dir=self.run_dir)

    # -- 5. train --------------------------------------------------------------------------
    def train(self, stack: ExitStack):
        """Captures (if asked), then the workload on the GPU agents, then one telemetry poll
        after the last packet so the collected totals are complete."""
        if self.pcap_ports:
            from testbed.apply.processes.capture import Captures

            stack.enter_context(Captures(self.up.fab, self.pcap_ports, self.run_dir / "pcap", self.up.record))
            self.manifest.pcap = {"ports": self.pcap_ports, "folder": "pcap"}
        if self.options.before_training:
            self.options.before_training(self.context())
        tp = self.plan.training
        if tp is None or not self.options.train:
            return
        from testbed.run.training import train

        self.manifest.workload = {"iterations": tp.iterations}
        up = self.up
        self.manifest.training = train(up.fab, self.plan, self.plan_path, self.run_dir, up.record, self.timings,
                                       set_rate=up.pfcd.set_rate if up.pfcd is not None else None, far=up.far,
                                       cluster=self.manifest.cluster)
        up.ctl.check_alive()
        interval_s = self.plan.telemetry.interval_emulated_ns / 1e9
        up.ctl.wait_poll_after(time.monotonic_ns(), 3 * interval_s + 5)
        # (the other servers' telemetry is gathered as their shares come down: run.coordination)
        self.manifest.write(self.run_dir)

    def after_training(self):
        """The hook, the Mininet CLI or a hold, as asked; then a last check of the processes."""
        if self.options.hook:
            self.options.hook(self.context())
        if self.options.cli:
            LOG.info("Mininet CLI: try 'h1 ping h8', 'sh ovs-ofctl -O OpenFlow13 dump-flows leaf1', "
                     "'sh ovs-ofctl -O OpenFlow15 dump-groups leaf1'; exit to tear down")
            self.up.fab.cli()
        if self.options.hold_s > 0:
            LOG.info("holding the fabric up for %gs (Ctrl-C tears it down)", self.options.hold_s)
            hold_until = time.monotonic() + self.options.hold_s
            while time.monotonic() < hold_until:
                self.up.ctl.check_alive()
                time.sleep(min(0.2, max(0.0, hold_until - time.monotonic())))
        self.up.ctl.check_alive()
        if self.up.pfcd is not None:
            self.up.pfcd.check_alive()

    # -- 6. collect and 7. report (after 8. teardown, whatever the outcome) ------------------
    def collect(self, status: str, reason: str):
        if "teardown_started" in self.timings:
            self.timings["teardown"] = round(time.monotonic() - self.timings.pop("teardown_started"), 3)
        self.timings["total"] = round(time.monotonic() - self.t_start, 3)
        up = self.up or Up(record=None)  # (a run that failed before bring-up started nothing)
        if up.pfcd is not None and up.pfc_on:  # (the process also runs for a slowed link)
            self.manifest.pfc = p = up.pfcd.totals()
            LOG.info("PFC: %d pause frames sent (%d XOFF), %d received; paused %s in all (real time) on %d "
                     "ports; headroom high-water %s; %d drops", p["frames_sent"], p["xoff_sent"],
                     p["frames_received"],
                     units.format_duration(self.plan.dilation.real_duration_ns(p["paused_ns"])),
                     len(p["paused_ports"]), units.format_size(p["headroom_high_water_bytes"]), p["drops"])
        if up.adaptive is not None and up.adaptive.totals is not None:
            self.manifest.routing = {"mode": "adaptive", **up.adaptive.totals}
            LOG.info("adaptive routing: %d data packets tagged with a chosen port, %d of them off their flow "
                     "hash's port", up.adaptive.totals["decisions"], up.adaptive.totals["moved"])
        self.manifest.status, self.manifest.reason, self.manifest.ended_utc = status, reason, now_utc()
        self.manifest.write(self.run_dir)

    def report(self):
        """summary.json and report.html from whatever the run collected, and the terminal
        summary. A failure here is reported, never raised over the run's own outcome."""
        try:
            run_report(self.run_dir)
        except Exception as exc:  # noqa: BLE001 - the run's data is kept either way
            LOG.warning("could not build summary.json and report.html in %s: %s: %s (rebuild with: python -m "
                        "testbed report %s)", relative(self.run_dir), type(exc).__name__, exc, relative(self.run_dir))

    # -- the whole run ---------------------------------------------------------------------
    def execute(self) -> RunResult:
        self.make_plan()
        self.t_start = time.monotonic()
        status, reason = "failed", ""
        try:
            with sigterm_unwinds(), ExitStack() as stack:  # 8. tear down: the stack unwinds
                self.bring_up(stack)
                self.program()
                self.check_reachability()
                self.train(stack)
                self.after_training()
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
            self.collect(status, reason)
            self.report()
            LOG.info("run %s %s%s; results in %s", self.run_id, status, f" ({reason})" if reason else "",
                     relative(self.run_dir))
        return RunResult(run_dir=self.run_dir, status=status, reason=reason,
                         manifest=json.loads((self.run_dir / "manifest.json").read_text()))


def run(scenario: Scenario, options: RunOptions) -> RunResult:
    result = Run(scenario, options).execute()
    if options.isolate_baseline and scenario.jobs and result.status == "ok":
        from testbed.run.baseline import isolate

        isolate(scenario, options, result, lambda sc, opts: Run(sc, opts).execute())
        run_report(result.run_dir)
    return result


def run_report(run_dir: Path):
    """summary.json and report.html rebuilt (after baselines), the terminal summary logged."""
    from testbed.views import report
    from testbed.views.summary import terminal

    summary, report_path = report.build(run_dir)
    LOG.info("%s", terminal(summary, relative(report_path)))


def relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
