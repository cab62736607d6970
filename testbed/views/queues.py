"""``testbed queues [--watch]``: per-port queue depth, marks, drops of a live run, as
``apply.live`` reads them from the run's pinned marker maps and the ports' qdiscs."""

from __future__ import annotations

import json
import sys
import time

from testbed.apply import live
from testbed.units import format_duration, format_size

WATCH_PERIOD_S = 1.0


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
    run = live.live_run(run_id)
    while True:
        rows = live.snapshot(run)
        if as_json:
            print(json.dumps(rows))
        else:
            if watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            print(render(run, rows), flush=True)
        if not watch:
            return 0
        time.sleep(WATCH_PERIOD_S)  # refresh period
        if not live.is_live(run["run_id"]):
            print(f"run {run['run_id']} has ended")
            return 0
