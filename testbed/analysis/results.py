"""A run folder as pandas DataFrames (the only pandas import), for notebooks and reports.

    from testbed.analysis import results
    r = results.load("results/default-20261202T185848Z")
    r.ops.groupby(["gpu", "phase"]).wait_real_ns.sum()

``*_ns`` columns from the agents are CLOCK_MONOTONIC nanoseconds of the emulation;
``*_real_ns`` columns are real-fabric time (emulated / dilation) since the run's first
op. Every frame and column is listed in docs/results.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from testbed import units
from testbed.analysis.training import summarise_run
from testbed.errors import ConfigError
from testbed.jsonlines import read_events
from testbed.model.plan_file import PlanFile


@dataclass
class Results:
    run_dir: Path
    manifest: dict
    ops: pd.DataFrame
    qps: pd.DataFrame
    nics: pd.DataFrame
    rates: pd.DataFrame
    pauses: pd.DataFrame
    iterations: pd.DataFrame
    collectives: pd.DataFrame
    pfc_events: pd.DataFrame
    pfc_ports: pd.DataFrame
    ports: pd.DataFrame = field(default_factory=pd.DataFrame)
    queues: pd.DataFrame = field(default_factory=pd.DataFrame)
    ecn: pd.DataFrame = field(default_factory=pd.DataFrame)
    polls: pd.DataFrame = field(default_factory=pd.DataFrame)
    server_polls: dict = field(default_factory=dict)  # a cluster run's other servers: {server: polls}
    plan: PlanFile | None = None  # plan.json, typed (None: the folder has none)
    extra: dict = field(default_factory=dict)

    @property
    def dilation(self) -> units.Dilation:
        """The run's time dilation (its manifest's)."""
        return units.Dilation.of(self.manifest.get("dilation"))

    # other names for the same frames (docs/results.md lists them)
    @property
    def links(self) -> pd.DataFrame:
        """Per link (named by its receiving switch port): ECN codepoint counts (``ecn``)."""
        return self.ecn

    @property
    def steps(self) -> pd.DataFrame:
        """Per training iteration: step time vs ideal (``iterations``)."""
        return self.iterations

    @property
    def flows(self) -> pd.DataFrame:
        """Per reliable connection (queue pair): transport counters (``qps``)."""
        return self.qps


def load(run_dir) -> Results:
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.exists():
        raise ConfigError(f"{run_dir}: not a run folder (no manifest.json)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{manifest_path}: not valid JSON ({exc})") from None
    d = units.Dilation.of(manifest.get("dilation"))
    agent_rows = [r for p in sorted((run_dir / "agents").glob("*.jsonl")) for r in read_events(p)]
    by_type: dict[str, list] = {}
    for r in agent_rows:
        by_type.setdefault(r.get("type"), []).append(r)
    ops = pd.DataFrame(by_type.get("op", []))
    t0 = None
    if not ops.empty:
        ops = ops.drop(columns=["type"]).sort_values(["gpu", "id"]).reset_index(drop=True)
        t0 = ops.ready_ns.min()
        for col in ("ready", "start", "end"):
            ops[f"{col}_real_ns"] = d.real_duration_ns(ops[f"{col}_ns"] - t0)
        ops["duration_real_ns"] = ops.end_real_ns - ops.start_real_ns
        ops["wait_real_ns"] = (ops.end_real_ns - ops.ready_real_ns).where(ops.kind == "recv", 0.0)

    def timed(rows, drop=("type",)):
        df = pd.DataFrame(rows)
        df = df.drop(columns=[c for c in drop if c in df.columns])
        return df if df.empty or t0 is None else _with_real_time(df, d, t0)

    qps = timed(by_type.get("qp", []))
    nics = timed(by_type.get("nic", []))
    rates = timed(by_type.get("rate", []))
    pauses = timed([{**r, "event": r["type"]} for r in by_type.get("paused", []) + by_type.get("resumed", [])])
    if not pauses.empty:
        pauses = pauses.sort_values("t_ns").reset_index(drop=True)
    pfc_rows = read_events(run_dir / "pfc.jsonl")
    pfc_events = timed([r for r in pfc_rows if "t_ns" in r], drop=())  # not the end-of-run totals
    pfc_ports = pd.DataFrame([r for r in pfc_rows if r.get("event") == "port"])
    if not pfc_ports.empty:
        pfc_ports = pfc_ports.drop(columns=["event"])
    plan_path = run_dir / "plan.json"
    plan = PlanFile.load(plan_path) if plan_path.exists() else None
    summary = summarise_run(run_dir, agent_rows, plan.training, d) if plan and plan.training else {}
    ports = _ports(run_dir, d, t0, plan)
    return Results(run_dir=run_dir, manifest=manifest, ops=ops, qps=qps, nics=nics, rates=rates, pauses=pauses, ports=ports,
                   queues=_queues(run_dir, d, t0, plan), ecn=_ecn(run_dir, d, t0, plan),
                   polls=_timed_file(run_dir / "polls.jsonl", d, t0), plan=plan,
                   server_polls={p.parent.name: _timed_file(p, d, t0)
                                 for p in sorted((run_dir / "servers").glob("*/polls.jsonl"))},
                   iterations=pd.DataFrame(summary.get("iterations", [])),
                   collectives=pd.DataFrame(summary.get("collectives", [])), pfc_events=pfc_events,
                   pfc_ports=pfc_ports, extra={"transport": summary.get("transport", {}),
                                               "ideal": summary.get("ideal", {}),
                                               "incomplete_iterations": summary.get("incomplete_iterations", []),
                                               "incomplete_collectives": summary.get("incomplete_collectives", 0),
                                               "link_events": summary.get("link_events", []),
                                               "jobs": summary.get("jobs", {}),
                                               "baselines": _json(run_dir / "baselines.json")})


def _with_real_time(df: pd.DataFrame, dilation: units.Dilation, t0) -> pd.DataFrame:
    """``t_real_ns``: real-fabric ns since ``t0`` (the run's first op; else the frame's first row)."""
    if "t_ns" in df.columns:
        df["t_real_ns"] = dilation.real_duration_ns(df.t_ns - (df.t_ns.min() if t0 is None else t0))
    return df


def _timed_file(path: Path, dilation: units.Dilation, t0) -> pd.DataFrame:
    df = pd.DataFrame(read_events(path))
    return df if df.empty else _with_real_time(df, dilation, t0)


def _per_port_file(path: Path, dilation: units.Dilation, t0) -> pd.DataFrame:
    """A collector file with real time, in (port, time) order for per-interval differences."""
    df = _timed_file(path, dilation, t0)
    return df if df.empty else df.sort_values(["intf", "t_ns"]).reset_index(drop=True)


def _ports(run_dir: Path, dilation: units.Dilation, t0, plan: PlanFile | None) -> pd.DataFrame:
    """Per-interval rates from the switches' own counter times (``duration_ns``: when the
    switch read the counters, to its clock's millisecond) where the run recorded them; the
    controller's receive times (``t_ns``) otherwise (older runs), which can make a port look
    faster than its wire when one reply is handled later than the one before."""
    df = _per_port_file(run_dir / "ports.jsonl", dilation, t0)
    if df.empty:
        return df
    clock = "duration_ns" if "duration_ns" in df and df.duration_ns.notna().all() else "t_ns"
    dt = df.groupby("intf")[clock].diff()
    dt_real_s = dilation.real_duration_ns(dt.where(dt > 0)) / 1e9  # a port added again restarts its duration
    for way in ("tx", "rx"):
        df[f"{way}_bps"] = df.groupby("intf")[f"{way}_bytes"].diff() * 8 / dt_real_s
    rates = {q.intf: q.rate_bps for q in plan.queues} if plan else {}
    if rates:
        df["tx_utilisation"] = df.tx_bps / df.intf.map(rates)
    return df


def _queues(run_dir: Path, dilation: units.Dilation, t0, plan: PlanFile | None) -> pd.DataFrame:
    df = _per_port_file(run_dir / "queues.jsonl", dilation, t0)
    if df.empty:
        return df
    for col in ("marked", "drops", "ect", "packets", "pfc_frames_sent"):
        if col in df:
            df[f"{col}_delta"] = df.groupby("intf")[col].diff().fillna(df[col])
    if plan and plan.queues:
        keep = ["intf", "peer", "rate_bps", "emulated_rate_bps", "kmin_bytes", "kmax_bytes", "xoff_bytes",
                "buffer_bytes", "ecn", "pfc"]
        pq = pd.DataFrame([{k: getattr(q, k) for k in keep} for q in plan.queues])
        df = df.merge(pq, on="intf", how="left")
    return df


def _ecn(run_dir: Path, dilation: units.Dilation, t0, plan: PlanFile | None) -> pd.DataFrame:
    df = _timed_file(run_dir / "ecn.jsonl", dilation, t0)
    if df.empty:
        return df
    wide = df.pivot_table(index=["t_ns", "t_real_ns", "switch", "port", "intf"], columns="ecn", values="packets",
                          aggfunc="sum", fill_value=0).reset_index()
    wide.columns.name = None
    for cp in ("not_ect", "ect1", "ect0", "ce"):
        if cp not in wide.columns:
            wide[cp] = 0
    peers = {}
    for link in plan.links if plan else ():
        peers[link.a_intf] = link.b
        peers[link.b_intf] = link.a
    wide["peer"] = wide.intf.map(peers)
    return wide.sort_values(["intf", "t_ns"]).reset_index(drop=True)


def _json(path: Path) -> dict:
    """A small JSON file of the run folder, or {} when it is not there."""
    return json.loads(path.read_text()) if path.exists() else {}
