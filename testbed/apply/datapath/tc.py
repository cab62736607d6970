"""Traffic control on switch ports through netlink (the only pyroute2 import).

Per port (a veth with two TX queues): an ``mq`` root; under it, queue 0 (the lossless
data class) gets a TBF at the emulated port rate with a byte FIFO, queue 1 (the control
class: CNPs, ACKs) keeps the kernel's default FIFO (1000 packets, never paused); and the marker program on the clsact egress hook,
attached by the file descriptor of the run's pinned program (loaded once, shared by every
port), which picks the queue per packet. PFC pauses the data class by turning its TBF's
rate down to ``PAUSED_RATE_BPS`` and back (lossless and in order, ~1 ms a change). Qdiscs and filters go
away with their interface, so the fabric's teardown removes them. Counters are read
by ``qdiscstat`` (one RTM_GETQDISC per port over a raw netlink socket).
"""

from __future__ import annotations

import subprocess

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from testbed.errors import RunError
from testbed.apply.datapath.qdiscstat import TBF_HANDLE, TBF_PARENT, QdiscReader

TC_H_CLSACT_EGRESS = 0xFFFFFFF3
TC_H_ROOT = 0xFFFFFFFF
MQ_HANDLE = 0x10000  # 1:
NETEM_HANDLE, CONTROL_NETEM_HANDLE = "30:", "20:"
NETEM_LIMIT_PACKETS = 100_000  # drops belong to the marker, at the buffer
TC_TIMEOUT_S = 10
PAUSED_RATE_BPS = 8000  # pyroute2 cannot encode less than 64 bit/s; a few kbit/s holds the queue


class PortTc:
    """One netlink socket for a run's tc work."""

    def __init__(self):
        self.ipr = IPRoute()
        self.stats = QdiscReader()
        self._ifindex: dict[str, int] = {}

    def close(self):
        self.ipr.close()
        self.stats.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ifindex(self, intf: str) -> int:
        if intf not in self._ifindex:
            found = self.ipr.link_lookup(ifname=intf)
            if not found:
                raise RunError(f"interface {intf} not found")
            self._ifindex[intf] = found[0]
        return self._ifindex[intf]

    def apply(self, intf: str, rate_bps: float, burst_bytes: int, limit_bytes: int, prog_fd: int | None) -> int:
        """mq root, TBF on the data queue (the control queue keeps its default FIFO), and
        (when ``prog_fd``) the marker on egress. Returns the ifindex."""
        idx = self.ifindex(intf)
        try:
            self.ipr.tc("replace", "mq", idx, MQ_HANDLE, parent=TC_H_ROOT)
            self.ipr.tc("replace", "tbf", idx, TBF_HANDLE, parent=TBF_PARENT, rate=f"{int(rate_bps)}bit",
                        burst=burst_bytes, limit=limit_bytes)
        except NetlinkError as exc:
            raise RunError(f"tc on {intf} failed: {exc}") from None
        if prog_fd is not None:
            self.attach_marker(intf, prog_fd)
        return idx

    def attach_marker(self, intf: str, prog_fd: int):
        """clsact on the interface and the marker (by program fd) on its egress hook."""
        idx = self.ifindex(intf)
        try:
            self.ipr.tc("add", "clsact", idx)
            self.ipr.tc("add-filter", "bpf", idx, ":1", fd=prog_fd, name="testbed-marker",
                        parent=TC_H_CLSACT_EGRESS, classid=1, direct_action=True)
        except NetlinkError as exc:
            raise RunError(f"attaching the marker to {intf} failed: {exc}") from None

    def add_delay(self, intf: str, delay_ns: float):
        """Link propagation delay with netem on both classes: under the data class's TBF
        (packets wait out the delay, then the port rate applies) and as the control queue's
        qdisc. Through tc(8): pyroute2's netem options are not stable across versions."""
        us = max(1, round(delay_ns / 1000))
        for parent, handle in (("10:1", NETEM_HANDLE), ("1:2", CONTROL_NETEM_HANDLE)):
            done = subprocess.run(["tc", "qdisc", "replace", "dev", intf, "parent", parent, "handle", handle, "netem",
                                   "delay", f"{us}us", "limit", str(NETEM_LIMIT_PACKETS)], capture_output=True,
                                  text=True, timeout=TC_TIMEOUT_S)
            if done.returncode:
                raise RunError(f"netem on {intf} failed: {done.stderr.strip()}")

    def set_rate(self, intf: str, rate_bps: float, burst_bytes: int, limit_bytes: int):
        """Change the data class's TBF rate (PFC pause and resume)."""
        try:
            self.ipr.tc("change", "tbf", self.ifindex(intf), TBF_HANDLE, parent=TBF_PARENT,
                        rate=f"{int(rate_bps)}bit", burst=burst_bytes, limit=limit_bytes)
        except NetlinkError as exc:
            raise RunError(f"changing the rate on {intf} failed: {exc}") from None

    def qdisc_stats(self, intf: str) -> dict:
        """The data class TBF's own counters: backlog (bytes), bytes/packets sent, drops,
        overlimits."""
        try:
            stats = self.stats.read(self.ifindex(intf))
        except OSError as exc:
            raise RunError(f"no tbf qdisc on {intf}: {exc.strerror}") from None
        if stats.get("kind") != "tbf":
            raise RunError(f"no tbf qdisc on {intf} (found {stats.get('kind')})")
        return stats
