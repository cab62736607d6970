"""The run's child processes (controller, PFC process, GPU agents) through one helper, and
condition waits with deadlines.

A ``Child`` is started from an argv (its configuration is a file named on the command
line), may print a ready line, may be handed a start line on stdin, and is stopped by
closing its stdin (its signal to finish), then by PID at a deadline. It is started with
a parent-death signal (SIGTERM when the run's process dies, even by SIGKILL), so no child
outlives the run. A child that ends without its answer is reported with how it ended
(exit status or signal) and the last lines of its stderr, which a run keeps in its folder.
"""

from __future__ import annotations

import ctypes
import logging
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

from testbed.errors import RunError
from testbed.paths import ROOT

LOG = logging.getLogger(__name__)
POLL_S = 0.05
EXIT_WAIT_S = 5  # after its stdout closed, how long a child may take to exit before we report it
LAST_WORDS_LINES = 5
PR_SET_PDEATHSIG = 1


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


def exit_status(returncode: int | None) -> str:
    """How a process ended, in words: ``exit status 4``, ``killed by SIGKILL``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode > 128 and returncode - 128 in signal.valid_signals():  # it handled the signal, then exited
        return f"exit status {returncode} ({signal.Signals(returncode - 128).name})"
    return f"exit status {returncode}"


def last_lines(text: str, n: int = LAST_WORDS_LINES) -> str:
    """The last ``n`` non-empty lines of ``text``, joined with `` | `` for one error line."""
    return " | ".join([line.strip() for line in text.splitlines() if line.strip()][-n:])


def die_with_parent():
    """``preexec_fn``: the child gets SIGTERM when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Child:
    """One child process of the run. ``popen`` starts it (``subprocess.Popen``, or a
    Mininet host's ``popen`` to start it in that host's namespace). stdout is a pipe for
    its ready/done lines (``lines``; otherwise it goes to ``log`` too); stderr goes to
    ``log`` if given, else to a pipe read for error messages."""

    def __init__(self, name: str, argv: list, popen=subprocess.Popen, log: Path | None = None, lines: bool = True):
        self.name, self.argv, self.popen, self.log, self.lines = name, argv, popen, log, lines
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> "Child":
        kw = dict(stdin=subprocess.PIPE, text=True, cwd=str(ROOT), preexec_fn=die_with_parent)
        if self.log is None:
            self.proc = self.popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
            return self
        with open(self.log, "ab") as out:  # the child keeps its own copy of the fd
            self.proc = self.popen(self.argv, stdout=subprocess.PIPE if self.lines else out, stderr=out, **kw)
        return self

    def read_line(self, deadline, what: str, tick=None) -> str:
        """The next line it writes on stdout, by ``deadline`` (monotonic s, or a callable
        returning it: a deadline that moves while there is progress); RunError naming
        ``what`` if it exits (with how it ended and its last words) or the deadline passes
        first. ``tick()``, if given, is called about twice a second while waiting (progress)."""
        while True:
            if tick is not None:
                tick()
            if self.proc.poll() is not None:
                raise RunError(f"waiting for {what}: {self.name} ended ({self.last_words()})")
            left = (deadline() if callable(deadline) else deadline) - time.monotonic()
            if left <= 0:
                raise RunError(f"timed out waiting for {what}")
            readable, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if readable:
                line = self.proc.stdout.readline()
                if not line:  # its stdout closed: it is exiting; say how, once it has
                    try:
                        self.proc.wait(timeout=EXIT_WAIT_S)
                    except subprocess.TimeoutExpired:
                        pass
                    raise RunError(f"waiting for {what}: {self.name} closed its output ({self.last_words()})")
                return line

    def expect(self, word: str, deadline, what: str, tick=None):
        line = self.read_line(deadline, what, tick).strip()
        if line != word:
            raise RunError(f"{self.name} said {line!r} instead of {word!r} ({self.last_words()})")

    def send(self, line: str):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def last_words(self) -> str:
        """How it ended (or that it still runs) and the last lines of its stderr, with the
        file that holds all of it: for error lines."""
        status = exit_status(self.proc.poll() if self.proc is not None else None)
        if self.log is not None:
            try:
                text = self.log.read_text(errors="replace")
            except OSError:
                text = ""
            tail = last_lines(text)
            return f"{status}; last stderr: {tail or '(none)'}; see {self.log}"
        if self.proc is None or self.proc.poll() is None or not self.proc.stderr:
            return status
        return f"{status}; last stderr: {last_lines(self.proc.stderr.read() or '') or '(none)'}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close_stdin(self):
        try:
            if self.proc is not None and self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass

    def end(self, timeout_s: float):
        """Wait until ``timeout_s``, then SIGTERM, then SIGKILL, by PID."""
        proc = self.proc
        if proc is None:
            return
        for action in (None, proc.terminate, proc.kill):
            if action is not None:
                LOG.warning("%s (pid %d) did not exit; %s", self.name, proc.pid,
                            "ending it" if action == proc.terminate else "killing it")
                action()
            try:
                proc.wait(timeout=timeout_s)
                return
            except subprocess.TimeoutExpired:
                continue


def stop_all(children, timeout_s: float):
    """Children that finish when their stdin closes: close every stdin first (they wind
    down together), then end each one by PID at the deadline."""
    children = [c for c in children if c.proc is not None]
    for c in children:
        c.close_stdin()
    end = time.monotonic() + timeout_s
    for c in children:
        c.end(max(0.1, end - time.monotonic()))


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
