"""Reaching the other servers of a cluster run: ``ssh root@SERVER`` (BatchMode: keys only,
never a prompt; ``TESTBED_SSH_CONFIG`` names an ssh_config file to use instead of root's
own) running ``python -m MODULE`` from the same repository path and interpreter there; one
session's lines and its clock reads (NTP-style: the sample with the shortest round trip,
whose half round trip bounds the error); what "the same version" means (source_digest).
Used by the doctor's probe (apply/cluster/doctor.py) and a run's shares (apply/cluster/remote_share.py)."""

from __future__ import annotations

import hashlib
import os
import selectors
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from testbed import paths

SSH_CONNECT_TIMEOUT_S = 5
PROBE_TIMEOUT_S = 30  # for a probe's report and a session's clock reads
CLOCK_SAMPLES = 16


def source_digest() -> str:
    """What "the same version" means: a digest of the project's code (testbed/, bpf/), so a
    server with an edited or older checkout is told apart from one with this one."""
    h = hashlib.sha256()
    for top in ("testbed", "bpf"):
        for path in sorted((paths.ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".c", ".h"):
                h.update(str(path.relative_to(paths.ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def ssh_argv(server: str, remote: str) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", "-l", "root"]
    if os.environ.get("TESTBED_SSH_CONFIG"):
        argv += ["-F", os.environ["TESTBED_SSH_CONFIG"]]
    return argv + [server, remote]


def remote_command(module_argv: str) -> str:
    """The remote command line: ``python -m MODULE ARGS`` from this repository's path and
    interpreter, on the server (every server has the project at the same path)."""
    return f"cd {shlex.quote(str(paths.ROOT))} && exec {shlex.quote(sys.executable)} -m {module_argv}"


@dataclass(frozen=True)
class ClockSample:
    local_before_ns: int
    remote_ns: int
    local_after_ns: int

    @property
    def round_trip_ns(self) -> int:
        return self.local_after_ns - self.local_before_ns

    @property
    def offset_ns(self) -> float:
        """remote - local, taking the remote read to be at the round trip's middle."""
        return self.remote_ns - (self.local_before_ns + self.local_after_ns) / 2


def best_offset(samples: list[ClockSample]) -> tuple[float, float]:
    """(offset_ns, error_ns): the shortest round trip's offset, and half that round trip
    (the remote read happened somewhere inside it)."""
    best = min(samples, key=lambda s: s.round_trip_ns)
    return best.offset_ns, best.round_trip_ns / 2


class Session:
    """One ssh session running the probe (its report, then clock reads on demand) or a
    share (its answers, one JSON line each)."""

    def __init__(self, server: str, command: str):
        self.server = server
        self.proc = subprocess.Popen(ssh_argv(server, command), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buf = b""

    def line(self, deadline: float) -> str | None:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def clock(self, deadline: float) -> ClockSample | None:
        before = time.monotonic_ns()
        self.proc.stdin.write(b"t\n")
        self.proc.stdin.flush()
        answer = self.line(deadline)
        after = time.monotonic_ns()
        return ClockSample(before, int(answer.split()[0]), after) if answer else None

    def clock_samples(self, deadline: float) -> list:
        """Up to CLOCK_SAMPLES clock reads, fewer if one goes unanswered by ``deadline``."""
        samples = []
        for _ in range(CLOCK_SAMPLES):
            s = self.clock(deadline)
            if s is None:
                break
            samples.append(s)
        return samples

    def close(self, timeout_s: float = SSH_CONNECT_TIMEOUT_S) -> str:
        """Ends the session; returns what ssh or the probe said on stderr."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sel.close()
        err = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return err
