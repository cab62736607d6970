"""A server's share of a cluster run, seen from the coordinator: brought up over one ssh
session (run/share.py on that server), held while the run trains, torn down when the
session's stdin closes; and ``testbed clean`` on a server the same way."""

from __future__ import annotations

import json
import subprocess
import time

from testbed.apply.cluster.ssh import CLOCK_SAMPLES, PROBE_TIMEOUT_S, Session, best_offset, remote_command, ssh_argv


def share_command() -> str:
    """A server's share of a run (run/share.py)."""
    return remote_command("testbed.run.share")


SHARE_UP_TIMEOUT_S = 120  # a hang deadline, as the run's FABRIC_READY_TIMEOUT_S
SHARE_DOWN_TIMEOUT_S = 60


class RemoteShare:
    """``with RemoteShare(server, request):`` one server's share of a run, brought up over
    one ssh session by run/share.py (``request``: the JSON it reads, see there), held while
    the block runs, torn down when the session's stdin closes. ``ready`` is its answer
    (switches, GPUs, tunnel ends); a share that fails raises RunError with its reason."""

    def __init__(self, server: str, request: dict):
        self.server, self.request = server, request
        self.session: Session | None = None
        self.ready: dict = {}

    def __enter__(self):
        from testbed.errors import RunError

        self.session = Session(self.server, share_command())
        try:
            self.session.proc.stdin.write(json.dumps(self.request).encode() + b"\n")
            self.session.proc.stdin.flush()
            line = self.session.line(time.monotonic() + SHARE_UP_TIMEOUT_S)
            answer = json.loads(line) if line else {}
            if answer.get("event") != "ready":
                err = self._end()
                reason = answer.get("error") or (err.splitlines()[-1] if err else "no answer")
                raise RunError(f"{self.server}: its share of the run did not come up: {reason}")
        except BaseException:
            self._end()
            raise
        self.ready = answer
        return self

    def clock_offset(self) -> tuple[float, float]:
        """(offset_ns, error_ns) of this server's CLOCK_MONOTONIC against ours (remote =
        local + offset), from CLOCK_SAMPLES reads over the share's session (best_offset)."""
        from testbed.errors import RunError

        samples = self.session.clock_samples(time.monotonic() + PROBE_TIMEOUT_S)
        if len(samples) < CLOCK_SAMPLES:
            raise RunError(f"{self.server}: its share did not answer a clock read within {PROBE_TIMEOUT_S} s")
        return best_offset(samples)

    def send(self, command: str):
        """A command line to the share (run/share.py lists them); ``answer`` reads its reply."""
        self.session.proc.stdin.write(command.encode() + b"\n")
        self.session.proc.stdin.flush()

    def answer(self, event: str, timeout_s: float, what: str) -> dict:
        """The share's next answer, which must be ``event``; else RunError naming the server,
        ``what`` was awaited and the share's reason."""
        from testbed.errors import RunError

        line = self.session.line(time.monotonic() + timeout_s)
        reply = json.loads(line) if line else {}
        if reply.get("event") != event:
            why = reply.get("error") or (f"no answer within {timeout_s:.0f} s" if line is None else line)
            raise RunError(f"{self.server}: {what}: {why}")
        return reply

    def ask(self, command: str, event: str, timeout_s: float, what: str) -> dict:
        self.send(command)
        return self.answer(event, timeout_s, what)

    def _end(self) -> str:
        session, self.session = self.session, None
        return session.close(SHARE_DOWN_TIMEOUT_S) if session else ""

    def __exit__(self, *exc):
        session = self.session
        if session is None:
            return False
        try:
            session.proc.stdin.close()  # the share tears down and answers "down"
        except OSError:
            pass
        # answers to a command still in flight (a failed run's) come first: read to "down"
        deadline, answer = time.monotonic() + SHARE_DOWN_TIMEOUT_S, {}
        while answer.get("event") != "down":
            line = session.line(deadline)
            if line is None:
                break
            answer = json.loads(line) if line.startswith("{") else {"error": line}
        err = self._end()
        if answer.get("event") != "down" and exc[0] is None:
            from testbed.errors import RunError

            raise RunError(f"{self.server}: its share did not confirm its teardown: "
                           f"{answer.get('error') or err or 'no answer'} (testbed clean on that server)")
        return False


CLEAN_TIMEOUT_S = 120


def clean_server(server: str, dry_run: bool = False) -> tuple[bool, list[str]]:
    """``testbed clean`` on one server over ssh, as it would run there (its own run registry:
    what its shares left behind). Returns (it answered, its lines or ssh's reason)."""
    argv = ssh_argv(server, remote_command("testbed clean" + (" --dry-run" if dry_run else "")))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CLEAN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, [f"no answer within {CLEAN_TIMEOUT_S} s"]
    if done.returncode:
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
        return False, lines[-3:]
    return True, done.stdout.strip().splitlines()
