"""The os-ken controller process of a run (``python -m testbed.controller``), owned by a
context manager, and what the run waits for from it: listening, every switch programmed,
a telemetry poll after training."""

from __future__ import annotations

import sys
from pathlib import Path

from testbed.jsonlines import read_events
from testbed.apply.processes.child import Child, exit_status, listening, wait_for
from testbed.errors import RunError
from testbed.model.placement import WHOLE, Site

STOP_GRACE_S = 5.0


def check_listen_address(address: str) -> str:
    """The controller listens on one explicit IPv4 address: a wildcard (0.0.0.0) would take
    OpenFlow connections from every network the machine is on."""
    import ipaddress

    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        raise RunError(f"controller address {address}: expected one IPv4 address of this machine "
                       f"(e.g. 127.0.0.1, or the cluster network's address)") from None
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise RunError(f"controller address {address}: expected one address of this machine, not a wildcard "
                       f"or broadcast (the listener would accept switches from any network)")
    return str(ip)


class Controller:
    def __init__(self, plan_path: Path, run_dir: Path, port: int, on_start=None, telemetry: bool = False,
                 pins: Path | None = None, site: Site = WHOLE):
        """``site.controller_address``: where the OpenFlow listener binds; loopback unless
        switches on other servers must reach it (a cluster), and then one explicit address,
        never a wildcard. Its collector reads the queues of ``site.switches`` (a cluster run:
        this server's; the other servers' shares collect theirs)."""
        address, queues_of = site.controller_address, site.switches
        self.run_dir, self.port, self.address = run_dir, port, check_listen_address(address)
        self.events_path = run_dir / "controller-events.jsonl"
        self.log_path = run_dir / "controller.log"
        self.on_start = on_start
        argv = [sys.executable, "-m", "testbed.controller", "--plan", str(plan_path),
                "--events", str(self.events_path), "--port", str(port), "--address", address]
        if telemetry:  # what is collected, and how often, is in the plan (controller/telemetry.py)
            argv += ["--telemetry", str(run_dir)]
            if pins:
                argv += ["--pins", str(pins)]
            if queues_of is not None:
                argv += ["--queues-of", ",".join(queues_of)]
        self.child = Child("the controller", argv, log=self.log_path, lines=False)

    def __enter__(self):
        self.child.start()
        if self.on_start:
            self.on_start(self.child.pid)
        return self

    def __exit__(self, *exc):
        if self.child.alive():
            self.child.proc.terminate()
        self.child.end(STOP_GRACE_S)
        return False

    def check_alive(self):
        """Raise RunError with the controller's own reason if it has exited."""
        if self.child.proc is None or self.child.alive():
            return
        fatal = [e for e in read_events(self.events_path) if e.get("event") == "fatal"]
        if fatal:
            raise RunError(f"the controller ended ({exit_status(self.child.proc.returncode)}): {fatal[-1]['error']} "
                           f"(in {fatal[-1]['handler']}); see {self.log_path}")
        raise RunError(f"the controller ended ({self.child.last_words()})")

    def wait_listening(self, timeout_s: float):
        def ready():
            self.check_alive()
            return listening(self.port, self.address)

        wait_for(ready, timeout_s, f"the controller to listen on {self.address}:{self.port}")

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
            done = {e["dpid"]: e for e in read_events(self.events_path) if e.get("event") == "switch_ready"}
            return list(done.values()) if len(done) >= switches else None

        return wait_for(ready, timeout_s, f"{switches} switches to connect and confirm their flows")


