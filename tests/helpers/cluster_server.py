"""A second "server" on this machine, for cluster tests: network, mount, UTS and time
namespaces of their own (its CLOCK_MONOTONIC runs MONOTONIC_OFFSET_S ahead of this
machine's, as another machine's would differ), reached over a veth pair, running their own sshd and their own Open vSwitch
(its own database and run directory on a private /run and /etc/openvswitch, userspace
datapath). Everything is started here and ended by PID, in reverse order, on any exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import ExitStack
from pathlib import Path

from testbed.apply.processes.child import wait_for
from testbed.errors import RunError

CMD_TIMEOUT_S = 20
MONOTONIC_OFFSET_S = 1000  # what the coordinator must measure and undo
READY_TIMEOUT_S = 20


def _run(argv):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if done.returncode:
        raise RunError(f"{' '.join(argv)}: exit status {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done


def _wait(what: str, ready, timeout_s: float = READY_TIMEOUT_S):
    wait_for(ready, timeout_s, what)


def _children(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().strip()
    except OSError:
        return ""


def _end(proc: subprocess.Popen):
    """SIGTERM, then SIGKILL; first let the process's children (sshd's per-connection
    processes, finishing a session that just ended) exit, else they outlive it as orphans."""
    try:
        _wait(f"process {proc.pid}'s children to exit", lambda: not _children(proc.pid), 5)
    except RunError:
        pass  # ending it anyway: the leftovers are named by the caller's clean-slate check
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class LocalServer:
    """``with LocalServer(tmp_path, 2) as s:`` -> ``s.address`` answers ssh as root with
    ``s.ssh_config`` (``ssh -F``); ``s.root_intf`` is this machine's end of the veth."""

    def __init__(self, work: Path, index: int):
        self.work, self.index = work / f"server{index}", index
        self.hostname = f"tb-server{index}"
        self.root_intf = f"tbcl{index}"
        self.root_address = f"10.250.{index}.1"
        self.address = f"10.250.{index}.2"
        self.ssh_config = self.work / "ssh_config"
        self._stack = ExitStack()
        self.pid = 0

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def _spawn(self, argv, log: str) -> subprocess.Popen:
        out = open(self.work / log, "wb")
        self._stack.callback(out.close)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._stack.callback(_end, proc)
        return proc

    def inside(self, *argv) -> list[str]:
        # a time namespace applies to the children of the process that made it: enter that one
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-u", f"--time=/proc/{self.pid}/ns/time_for_children", "--",
                *argv]

    def _start(self):
        self.work.mkdir(parents=True)
        holder = self._spawn(["unshare", "--net", "--mount", "--uts", "--time", "--monotonic",
                              str(MONOTONIC_OFFSET_S), "--propagation", "private", "sleep", "infinity"], "holder.log")
        self.pid = holder.pid
        _wait("the server's namespaces", lambda: os.readlink(f"/proc/{self.pid}/ns/mnt")
              != os.readlink("/proc/self/ns/mnt"))
        # a private /run (OVS's sockets and pid files, sshd's privilege separation directory)
        # and /etc/openvswitch (its database), seen only inside
        for path in ("/run", "/etc/openvswitch", "/var/log/openvswitch"):
            _run(self.inside("mount", "-t", "tmpfs", "-o", "mode=0755", "tbcluster", path))
        _run(self.inside("mkdir", "-p", "/run/openvswitch", "/run/sshd"))
        # its own sysfs (a sysfs shows the network namespace of whoever mounted it: /sys/class/net
        # must list this server's interfaces, as the PFC process reads their addresses there),
        # and on it its own bpffs: `testbed clean` there unpins what runs not in its registry
        # left, which must never reach this machine's pins
        _run(self.inside("mount", "-t", "sysfs", "tbcluster", "/sys"))
        _run(self.inside("mount", "-t", "bpf", "tbcluster", "/sys/fs/bpf"))
        _run(self.inside("hostname", self.hostname))
        _run(["ip", "link", "add", self.root_intf, "type", "veth", "peer", "name", "eth0", "netns", str(self.pid)])
        self._stack.callback(subprocess.run, ["ip", "link", "del", self.root_intf], capture_output=True,
                             timeout=CMD_TIMEOUT_S)
        _run(["ip", "addr", "add", f"{self.root_address}/24", "dev", self.root_intf])
        _run(["ip", "link", "set", self.root_intf, "up"])
        _run(self.inside("ip", "addr", "add", f"{self.address}/24", "dev", "eth0"))
        _run(self.inside("ip", "link", "set", "eth0", "up"))
        _run(self.inside("ip", "link", "set", "lo", "up"))
        self._start_ovs()
        self._start_sshd()

    def _start_ovs(self):
        _run(self.inside("ovsdb-tool", "create", "/etc/openvswitch/conf.db",
                         "/usr/share/openvswitch/vswitch.ovsschema"))
        self._spawn(self.inside("ovsdb-server", "/etc/openvswitch/conf.db",
                                "--remote=punix:/run/openvswitch/db.sock", "--pidfile=/run/openvswitch/ovsdb-server.pid"), "ovsdb-server.log")
        _wait("the server's ovsdb-server", lambda: subprocess.run(
            self.inside("ovs-vsctl", "--timeout=2", "--no-wait", "init"), capture_output=True,
            timeout=CMD_TIMEOUT_S).returncode == 0)
        _run(self.inside("ovs-vsctl", "--no-wait", "set", "Open_vSwitch", ".",
                         f"external_ids:system-id={self.hostname}"))
        self._spawn(self.inside("ovs-vswitchd", "unix:/run/openvswitch/db.sock",
                                "--pidfile=/run/openvswitch/ovs-vswitchd.pid"), "ovs-vswitchd.log")
        _wait("the server's ovs-vswitchd", lambda: subprocess.run(
            self.inside("ovs-vsctl", "--timeout=2", "show"), capture_output=True, timeout=CMD_TIMEOUT_S).returncode == 0
            and subprocess.run(self.inside("ovs-appctl", "-t", "ovs-vswitchd", "version"),
                               capture_output=True, timeout=CMD_TIMEOUT_S).returncode == 0)

    def _start_sshd(self):
        key = self.work / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.work / "host_ed25519")])
        (self.work / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        config = self.work / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {self.address}", "Port 22", f"HostKey {self.work / 'host_ed25519'}",
            f"AuthorizedKeysFile {self.work / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "PidFile none", "LogLevel ERROR", ""]))
        self._spawn(self.inside("/usr/sbin/sshd", "-D", "-e", "-f", str(config)), "sshd.log")
        self.ssh_config.write_text("\n".join([
            f"Host {self.address}", "  User root", f"  IdentityFile {key}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.work / 'known_hosts'}", "  StrictHostKeyChecking accept-new",
            "  BatchMode yes", "  ConnectTimeout 5", ""]))
        _wait("the server's sshd to answer", lambda: subprocess.run(
            ["ssh", "-F", str(self.ssh_config), self.address, "true"], capture_output=True,
            timeout=CMD_TIMEOUT_S).returncode == 0)
