"""``testbed doctor --cluster SERVER,...``: can these servers run a share of one run?

Each server is reached with ``ssh root@SERVER`` (BatchMode: keys only, never a prompt;
``TESTBED_SSH_CONFIG`` names an ssh_config file to use instead of root's own) and runs
this module there from the same repository path and interpreter (``python -m
testbed.apply.cluster.doctor probe``). The probe reports its user, its project source digest,
Open vSwitch and the OVS datapath, then answers clock reads over the same ssh session:
the clock offset of each server is measured NTP-style (the sample with the shortest round
trip; its half round trip bounds the error). A run spanning servers puts one start
deadline on every server's CLOCK_MONOTONIC, so what limits it is that error: dilated, it
must stay within a tenth of one MTU's serialisation on the fastest link, which gives the
smallest dilation the servers allow.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from testbed import paths
from testbed.apply.capabilities import Check
from testbed.apply.cluster.ssh import CLOCK_SAMPLES, PROBE_TIMEOUT_S, Session, best_offset, remote_command, source_digest

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


def probe_command() -> str:
    return remote_command("testbed.apply.cluster.doctor probe")


def clock_error_dilation(error_ns: float) -> float:
    """The smallest dilation at which a start-time error of ``error_ns`` (real) stays within a
    tenth of one MTU's serialisation on the fastest link (emulated)."""
    from testbed.model.placement import clock_budget_ns

    return error_ns / clock_budget_ns(FASTEST_LINK_BPS)


def check_server(server: str, local_digest: str) -> list[Check]:
    """The checks of one server: ssh, root, same version, OVS, clock."""
    session = Session(server, probe_command())
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
    from testbed.model.placement import OFFSET_SHARE_OF_MTU

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
        sys.exit("usage: python -m testbed.apply.cluster.doctor probe (run by testbed doctor --cluster over ssh)")
    sys.exit(probe_main())
