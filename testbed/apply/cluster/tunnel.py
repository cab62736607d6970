"""Apply: the crossing links of a cluster share as kernel VXLAN devices on the switches.

A link whose two ends the placement put on different servers (``model.placement.shares``)
becomes, on each server, one VXLAN device named as the planned switch port and added to
that switch at the planned OpenFlow port number: the controller's flows, the egress
queues and the collector's counters find it where the plan says, as if it were the veth.
Both ends use the link's number as the VNI, so each server builds its end from the plan
alone. VXLAN, not GRE: the kernel this project is developed on has no ``ip_gre`` (see
docs/cluster.md); VXLAN's 50 bytes of overhead are what ``doctor --cluster`` checks the
underlay MTU for. Two TX queues, as on every switch port (fabric.TwoQueueLink), so the
data and control classes keep separate qdiscs.

``TunnelPorts`` is a context manager: it records every device in the run registry before
making it, and on exit, normal or not, takes each port off its switch and deletes it.
"""

from __future__ import annotations

import logging
import subprocess

from testbed.apply import registry
from testbed.errors import RunError
from testbed.model import queues

LOG = logging.getLogger(__name__)
CMD_TIMEOUT_S = 30
VXLAN_UDP_PORT = 4789  # IANA's VXLAN port: a firewall between servers must pass it (docs/cluster.md)
TX_QUEUES = 2


def _run(argv, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=check)


def vxlan_argv(end, local_address: str, peer_address: str) -> list[str]:
    """``ip link add`` for one tunnel end (pure: the unit tests check it)."""
    return ["ip", "link", "add", "name", end.intf, "numtxqueues", str(TX_QUEUES), "numrxqueues", str(TX_QUEUES),
            "mtu", str(queues.LINK_MTU_BYTES), "type", "vxlan", "id", str(end.key), "local", local_address,
            "remote", peer_address, "dstport", str(VXLAN_UDP_PORT), "nolearning"]


class TunnelPorts:
    """``with TunnelPorts(share.tunnels, run_id, record, local, {machine: address}):``"""

    def __init__(self, ends, run_id: str, record: registry.RunRecord, local_address: str, peers: dict):
        missing = sorted({e.peer for e in ends} - set(peers))
        if missing:
            raise RunError(f"no underlay address for {', '.join(missing)}: every server holding the other end "
                           f"of a crossing link needs one")
        self.ends, self.run_id, self.record = tuple(ends), run_id, record
        self.local_address, self.peers = local_address, dict(peers)
        self.made: list = []

    def __enter__(self):
        self.record.add(interfaces=[e.intf for e in self.ends])
        try:
            for end in self.ends:
                done = _run(vxlan_argv(end, self.local_address, self.peers[end.peer]), check=False)
                if done.returncode:
                    raise RunError(f"creating the tunnel {end.intf} (VNI {end.key}, to {end.peer}) failed: "
                                   f"{done.stderr.strip()}")
                self.made.append(end)
                _run(["sysctl", "-q", "-w", f"net.ipv6.conf.{end.intf}.disable_ipv6=1"], check=False)
                _run(["ip", "link", "set", "dev", end.intf, "up"])
                done = _run(["ovs-vsctl", "--timeout=10", "add-port", end.switch, end.intf, "--", "set",
                             "Interface", end.intf, f"ofport_request={end.port}"], check=False)
                if done.returncode:
                    raise RunError(f"adding the tunnel {end.intf} to {end.switch} failed: {done.stderr.strip()}")
            registry.tag_interfaces(self.run_id, [e.intf for e in self.ends])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        while self.made:
            end = self.made.pop()
            _run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-port", end.switch, end.intf], check=False)
            _run(["ip", "link", "del", "dev", end.intf], check=False)
        return False
