"""``testbed doctor --cluster SERVER,...``: can these servers run a share of one run?

Each server is reached with ``ssh root@SERVER`` (BatchMode: keys only, never a prompt;
``TESTBED_SSH_CONFIG`` names an ssh_config file to use instead of root's own) and runs
this module there from the same repository path and interpreter (``python -m
testbed.apply.cluster probe``). The probe reports its user, its project source digest,
Open vSwitch and the OVS datapath, then answers clock reads over the same ssh session:
the clock offset of each server is measured NTP-style (the sample with the shortest round
trip; its half round trip bounds the error). A run spanning servers puts one start
deadline on every server's CLOCK_MONOTONIC, so what limits it is that error: dilated, it
must stay within a tenth of one MTU's serialisation on the fastest link, which gives the
smallest dilation the servers allow.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from testbed import paths
from testbed.apply.capabilities import Check

SSH_CONNECT_TIMEOUT_S = 5
PROBE_TIMEOUT_S = 30
CLOCK_SAMPLES = 16
FASTEST_LINK_BPS = 400e9
TUNNEL_OVERHEAD_BYTES = 50  # VXLAN: outer Ethernet 14 + IP 20 + UDP 8 + VXLAN 8 (gretap needs 38)


def underlay_mtu_needed() -> int:
    """The MTU the network between servers needs: a fabric link's frames plus a tunnel."""
    from testbed.model.queues import LINK_MTU_BYTES

    return LINK_MTU_BYTES + TUNNEL_OVERHEAD_BYTES


def interface_of(address: str | None) -> dict | None:
    """{"intf", "mtu"} of the interface holding ``address`` here, None if none does."""
    if not address:
        return None
    from testbed.apply import capabilities

    done = capabilities._run(["ip", "-j", "addr", "show"])
    for link in json.loads(done.stdout or "[]"):
        if any(a.get("local") == address for a in link.get("addr_info", ())):
            return {"intf": link["ifname"], "mtu": link["mtu"]}
    return None


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


def probe_command() -> str:
    return remote_command("testbed.apply.cluster probe")


def clock_error_dilation(error_ns: float) -> float:
    """The smallest dilation at which a start-time error of ``error_ns`` (real) stays within a
    tenth of one MTU's serialisation on the fastest link (emulated)."""
    from testbed.model.cluster import clock_budget_ns

    return error_ns / clock_budget_ns(FASTEST_LINK_BPS)


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


def share_command() -> str:
    """A server's share of a run (run/share.py)."""
    return remote_command("testbed.run.share")


class _Session:
    """One ssh session running the probe (its report, then clock reads on demand) or a
    share (its answers, one JSON line each)."""

    def __init__(self, server: str, command: str | None = None):
        self.server = server
        self.proc = subprocess.Popen(ssh_argv(server, command or probe_command()), stdin=subprocess.PIPE,
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


SHARE_UP_TIMEOUT_S = 120  # a hang deadline, as the run's FABRIC_READY_TIMEOUT_S
SHARE_DOWN_TIMEOUT_S = 60


class RemoteShare:
    """``with RemoteShare(server, request):`` one server's share of a run, brought up over
    one ssh session by run/share.py (``request``: the JSON it reads, see there), held while
    the block runs, torn down when the session's stdin closes. ``ready`` is its answer
    (switches, GPUs, tunnel ends); a share that fails raises RunError with its reason."""

    def __init__(self, server: str, request: dict):
        self.server, self.request = server, request
        self.session: _Session | None = None
        self.ready: dict = {}

    def __enter__(self):
        from testbed.errors import RunError

        self.session = _Session(self.server, share_command())
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


def check_server(server: str, local_digest: str) -> list[Check]:
    """The checks of one server: ssh, root, same version, OVS, clock."""
    session = _Session(server)
    try:
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        first = session.line(deadline)
        report = json.loads(first) if first and first.startswith("{") else None
        samples = session.clock_samples(deadline) if report is not None else []
    finally:
        err = session.close()
    name = f"{server}:"
    if report is None:
        why = err.splitlines()[-1] if err else f"no answer in {PROBE_TIMEOUT_S} s"
        fix = (f"set up passwordless ssh as root (docs/cluster.md), and the project at {paths.ROOT} with "
               f"{sys.executable}" if session.proc.returncode != 255 else
               "ssh keys for root, sshd reachable (docs/cluster.md)")
        return [Check(f"{name} ssh + probe", False, why, fix)]
    out = [Check(f"{name} ssh + probe", True, f"ssh root@{server}, host {report['hostname']}")]
    out.append(Check(f"{name} root", report["uid"] == 0, f"uid {report['uid']}", "log in as root"))
    same = report["source"] == local_digest
    out.append(Check(f"{name} same version", same, f"source {report['source']} (here {local_digest})",
                     f"check out the same commit at {paths.ROOT} on {server}"))
    out.append(Check(f"{name} Open vSwitch", report["ovs_ok"], report["ovs"],
                     "bash scripts/install.sh on the server"))
    out.append(Check(f"{name} OVS datapath", True, "kernel (openvswitch.ko)" if report["kernel_datapath"]
                     else "userspace (netdev): no openvswitch.ko", required=False))
    tunnels = report["tunnels"]
    out.append(Check(f"{name} tunnels", any(tunnels.values()),
                     ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in tunnels.items()),
                     "a kernel with ip_gre or vxlan"))
    out.append(_underlay_check(name, report))
    if len(samples) < CLOCK_SAMPLES:
        out.append(Check(f"{name} clock", False, f"{len(samples)} of {CLOCK_SAMPLES} clock reads answered",
                         "a stable ssh connection"))
        return out
    from testbed.model.cluster import OFFSET_SHARE_OF_MTU

    offset_ns, error_ns = best_offset(samples)
    out.append(Check(f"{name} clock", True,
                     f"CLOCK_MONOTONIC offset {offset_ns / 1e3:+.1f} us +- {error_ns / 1e3:.1f} us (best of "
                     f"{len(samples)} reads); a run needs dilation >= {clock_error_dilation(error_ns):.0f} for that "
                     f"error to stay within {OFFSET_SHARE_OF_MTU:g} MTU at {FASTEST_LINK_BPS / 1e9:g}G"))
    return out


def _underlay_check(name: str, report: dict) -> Check:
    """Both ends of the path ssh took (the network the tunnels would take) carry a fabric
    link's frame plus the tunnel's headers."""
    need = underlay_mtu_needed()
    ends = [("there", report["underlay"]), ("here", interface_of(report["client_address"]))]
    known = [(side, end) for side, end in ends if end is not None]
    if len(known) < 2:
        return Check(f"{name} underlay MTU", None, "could not tell which interfaces ssh used", required=False)
    text = ", ".join(f"{end['intf']} ({side}) {end['mtu']}" for side, end in known)
    short = [(side, end["intf"]) for side, end in known if end["mtu"] < need]
    fix = "; ".join(f"ip link set dev {intf} mtu 9000 ({side})" for side, intf in short)
    return Check(f"{name} underlay MTU", not short, f"{text}; tunnels need {need} (link MTU + "
                 f"{TUNNEL_OVERHEAD_BYTES})", fix + " and every hop between the servers" if short else "")


def checks(servers) -> list[Check]:
    digest = source_digest()
    out = []
    for server in servers:
        out += check_server(server, digest)
    return out


def probe_main() -> int:
    """The server side: one JSON report line, then one clock read per line read."""
    from testbed.apply import capabilities

    db = capabilities._run(["ovs-vsctl", "--timeout=3", "show"])
    daemon = capabilities._run(["ovs-appctl", "--timeout=3", "-t", "ovs-vswitchd", "version"])
    failed = next((r for r in (db, daemon) if r.returncode), None)
    report = {"uid": os.geteuid(), "hostname": socket.gethostname(), "source": source_digest(),
              "ovs_ok": failed is None,
              "ovs": (daemon.stdout.splitlines()[0] if failed is None else
                      f"{' '.join(failed.args[:3])}: {(failed.stderr.strip() or 'failed').splitlines()[-1]}"),
              "kernel_datapath": capabilities.ovs_kernel_datapath(), "tunnels": capabilities.tunnel_support()}
    # SSH_CONNECTION: "client address, client port, server address, server port"
    conn = os.environ.get("SSH_CONNECTION", "").split()
    report["client_address"] = conn[0] if len(conn) == 4 else None
    report["underlay"] = interface_of(conn[2]) if len(conn) == 4 else None
    out = sys.stdout.buffer
    out.write(json.dumps(report).encode() + b"\n")
    out.flush()
    for _ in sys.stdin.buffer:
        out.write(f"{time.monotonic_ns()}\n".encode())
        out.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["probe"]:
        sys.exit("usage: python -m testbed.apply.cluster probe (run by testbed doctor --cluster over ssh)")
    sys.exit(probe_main())
