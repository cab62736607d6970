"""The controller process, owned by a context manager, and condition waits with deadlines."""

from __future__ import annotations

import json
import logging
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from testbed.errors import RunError
from testbed.paths import ROOT

LOG = logging.getLogger(__name__)
POLL_S = 0.05
STOP_GRACE_S = 5.0


def wait_for(condition, timeout_s: float, what: str, poll_s: float = POLL_S):
    """Poll ``condition()`` until it returns a truthy value; raise RunError naming ``what`` at the
    deadline. ``condition`` may raise RunError itself to fail early (a process died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RunError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)


def read_line(proc: subprocess.Popen, deadline: float, what: str, tick=None) -> str:
    """The next line a child process writes on its stdout (text mode), by ``deadline``
    (monotonic s); RunError naming ``what`` if it exits or the deadline passes first.
    ``tick()``, if given, is called about twice a second while waiting (progress)."""
    while True:
        if tick is not None:
            tick()
        if proc.poll() is not None:
            raise RunError(f"waiting for {what}: it exited with code {proc.returncode}: {stderr_tail(proc)}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise RunError(f"timed out after waiting for {what}")
        readable, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if readable:
            return proc.stdout.readline()


def stderr_tail(proc: subprocess.Popen) -> str:
    """The end of an exited child's stderr (when it was piped), for error messages."""
    if proc.poll() is None or proc.stderr is None:
        return ""
    return (proc.stderr.read() or "").strip()[-2000:]


def stop_children(procs: dict, timeout_s: float):
    """Children that stop when their stdin closes: close every stdin first (they wind down
    together), wait, and end by PID the ones still running at the deadline."""
    for proc in procs.values():
        try:
            if proc.stdin:
                proc.stdin.close()
        except OSError:
            pass
    end = time.monotonic() + timeout_s
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            LOG.warning("%s (pid %d) did not exit; ending it", name, proc.pid)
            proc.kill()
            proc.wait(timeout=timeout_s)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line being written
    return out


class Controller:
    """``python -m testbed.controller`` in its own process, stopped by PID on exit."""

    def __init__(self, plan_path: Path, run_dir: Path, port: int, on_start=None, stats_interval_ns: int = 0,
                 pins: Path | None = None):
        self.plan_path, self.run_dir, self.port = plan_path, run_dir, port
        self.stats_interval_ns = stats_interval_ns  # 0: no collection (telemetry.py: what is collected)
        self.pins = pins  # the run's marker pins (queue counters), if it has queues
        self.events_path = run_dir / "controller-events.jsonl"
        self.log_path = run_dir / "controller.log"
        self.on_start = on_start
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        argv = [sys.executable, "-m", "testbed.controller", "--plan", str(self.plan_path),
                "--events", str(self.events_path), "--port", str(self.port)]
        if self.stats_interval_ns:
            argv += ["--telemetry", str(self.run_dir), "--interval-ns", str(self.stats_interval_ns)]
            if self.pins:
                argv += ["--pins", str(self.pins)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=ROOT)
        if self.on_start:
            self.on_start(self.proc.pid)
        return self

    def __exit__(self, *exc):
        proc, self.proc = self.proc, None
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_GRACE_S)
        return False

    def check_alive(self):
        """Raise RunError with the controller's own reason if it has exited."""
        if self.proc is None or self.proc.poll() is None:
            return
        fatal = [e for e in read_events(self.events_path) if e.get("event") == "fatal"]
        if fatal:
            reason = f"{fatal[-1]['error']} (in {fatal[-1]['handler']})"
        else:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
            reason = "; ".join(tail) or "no output"
        raise RunError(f"the controller exited with status {self.proc.returncode}: {reason} "
                       f"(see {self.log_path})")

    def wait_listening(self, timeout_s: float):
        def ready():
            self.check_alive()
            return _listening(self.port)

        wait_for(ready, timeout_s, f"the controller to listen on 127.0.0.1:{self.port}")

    def wait_poll_after(self, t_ns: int, timeout_s: float):
        """Wait until the collector has polled every counter once after ``t_ns`` (monotonic):
        the run's totals then include everything up to that moment."""

        def polled():
            self.check_alive()
            path = self.run_dir / "polls.jsonl"
            return path.exists() and any(p.get("t_ns", 0) > t_ns for p in read_events(path)[-3:])

        wait_for(polled, timeout_s, "the collector's first poll after training")

    def wait_fabric_ready(self, switches: int, timeout_s: float) -> list[dict]:
        """Wait until every switch acknowledged its program (barrier reply)."""

        def ready():
            self.check_alive()
            events = read_events(self.events_path)
            done = {e["dpid"]: e for e in events if e.get("event") == "switch_ready"}
            return list(done.values()) if len(done) >= switches else None

        return wait_for(ready, timeout_s, f"{switches} switches to connect and confirm their flows")
