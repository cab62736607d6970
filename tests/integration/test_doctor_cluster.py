"""``doctor --cluster`` against a second server on this machine (cluster_server.LocalServer:
its own network, mount, UTS and time namespaces, sshd and Open vSwitch, over a veth pair)."""

import os
import re
import subprocess
import sys

import pytest

from helpers.cluster_server import MONOTONIC_OFFSET_S, LocalServer
from testbed.paths import ROOT

pytestmark = pytest.mark.integration


def doctor(server: LocalServer, servers: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESTBED_SSH_CONFIG=str(server.ssh_config))
    return subprocess.run([sys.executable, "-m", "testbed", "doctor", "--cluster", servers], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def remote(server: LocalServer, *argv) -> str:
    return subprocess.run(["ssh", "-F", str(server.ssh_config), server.address, *argv], capture_output=True,
                          text=True, timeout=30, check=True).stdout


@pytest.mark.datapath_independent  # ssh and a probe: the lab-VM check leaves it to the host
def test_doctor_checks_a_second_server_over_ssh(clean_slate, tmp_path):
    with LocalServer(tmp_path, 2) as s2:
        # the server is its own machine as far as the run can tell: its own OVS instance
        remote(s2, "ovs-vsctl", "add-br", "tbclprobe", "--", "set", "bridge", "tbclprobe", "datapath_type=netdev")
        assert remote(s2, "ovs-vsctl", "list-br").split() == ["tbclprobe"]
        assert "tbclprobe" not in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True,
                                                 timeout=30, check=True).stdout
        # a veth's default MTU cannot carry a fabric link's frames in a tunnel: named, with the fix
        done = doctor(s2, s2.address)
        assert done.returncode == 1
        assert re.search(r"underlay MTU\s+MISSING\s+eth0 \(there\) 1500, tbcl2 \(here\) 1500; tunnels need 4250 "
                         r".*-> ip link set dev eth0 mtu 9000 \(there\); ip link set dev tbcl2 mtu 9000 \(here\)",
                         done.stdout), done.stdout
        subprocess.run(["ip", "link", "set", "dev", s2.root_intf, "mtu", "9000"], check=True, timeout=30)
        remote(s2, "ip", "link", "set", "dev", "eth0", "mtu", "9000")
        done = doctor(s2, s2.address)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert re.search(r"tunnels\s+ok\s+gretap (yes|no), vxlan (yes|no)", out), out
        assert f"ssh root@{s2.address}, host {s2.hostname}" in out
        digest = re.search(r"same version\s+ok\s+source (\w+) \(here (\w+)\)", out)
        assert digest and digest[1] == digest[2], out
        assert re.search(r"Open vSwitch\s+ok\s+ovs-vswitchd \(Open vSwitch\)", out), out
        # the second server's CLOCK_MONOTONIC runs MONOTONIC_OFFSET_S ahead (its time
        # namespace's offset on one kernel's clock): the measured offset lies within the
        # error the measurement claims of that
        clock = re.search(r"offset ([-+][\d.]+) us \+- ([\d.]+) us", out)
        assert clock and abs(float(clock[1]) - MONOTONIC_OFFSET_S * 1e6) <= float(clock[2]), out
        # a server that does not answer: named, with ssh's reason, and a non-zero exit
        done = doctor(s2, f"{s2.address},{s2.address[:-1]}3")
        assert done.returncode == 1
        assert re.search(rf"{re.escape(s2.address[:-1])}3: ssh \+ probe\s+MISSING\s+ssh: connect to host", done.stdout)
        assert "Traceback" not in done.stderr
