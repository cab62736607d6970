"""Apply: adaptive routing (``fabric.routing: adaptive``). Fills the marker's decision table
(``testbed_steer``) from the plan and attaches the object's ``steer_nic`` program to every
GPU NIC's egress, so each data packet is tagged with the least occupied shortest-path port
of the switch it enters (``bpf/marker.c``, "Adaptive routing"); the controller's flows for
the tags pop them and output there (``testbed.controller.routing``).

Entered after ``EgressQueues`` (it needs the marker's pinned maps and the switch ports'
ifindexes). The filters on the GPU NICs go away with their interfaces at the fabric's
teardown, the table with the marker's pins; on exit the context keeps the decision
counters (``totals``) for the manifest.
"""

from __future__ import annotations

import logging
import subprocess

from testbed.apply.datapath import bpfmap
from testbed.errors import RunError
from testbed.wire import bpfmaps

LOG = logging.getLogger(__name__)
CMD_TIMEOUT_S = 10


class AdaptiveRouting:
    def __init__(self, plan, egress, fabric):
        self.plan, self.egress, self.fabric = plan, egress, fabric
        self.table: bpfmap.Map | None = None
        self.keys: list[bytes] = []
        self.totals: dict | None = None

    def __enter__(self):
        pins = self.egress.marker.dir
        self.table = bpfmap.Map(str(pins / "testbed_steer"), bpfmaps.STEER_SIZE)
        try:
            for entry in self.plan.adaptive_choices():
                hop = self.egress.tc.ifindex(entry.hop) if entry.hop else 0
                key = bpfmaps.steer_key(hop, entry.src, entry.dst_net)
                self.table.update(key, bpfmaps.steer_choice([(self.egress.tc.ifindex(intf), port)
                                                             for intf, port in entry.choices]))
                self.keys.append(key)
            for h in self.plan.hosts:
                self._attach(h.name, f"{h.name}-eth0", pins / "steer_nic")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        LOG.info("adaptive routing: %d decision entries; steer program on %d GPU NICs", len(self.keys),
                 len(self.plan.hosts))
        return self

    def _attach(self, host: str, intf: str, prog_pin):
        """clsact and the pinned program on the NIC's egress, inside the GPU's namespace."""
        pid = self.fabric.host(host).pid
        script = (f"qdisc add dev {intf} clsact\n"
                  f"filter add dev {intf} egress bpf direct-action object-pinned {prog_pin}\n")
        done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "tc", "-batch", "-"], input=script,
                              capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
        if done.returncode:
            raise RunError(f"attaching adaptive routing to {intf} of {host} failed: {done.stderr.strip()}")

    def counters(self) -> dict:
        """Packets tagged by a decision, and of those the ones moved off the flow hash's port."""
        out = {"decisions": 0, "moved": 0}
        for key in self.keys:
            raw = self.table.lookup(key)
            if raw is not None:
                c = bpfmaps.steer_counters(raw)
                out["decisions"] += c["decisions"]
                out["moved"] += c["moved"]
        return out

    def __exit__(self, *exc):
        if self.table is not None:
            try:
                self.totals = self.counters()
            finally:
                self.table.close()
                self.table = None
        return False
