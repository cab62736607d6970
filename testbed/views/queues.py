"""``testbed queues [--watch]``: per-port queue depth, marks, drops of a live run, read from
the run's pinned marker maps and the ports' qdiscs (read-only: it never resets the
"max depth since the last read" a collector relies on)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from testbed.wire import bpfmaps
from testbed.apply import registry
from testbed.apply.bpfmap import BpfError, Map
from testbed.errors import RunError
from testbed.apply.marker import PIN_ROOT
from testbed.jsonlines import read_events
from testbed.units import format_duration, format_size

WATCH_PERIOD_S = 1.0


def _live_run(run_id: str | None) -> dict:
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
    plan = json.loads((Path(run["results_dir"]) / "plan.json").read_text())
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
    from testbed.apply.tc import PortTc  # pyroute2: only when a live run is read

    with state_map, cfg_map, PortTc() as tc:
        now = time.monotonic_ns()
        for pq in plan["queues"]:
            idx = tc.ifindex(pq["intf"])
            raw = state_map.lookup(idx, lock=True)
            s = bpfmaps.marker_state(raw) if raw else {k: 0 for k in bpfmaps.STATE_FIELDS}
            cfg = cfg_map.lookup(idx)
            # the rate in force: a link event may have slowed the port
            emulated = bpfmaps.cfg_rate_bps(cfg) if cfg else pq["emulated_rate_bps"]
            depth = bpfmaps.shadow_depth_now(s, emulated, now) if raw else 0.0
            q = tc.qdisc_stats(pq["intf"])
            rows.append({**pq, "emulated_rate_bps": emulated, "rate_bps": pq["rate_bps"] * emulated
                         / pq["emulated_rate_bps"], "depth_bytes": depth, "max_depth_bytes": s["max_depth_bytes"],
                         "packets": s["packets"], "ect": s["ect"], "marked": s["marked"], "drops": s["drops"],
                         "tbf_backlog_bytes": q["backlog_bytes"], "tbf_drops": q["drops"],
                         "control_packets": s["control_packets"],
                         **pfc.get(pq["intf"], {"pfc_sent": 0, "pauses": 0, "paused": False})})
    return rows


def render(run: dict, rows: list[dict]) -> str:
    out = [f"run {run['run_id']}: {len(rows)} switch ports (depth = marker's shadow queue; "
           f"delay = depth at the real port rate)",
           f"{'port':14} {'to':8} {'depth':>8} {'delay':>8} {'max':>8} {'tbf backlog':>11} {'packets':>9} "
           f"{'ECT':>8} {'marked':>8} {'drops':>7} {'tbf drops':>9} {'control':>8} {'PFC sent':>8} "
           f"{'pauses':>6} {'paused':>6}"]
    for r in rows:
        delay_ns = r["depth_bytes"] * 8e9 / r["rate_bps"]
        out.append(f"{r['intf']:14} {r['peer']:8} {format_size(r['depth_bytes']):>8} {format_duration(delay_ns):>8} "
                   f"{format_size(r['max_depth_bytes']):>8} {format_size(r['tbf_backlog_bytes']):>11} "
                   f"{r['packets']:>9} {r['ect']:>8} {r['marked']:>8} {r['drops']:>7} {r['tbf_drops']:>9} "
                   f"{r['control_packets']:>8} {r['pfc_sent']:>8} {r['pauses']:>6} {'yes' if r['paused'] else '':>6}")
    return "\n".join(out)


def main(run_id: str | None, watch: bool, as_json: bool) -> int:
    run = _live_run(run_id)
    while True:
        rows = snapshot(run)
        if as_json:
            print(json.dumps(rows))
        else:
            if watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(render(run, rows), flush=True)
        if not watch:
            return 0
        time.sleep(WATCH_PERIOD_S)  # refresh period
        if run["run_id"] not in registry.live_runs():
            print(f"run {run['run_id']} has ended")
            return 0
