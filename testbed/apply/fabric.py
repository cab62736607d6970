"""Apply: bring the planned fabric up in Mininet with Open vSwitch, and take it down.

The only module that imports Mininet. ``MininetFabric`` is a context manager: on
entry it records every bridge and interface it is about to create in the run
registry, builds hosts, OVS switches (OpenFlow 1.3, fail-mode secure, controller
on 127.0.0.1 or a cluster's explicit address), NVLink bridges and links exactly as the
plan says (names, port numbers, MACs, addresses), or one cluster share of them with its
crossing links as tunnels (apply.cluster.tunnel), tags what it made with the run id, and
configures the GPU hosts (static neighbours, no IPv6 chatter, TX checksum offload off on the
userspace datapath). On exit, normal or not, it stops the network.
"""

from __future__ import annotations

import logging
import os
import subprocess
import zlib
from pathlib import Path

from mininet.link import Link as MnLink
from mininet.log import lg as mininet_log, setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController, Switch
from mininet.topo import Topo

# Importing mininet.log makes every logger created afterwards a MininetLogger (its own
# level and handler): ours, created after a fabric module is imported, would go silent
logging.setLoggerClass(logging.Logger)

from testbed.model import queues  # noqa: E402
from testbed.apply import registry  # noqa: E402
from testbed.errors import RunError  # noqa: E402
from testbed.model.plan import Plan  # noqa: E402
from testbed.model.placement import WHOLE, Site  # noqa: E402

LOG = logging.getLogger(__name__)
CMD_TIMEOUT_S = 30
mininet_log.propagate = False  # Mininet prints through its own handler; don't print twice
SHELL_EXIT_TIMEOUT_S = 10


class ExternalController(RemoteController):
    """Our os-ken process: already listening when the fabric starts (the run waits for it)."""

    def checkListening(self):  # noqa: N802 - Mininet's name
        return None

    def stop(self, *args, **kwargs):
        """Mininet's RemoteController.stop does nothing, leaving this node's shell running."""
        self.terminate()


class NVLinkBridge(Switch):
    """A server's NVLink segment: a plain Linux bridge, not part of the OpenFlow fabric."""

    def start(self, controllers):
        _ip(["link", "add", "name", self.name, "type", "bridge"])
        for intf in self.intfList():
            if intf.name != "lo":
                _ip(["link", "set", "dev", intf.name, "master", self.name, "up"])
        _ip(["link", "set", "dev", self.name, "up"])

    def stop(self, deleteIntfs=True):  # noqa: N803 - Mininet's name
        _ip(["link", "del", "dev", self.name], check=False)
        super().stop(deleteIntfs)


class TwoQueueLink(MnLink):
    """Mininet's veth link with two TX (and RX) queues per end: switch ports keep the
    lossless data class and the control class in separate queues (an mq root with one
    qdisc per queue), so pausing one never holds the other."""

    TX_QUEUES = 2

    @classmethod
    def makeIntfPair(cls, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,  # noqa: N802
                     deleteIntfs=True):  # noqa: N803 - Mininet's names
        run1 = node1.cmd if node1 else None
        run2 = node2.cmd if node2 else None
        if deleteIntfs:
            for run, name in ((run1, intfname1), (run2, intfname2)):
                (run or _quiet)(f"ip link del {name}")
        q = f"numtxqueues {cls.TX_QUEUES} numrxqueues {cls.TX_QUEUES}"
        a1 = f" address {addr1}" if addr1 else ""
        a2 = f" address {addr2}" if addr2 else ""
        netns = node2.pid if node2 else 1
        out = (run1 or _quiet)(f"ip link add name {intfname1} {q}{a1} type veth peer name {intfname2} {q}{a2} "
                               f"netns {netns}")
        if out:
            raise RunError(f"creating the link {intfname1} - {intfname2} failed: {out.strip()}")


def _quiet(cmd: str) -> str:
    done = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    return done.stdout + done.stderr


def _ip(args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=check)


def _disable_ipv6(interfaces):
    """Switch ports are not hosts: stop the kernel sending router solicitations and MLD reports
    from them, which would otherwise show up in the fabric's port counters."""
    for name in interfaces:
        path = Path("/proc/sys/net/ipv6/conf") / name / "disable_ipv6"
        if path.exists():
            path.write_text("1\n")


def rps_mask(name: str, ncpu: int) -> str:
    """The one CPU (a hex mask) that takes every packet a veth end receives: one per
    interface, spread over the CPUs by name."""
    return f"{1 << (zlib.crc32(name.encode()) % ncpu):x}"


def _steer_receive(interfaces):
    """Every packet a veth end receives is processed on one CPU (RPS with a one-CPU mask).
    Without it a veth delivers each packet on the CPU that sent it, and the senders here
    (OVS's threads, a TBF's watchdog timer) move between CPUs: one flow's packets land in
    two CPUs' backlogs and can overtake each other, which a real link never does."""
    ncpu = os.cpu_count() or 1
    for name in interfaces:
        path = Path("/sys/class/net") / name / "queues" / "rx-0" / "rps_cpus"
        if path.exists():
            path.write_text(rps_mask(name, ncpu) + "\n")


def _set_mtu(work_dir: Path, interfaces):
    """Jumbo frames on the root-namespace ends (switch ports, NVLink bridges): RoCE's
    4096-byte payload needs an IP MTU of 4140; hosts set theirs in ``_configure_hosts``."""
    batch = work_dir / "root-mtu.ipbatch"
    batch.write_text("".join(f"link set dev {name} mtu {queues.LINK_MTU_BYTES}\n" for name in interfaces))
    done = _ip(["-batch", str(batch)], check=False)
    if done.returncode:
        raise RunError(f"setting MTU {queues.LINK_MTU_BYTES} on the switch ports failed: {done.stderr.strip()}")


def _part(plan: Plan, share=None):
    """(switches, servers with a bridge here, hosts, links) of the plan this machine builds:
    all of it, or one cluster share (model.placement.Share) of it."""
    if share is None:
        return plan.switches, [s for s in plan.servers if s.nvlink_bridge], plan.hosts, plan.links
    return ([s for s in plan.switches if s.name in share.switches],
            [s for s in plan.servers if s.nvlink_bridge and s.nvlink_bridge in share.bridges],
            [h for h in plan.hosts if h.name in share.hosts], list(share.links))


def build_topo(plan: Plan, datapath: str, share=None) -> Topo:
    """The plan (or one cluster share of it) as a Mininet Topo (pure data: no root needed to
    build or inspect it). A share's crossing links are not in it: apply.cluster.tunnel adds them."""
    topo = Topo()
    ovs_dp = "user" if datapath == "user" else "kernel"
    switches, servers, hosts, links = _part(plan, share)
    for s in switches:
        topo.addSwitch(s.name, dpid=s.dpid_hex, datapath=ovs_dp, failMode="secure",
                      protocols="OpenFlow13,OpenFlow15")
    for server in servers:
        topo.addSwitch(server.nvlink_bridge, cls=NVLinkBridge, dpid=f"{0xff00 + server.index:016x}")
    for h in hosts:
        topo.addHost(h.name, ip=h.ip, mac=h.mac)
    for link in links:
        topo.addLink(link.a, link.b, port1=link.a_port, port2=link.b_port)
    return topo


def root_interfaces(plan: Plan, share=None) -> list[str]:
    """Interfaces this fabric creates in the root namespace (switch and bridge ends; a
    share's tunnel ends are apply.cluster.tunnel's)."""
    _switches, servers, _hosts, links = _part(plan, share)
    names = [link.b_intf for link in links]
    names += [link.a_intf for link in links if link.kind == "uplink"]
    names += [s.nvlink_bridge for s in servers]
    return names


class MininetFabric:
    """Context manager owning the Mininet network of one run."""

    def __init__(self, plan: Plan, run_id: str, datapath: str, controller_port: int,
                 record: registry.RunRecord, work_dir: Path, link_delay: bool = False,
                 site: Site = WHOLE):
        """``site`` (model.placement.Site): the whole plan, or only this machine's share of a
        cluster run, its crossing links as tunnels to the underlay address of each other
        server; the controller is then on another server or on this one's cluster address."""
        self.plan, self.run_id, self.datapath, self.link_delay = plan, run_id, datapath, link_delay
        self.controller_port, self.record, self.work_dir = controller_port, record, work_dir
        self.controller_address, self.share, self.underlay = site.controller_address, site.share, site.underlay
        self.net: Mininet | None = None
        self.tunnels = None

    def __enter__(self):
        self._check_free()
        switches, _servers, hosts, _links = _part(self.plan, self.share)
        self.hosts = hosts
        bridges = [s.name for s in switches]
        interfaces = root_interfaces(self.plan, self.share)
        self.record.add(bridges=bridges, interfaces=interfaces)
        setLogLevel("error")
        try:
            self.net = Mininet(topo=build_topo(self.plan, self.datapath, self.share), switch=OVSSwitch,
                               link=TwoQueueLink, controller=None, autoSetMacs=False, autoStaticArp=False,
                               build=False, waitConnected=False)
            self.net.addController(ExternalController("c0", ip=self.controller_address, port=self.controller_port))
            self.net.build()
            self.record.add(processes=[n.pid for n in self.net.hosts + self.net.controllers])
            _disable_ipv6(interfaces)
            _steer_receive([n for n in interfaces if "-eth" in n])
            # veth ends only: a Linux bridge (NVLink) takes the smallest MTU of its ports
            _set_mtu(self.work_dir, [n for n in interfaces if "-eth" in n])
            self.net.start()
            registry.tag_bridges(self.run_id, bridges)
            registry.tag_interfaces(self.run_id, interfaces)
            if self.share is not None and self.share.tunnels:
                from testbed.apply.cluster.tunnel import TunnelPorts

                self.tunnels = TunnelPorts(self.share.tunnels, self.run_id, self.record,
                                           self.underlay[self.share.machine], self.underlay).__enter__()
            self._configure_hosts()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.tunnels is not None:
            tunnels, self.tunnels = self.tunnels, None
            tunnels.__exit__(None, None, None)
        if self.net is not None:
            net, self.net = self.net, None
            pids = [n.pid for n in net.hosts + net.controllers if n.pid]
            net.stop()
            registry.wait_gone(pids, SHELL_EXIT_TIMEOUT_S)  # Mininet signals its shells but does not wait
        return False

    def _check_free(self):
        listed = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True,
                                timeout=CMD_TIMEOUT_S)
        if listed.returncode:
            raise RunError(f"Open vSwitch is not running ({listed.stderr.strip()[:200]}): start it with "
                           f"scripts/install.sh, or /usr/share/openvswitch/scripts/ovs-ctl start")
        existing = set(listed.stdout.split())
        links = set(_ip(["-o", "link", "show"]).stdout.split())
        switches = _part(self.plan, self.share)[0]
        ours = root_interfaces(self.plan, self.share) + [t.intf for t in (self.share.tunnels if self.share else ())]
        clash = sorted(n for n in [s.name for s in switches] if n in existing)
        clash += sorted(n for n in ours if f"{n}:" in links or any(
            tok.startswith(f"{n}@") for tok in links))
        if clash:
            raise RunError(f"names this run needs already exist: {', '.join(clash[:6])}"
                           f"{' ...' if len(clash) > 6 else ''}. Another run is active, or a killed run left "
                           f"them behind: python3 -m testbed clean")

    def _configure_hosts(self):
        """Static neighbours for every other GPU, IPv6 off, NVLink address, checksum offload off."""
        procs = []
        for h in self.hosts:
            node = self.net.get(h.name)
            batch = self.work_dir / f"{h.name}.ipbatch"
            lines = [f"link set dev {intf.name} mtu {queues.LINK_MTU_BYTES}" for intf in node.intfList()
                     if intf.name != "lo"]
            lines += [f"neigh replace {o.addr} lladdr {o.mac} dev {h.name}-eth0 nud permanent"
                      for o in self.plan.hosts if o.name != h.name]
            if h.nvlink_ip:
                lines.append(f"addr add {h.nvlink_ip} dev {h.name}-eth1")
                lines.append(f"link set dev {h.name}-eth1 address {h.nvlink_mac}")
            batch.write_text("\n".join(lines) + "\n")
            procs.append((h.name, node.popen(["ip", "-batch", str(batch)])))
            procs.append((h.name, node.popen(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                                              "net.ipv6.conf.default.disable_ipv6=1"])))
            # the GPU's end of its cable: RPS as on the switch ports (_steer_receive), written
            # in a private mount of this namespace's sysfs
            rps = f"/sys/class/net/{h.name}-eth0/queues/rx-0/rps_cpus"
            procs.append((h.name, node.popen(["unshare", "--mount", "sh", "-c",
                                              f"umount -l /sys && mount -t sysfs sysfs /sys && echo {rps_mask(h.name + '-eth0', os.cpu_count() or 1)} > {rps}"])))
            if self.datapath == "user":
                for intf in node.intfList():
                    procs.append((h.name, node.popen(["ethtool", "-K", intf.name, "tx", "off"])))
            if self.link_delay:  # the GPU's end of its cable (switch ends: apply.datapath.egress.EgressQueues)
                (link,) = [lk for lk in self.plan.fabric_links if h.name in (lk.a, lk.b)]
                us = max(1, round(self.plan.dilation.duration_ns(link.delay_ns) / 1000))
                procs.append((h.name, node.popen(["tc", "qdisc", "replace", "dev", f"{h.name}-eth0", "root", "netem",
                                                  "delay", f"{us}us", "limit", "100000"])))
        for name, proc in procs:
            out, err = proc.communicate(timeout=CMD_TIMEOUT_S)
            if proc.returncode:
                raise RunError(f"configuring {name} failed: {proc.args}: {err.decode().strip()}")

    def host(self, name: str):
        return self.net.get(name)

    def has_host(self, name: str) -> bool:
        """Whether GPU ``name`` is on this machine (all are, unless this is a cluster share)."""
        return self.share is None or name in self.share.hosts

    def cli(self):
        from mininet.cli import CLI

        setLogLevel("output")  # the CLI prints command output through Mininet's log
        try:
            CLI(self.net)
        finally:
            setLogLevel("error")
