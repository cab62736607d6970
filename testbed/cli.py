"""``python3 -m testbed {run,show,queues,report,compare,doctor,clean,lab}``.

User errors (bad scenario, missing root, a failed bring-up) are printed as clear
messages with exit status 2 (configuration) or 1 (run failed), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from testbed.config import scenario
from testbed.errors import ConfigError, TestbedError

LOG = logging.getLogger("testbed")


def _add_scenario_args(p: argparse.ArgumentParser):
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario name in scenarios/, or a scenario or topology YAML file (default: default); "
                        "show also takes chakra:PREFIX, a Chakra trace's summary")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override any scenario field, e.g. --set fabric.spines=4 --set queues.ecn.kmin=100KB "
                        "(repeatable)")
    p.add_argument("--dilation", type=float, default=None,
                   help="time-dilation factor D (rates / D, durations x D); default: the scenario's (auto)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m testbed",
                                 description="AI-fabric testbed: emulated GPUs on an OVS leaf/spine fabric.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="bring the fabric up, check every GPU pair, record results, tear down")
    _add_scenario_args(p)
    p.add_argument("--cli", action="store_true", help="open the Mininet CLI after bring-up")
    p.add_argument("--pcap", default="", metavar="PORTS",
                   help="capture these ports into the run folder (comma-separated: leaf1-eth1,h1-eth0; bounded)")
    p.add_argument("--isolate-baseline", action="store_true",
                   help="with jobs: afterwards run each job alone on the same fabric, for its interference (JCT "
                        "with the others / alone)")
    p.add_argument("--no-traffic", action="store_true",
                   help="bring the fabric up and prove reachability, but do not run the workload")
    p.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                   help="keep the fabric up this long after the checks, then tear down (Ctrl-C ends it early)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default: results/)")
    p.add_argument("--telemetry-interval", default=None, metavar="DURATION",
                   help="how often the controller collects counters, in real-fabric time (default: 10us; "
                        "x dilation on this machine)")
    p.add_argument("--datapath", choices=scenario.DATAPATHS, default=None, help="OVS datapath (default: auto)")
    p.add_argument("--cluster", default="", metavar="HERE,SERVER,...",
                   help="run across servers: this machine's address on their network first, then each other server "
                        "(ssh as root, the same project path; docs/cluster.md)")
    p = sub.add_parser("show", help="print the planned fabric (no root needed)")
    _add_scenario_args(p)
    p.add_argument("--paths", nargs=2, metavar=("SRC", "DST"), help="GPU hosts to list ECMP paths for (h1 h8)")
    p.add_argument("--cluster", default=None, metavar="SERVER,...",
                   help="show where each leaf, GPU and spine would run on these servers, and which links cross")
    p.add_argument("--digest", action="store_true",
                   help="a short digest of the plan (counts, per-port settings, bytes per step): what the golden "
                        "plans in the tests are")
    p = sub.add_parser("queues", help="per-port queue depth, marks and drops of a live run")
    p.add_argument("--run", default=None, help="run id (default: the newest live run)")
    p.add_argument("--watch", action="store_true", help="refresh every second until the run ends or Ctrl-C")
    p.add_argument("--json", action="store_true", help="one JSON list of rows per refresh")
    p = sub.add_parser("report", help="rebuild a run folder's summary.json and report.html (no root needed)")
    p.add_argument("run_dir", type=Path, help="a run folder, e.g. results/default-20261202T185848Z")
    p = sub.add_parser("compare", help="runs side by side: a KPI table here and an HTML page (no root needed)")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="two or more run folders")
    p.add_argument("--html", type=Path, default=None,
                   help="where to write the page (default: compare-<time>.html next to the first run)")
    p = sub.add_parser("doctor", help="what this machine can do, and the fix for what is missing")
    p.add_argument("--cluster", default=None, metavar="SERVER,...",
                   help="check these servers instead (ssh as root, same version, OVS, clock offset)")
    p = sub.add_parser("clean", help="remove what killed runs left behind (ours only, by run tag)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.add_argument("--cluster", default=None, metavar="SERVER,...",
                   help="then clean each of these servers over ssh as root (what shares of runs left there)")
    _add_lab_parser(sub)
    return ap


def _add_lab_parser(sub):
    lab = sub.add_parser("lab", help="guided labs: list, show, run and check them (labs/)")
    labs = lab.add_subparsers(dest="lab_command", required=True)
    labs.add_parser("list", help="every lab: number, title, what it teaches, minutes (no root needed)")
    p = labs.add_parser("show", help="print a lab's text (no root needed)")
    p.add_argument("number", help="the lab's number")
    p = labs.add_parser("run", help="run a lab's runs in order (root), as its README lists them")
    p.add_argument("number", help="the lab's number, or all")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="change a parameter in every run of the lab (then lab check says what changed)")
    p.add_argument("--results", type=Path, default=None, help="results folder (default: results/)")
    p = labs.add_parser("check", help="check the lab's newest runs (or the given ones): exit 0 if every "
                                      "observation holds, 1 if not (no root needed)")
    p.add_argument("number", help="the lab's number")
    p.add_argument("run_dirs", type=Path, nargs="*", metavar="RUN_DIR", help="run folders (default: the newest)")
    p.add_argument("--results", type=Path, default=None, help="where to look for runs (default: results/)")


def _load(args):
    overrides = list(args.overrides)
    if args.dilation is not None:
        overrides.append(f"dilation={args.dilation!r}")
    return scenario.load(args.scenario, overrides)


def _interval_ns(text: str) -> int:
    from testbed.units import parse_duration_ns

    try:
        ns = parse_duration_ns(text)
    except ValueError as exc:
        raise ConfigError(f"--telemetry-interval: {exc}") from None
    if ns <= 0:
        raise ConfigError(f"--telemetry-interval: expected a duration > 0 such as 10us, got {text!r}")
    return ns


def _lab(args) -> int:
    from testbed import paths
    from testbed.labs import commands

    results_dir = getattr(args, "results", None) or paths.RESULTS_DIR
    if args.lab_command == "list":
        print(commands.list_text(results_dir))
    elif args.lab_command == "show":
        print(commands.show(args.number))
    elif args.lab_command == "run":
        return commands.run(args.number, results_dir, args.overrides, main)
    else:
        return commands.check(args.number, results_dir, args.run_dirs, parser().parse_args)
    return 0


def _show(args) -> str:
    if (args.scenario or "").startswith("chakra:"):
        from testbed.views import chakra

        return chakra.render(args.scenario[len("chakra:"):])
    from testbed.model import plan
    from testbed.views import digest, show

    planned = plan.build(_load(args))
    if args.cluster is not None:
        from testbed.model import placement
        from testbed.views import cluster

        return cluster.render(planned, placement.place(planned, placement.parse_machines(args.cluster)))
    return digest.digest(planned).rstrip("\n") if args.digest else \
        show.render(planned, tuple(args.paths) if args.paths else None)


def _doctor(args) -> int:
    from testbed.apply import capabilities

    if args.cluster is not None:
        from testbed.apply.cluster import doctor
        from testbed.model.placement import parse_machines

        items = doctor.checks(parse_machines(args.cluster))
    else:
        items = capabilities.checks()
    width = max(len(c.name) for c in items)
    for c in items:
        mark = {True: "ok", False: "MISSING" if c.required else "absent", None: "?"}[c.ok]
        fix = f"  -> {c.fix}" if c.fix and not c.ok else ""
        print(f"{c.name:<{width}}  {mark:8} {c.detail}{fix}")
    if args.cluster is None:
        print()
        for line in capabilities.summary(items):
            print(line)
    return 0 if not any(c.required and c.ok is False for c in items) else 1


def _clean(args) -> int:
    """This machine, then each ``--cluster`` server (its lines prefixed with its name); exit
    1 when a server could not be cleaned (unreachable, or its clean failed)."""
    from testbed.apply import registry

    servers = []
    if args.cluster is not None:
        from testbed.model.placement import parse_machines

        servers = parse_machines(args.cluster)
    would = "would " if args.dry_run else ""
    actions = registry.clean(dry_run=args.dry_run)
    prefix = "here: " if servers else ""
    for line in actions or ["nothing to clean"]:
        print(prefix + (would + line if actions else line))
    failed = 0
    if servers:
        from testbed.apply.cluster import remote_share

        for server in servers:
            ok, lines = remote_share.clean_server(server, args.dry_run)
            failed += not ok
            for line in lines or ["nothing to clean"]:
                print(f"{server}: {line}" if ok else f"{server}: NOT CLEANED: {line}")
    return 1 if failed else 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    try:
        if args.command == "show":
            print(_show(args))
        elif args.command == "run":
            from testbed import run

            sc = _load(args)
            opts = run.RunOptions(cli=args.cli, datapath=args.datapath, hold_s=args.hold,
                                  train=not args.no_traffic, pcap=args.pcap, isolate_baseline=args.isolate_baseline,
                                  cluster=args.cluster)
            if args.telemetry_interval is not None:
                opts.telemetry_interval_real_ns = _interval_ns(args.telemetry_interval)
            if args.results:
                opts.results_dir = args.results
            try:
                result = run.run(sc, opts)
            except KeyboardInterrupt:
                return 130
            except run.Terminated:
                return 143
            print(result.run_dir)
        elif args.command == "queues":
            from testbed.views import queues

            try:
                return queues.main(args.run, args.watch, args.json)
            except KeyboardInterrupt:
                return 0
        elif args.command == "report":
            from testbed.views import report
            from testbed.views.summary import terminal

            summary, path = report.build(args.run_dir)
            print(terminal(summary, path))
        elif args.command == "compare":
            from testbed.views import report

            print(report.compare(args.run_dirs, args.html))
        elif args.command == "doctor":
            return _doctor(args)
        elif args.command == "lab":
            return _lab(args)
        elif args.command == "clean":
            return _clean(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return exc.exit_code
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
