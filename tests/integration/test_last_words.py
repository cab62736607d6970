"""A child process that ends mid-run leaves its last words: how it ended and the end of its
stderr, in the run folder and in the run's error line."""

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from testbed import run
from testbed.apply import registry
from testbed.apply.processes.child import wait_for
from testbed.config import scenario
from testbed.errors import RunError

pytestmark = pytest.mark.integration


def agent_pids(run_id: str) -> dict:
    """The run's agent processes, by the server they serve (from the run's own registry: the
    processes it started, identified by their argv, never matched by name system-wide)."""
    pids = {}
    for proc in json.loads((registry.REGISTRY_DIR / f"{run_id}.json").read_text())["processes"]:
        pid = proc["pid"]
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"testbed.agent" in argv:
            pids[pid] = [a.decode() for a in argv if b"=" in a]
    return pids


@pytest.mark.datapath_independent
def test_an_agent_ended_mid_training_leaves_its_status_and_last_words(tmp_path, clean_slate):
    """SIGTERM to the second server's agent process once the GPUs have recorded ops: the run
    fails at once (not at the hang guard) naming that process, its exit status and what it
    said, and its stderr is in the run folder."""
    ended = {}

    def end_an_agent_once_training(ctx):
        def later():
            records = ctx.run_dir / "agents"
            wait_for(lambda: any(p.stat().st_size for p in records.glob("*.jsonl")), 120, "the GPUs' first op records")
            pid, members = max(agent_pids(ctx.run_dir.name).items(), key=lambda kv: kv[1])  # server 2's
            ended.update(pid=pid, members=members)
            os.kill(pid, signal.SIGTERM)

        threading.Thread(target=later, daemon=True).start()

    sc = scenario.load("default", ["workload.iterations=5"])
    with pytest.raises(RunError) as err:
        run.run(sc, run.RunOptions(results_dir=tmp_path, before_training=end_an_agent_once_training))
    reason = str(err.value)
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    gpus = ", ".join(m.split("=")[0] for m in ended["members"])
    log = run_dir / "agents-server2.log"
    assert f"the agents of server 2 ({gpus}) ended before its schedule was done" in reason, reason
    assert "exit status 143 (SIGTERM)" in reason, reason
    assert f"last stderr: agents {gpus}: ended by SIGTERM" in reason and str(log) in reason, reason
    said = log.read_text()
    assert f"agents {gpus}: ended by SIGTERM" in said and "ops done" in said, said
    # the data collected so far is kept: the agents' records up to the end, the manifest's reason
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["reason"] == reason
    assert any(p.stat().st_size for p in (run_dir / "agents").glob("*.jsonl"))
