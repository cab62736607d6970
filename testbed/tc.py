"""Traffic control on switch ports through netlink (the only pyroute2 import).

Per port: a TBF at the emulated port rate with a byte FIFO (root qdisc), and the
marker program on the clsact egress hook, attached by the file descriptor of the
run's pinned program (loaded once, shared by every port). Qdiscs and filters go
away with their interface, so the fabric's teardown removes them; ``remove`` exists
for ports that outlive a run.
"""

from __future__ import annotations

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from .errors import RunError

TC_H_CLSACT_EGRESS = 0xFFFFFFF3


class PortTc:
    """One netlink socket for a run's tc work."""

    def __init__(self):
        self.ipr = IPRoute()

    def close(self):
        self.ipr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ifindex(self, intf: str) -> int:
        found = self.ipr.link_lookup(ifname=intf)
        if not found:
            raise RunError(f"interface {intf} not found")
        return found[0]

    def apply(self, intf: str, rate_bps: float, burst_bytes: int, limit_bytes: int, prog_fd: int | None) -> int:
        """TBF root qdisc and (when ``prog_fd``) the marker on egress. Returns the ifindex."""
        idx = self.ifindex(intf)
        try:
            self.ipr.tc("replace", "tbf", idx, 0x10000, rate=f"{int(rate_bps)}bit", burst=burst_bytes,
                        limit=limit_bytes)
            if prog_fd is not None:
                self.ipr.tc("add", "clsact", idx)
                self.ipr.tc("add-filter", "bpf", idx, ":1", fd=prog_fd, name="testbed-marker",
                            parent=TC_H_CLSACT_EGRESS, classid=1, direct_action=True)
        except NetlinkError as exc:
            raise RunError(f"tc on {intf} failed: {exc}") from None
        return idx

    def set_rate(self, intf: str, rate_bps: float, burst_bytes: int, limit_bytes: int):
        """Change a port's TBF rate in place (no packet lost or reordered)."""
        self.ipr.tc("change", "tbf", self.ifindex(intf), 0x10000, rate=f"{int(rate_bps)}bit", burst=burst_bytes,
                    limit=limit_bytes)

    def remove(self, intf: str):
        idx = self.ifindex(intf)
        for kind in ("clsact", "tbf"):
            try:
                self.ipr.tc("del", kind, idx, 0x10000 if kind == "tbf" else None)
            except NetlinkError:
                pass

    def qdisc_stats(self, intf: str) -> dict:
        """The TBF's own counters: backlog (bytes), packets sent, drops, overlimits."""
        idx = self.ifindex(intf)
        for msg in self.ipr.get_qdiscs(idx):
            if msg.get_attr("TCA_KIND") == "tbf":
                stats = msg.get_attr("TCA_STATS2")
                basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
                queue = stats.get_attr("TCA_STATS_QUEUE") if stats else None
                return {
                    "sent_bytes": basic["bytes"] if basic else None,
                    "sent_packets": basic["packets"] if basic else None,
                    "backlog_bytes": queue["backlog"] if queue else None,
                    "drops": queue["drops"] if queue else None,
                    "overlimits": queue["overlimits"] if queue else None,
                }
        raise RunError(f"no tbf qdisc on {intf}")
