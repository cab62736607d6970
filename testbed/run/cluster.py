"""Training across servers, from the coordinator: its own GPUs' agents and every other
server's share (``apply.cluster.RemoteShare``, run/share.py) start on one deadline, run to
the end, and their records land in one folder on one time line (docs/cluster.md).

The start time is this machine's CLOCK_MONOTONIC plus a margin; each server gets it
shifted by its clock offset, measured over its share's own session just before (the best
of CLOCK_SAMPLES round trips, ``apply.cluster.best_offset``). A server's records come back
in its clock and are shifted back (``model.cluster.to_coordinator_clock``). The offsets
and their errors are returned, for the run's manifest and the fidelity guard.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from testbed.apply.agents import READY_TIMEOUT_S
from testbed.model.cluster import to_coordinator_clock

LOG = logging.getLogger(__name__)
START_MARGIN_S = 2.0  # the train command crosses ssh to every server before the start
RECORDS_TIMEOUT_S = 60


def train_across(agents, far: list, records_dir: Path, timeout_s: float, progress=None) -> dict:
    """``agents``: this machine's entered ``apply.agents.Agents``; ``far``: the other servers'
    entered RemoteShares. Returns ``{"start_ns": ..., "clocks": {server: {offset_ns, error_ns}}}``
    once every GPU has finished and every server's records are in ``records_dir``."""
    clocks = {}
    for f in far:
        offset_ns, error_ns = f.clock_offset()
        clocks[f.server] = {"offset_ns": round(offset_ns), "error_ns": round(error_ns)}
        LOG.info("%s: clock offset %+d ns (error %d ns)", f.server, round(offset_ns), round(error_ns))
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
