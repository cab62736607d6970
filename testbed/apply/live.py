"""A live run's queues as they are now: its registry entry, the marker's pinned maps, the
ports' qdisc counters and its PFC events so far (read-only: it never resets the "max depth
since the last read" a collector relies on). ``testbed queues`` (views/queues.py) shows them."""

from __future__ import annotations

import time
from pathlib import Path

from testbed.apply import registry
from testbed.apply.datapath.bpfmap import BpfError, Map
from testbed.apply.datapath.marker import PIN_ROOT
from testbed.errors import RunError
from testbed.jsonlines import read_events
from testbed.model.plan_file import PlanFile
from testbed.wire import bpfmaps


def is_live(run_id: str) -> bool:
    return run_id in registry.live_runs()


def live_run(run_id: str | None) -> dict:
    live = registry.live_runs()
    if run_id:
        if run_id not in live:
            raise RunError(f"no live run {run_id!r} (live: {', '.join(live) or 'none'})")
        return live[run_id]
    if not live:
        raise RunError("no run is up: start one, e.g. python3 -m testbed run --hold 60, then run this in another "
                       "shell")
    return live[sorted(live)[-1]]


def pfc_counts(events_path: Path) -> dict:
    """Per port, from the run's PFC events so far: PFC frames sent out of it (XOFF and XON),
    times its data class was paused by its neighbour, and whether it is paused now."""
    out: dict[str, dict] = {}
    for e in read_events(events_path):
        row = out.setdefault(e.get("port"), {"pfc_sent": 0, "pauses": 0, "paused": False})
        if e.get("event") in ("xoff_sent", "xon_sent"):
            row["pfc_sent"] += 1
        elif e.get("event") == "paused":
            row["pauses"] += 1
            row["paused"] = True
        elif e.get("event") == "resumed":
            row["paused"] = False
    return out


def snapshot(run: dict) -> list[dict]:
    plan = PlanFile.load(Path(run["results_dir"]) / "plan.json")
    pfc = pfc_counts(Path(run["results_dir"]) / "pfc.jsonl")
    pins = PIN_ROOT / run["run_id"]
    rows = []
    try:
        state_map = Map(str(pins / "testbed_state"), bpfmaps.STATE_SIZE)
    except BpfError as exc:
        raise RunError(f"the run's marker maps are not there yet: {exc}") from None
    try:
        cfg_map = Map(str(pins / "testbed_cfg"), bpfmaps.CFG_SIZE)
    except BpfError as exc:
        state_map.close()
        raise RunError(f"the run's marker maps are not there yet: {exc}") from None
    from testbed.apply.datapath.tc import PortTc  # pyroute2: only when a live run is read

    with state_map, cfg_map, PortTc() as tc:
        now = time.monotonic_ns()
        for pq in plan.queues:
            idx = tc.ifindex(pq.intf)
            raw = state_map.lookup(idx, lock=True)
            s = bpfmaps.marker_state(raw) if raw else {k: 0 for k in bpfmaps.STATE_FIELDS}
            cfg = cfg_map.lookup(idx)
            # the rate in force: a link event may have slowed the port
            emulated = bpfmaps.cfg_rate_bps(cfg) if cfg else pq.emulated_rate_bps
            depth = bpfmaps.shadow_depth_now(s, emulated, now) if raw else 0.0
            q = tc.qdisc_stats(pq.intf)
            rows.append({**pq.to_dict(), "emulated_rate_bps": emulated, "rate_bps": pq.rate_bps * emulated
                         / pq.emulated_rate_bps, "depth_bytes": depth, "max_depth_bytes": s["max_depth_bytes"],
                         "packets": s["packets"], "ect": s["ect"], "marked": s["marked"], "drops": s["drops"],
                         "tbf_backlog_bytes": q["backlog_bytes"], "tbf_drops": q["drops"],
                         "control_packets": s["control_packets"],
                         **pfc.get(pq.intf, {"pfc_sent": 0, "pauses": 0, "paused": False})})
    return rows
