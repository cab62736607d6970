"""An agent's configuration, read from the run's ``plan.json`` (``model.plan_file``): its NICs
and peers from the plan's hosts, its ops and transport settings from the plan's training.
Typed (``AgentConfig``) so the agent reads fields, not string keys; the ops stay the plan's
op records (``model.schedule``), which the loop reads per op."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.model.plan_file import PlanFile
from testbed.model.training import Transport
from testbed.units import Dilation


@dataclass(frozen=True)
class NicSpec:
    """One of the GPU's NICs: ``fabric`` (to its leaf) or ``nvlink`` (its server's segment)."""
    intf: str
    mac: str
    ip: str
    line_bps: float


@dataclass(frozen=True)
class Peer:
    """Another GPU of the job; its NVLink address only when it shares this GPU's server."""
    index: int
    mac: str
    ip: str
    nvlink_mac: str | None = None
    nvlink_ip: str | None = None

    def address(self, link: str) -> tuple[str, str]:
        """(MAC, IP) of the peer on ``link``."""
        return (self.mac, self.ip) if link == "fabric" else (self.nvlink_mac, self.nvlink_ip)


@dataclass(frozen=True)
class AgentConfig:
    gpu: str
    index: int
    server: int
    nics: dict  # link -> NicSpec
    peers: dict  # GPU name -> Peer
    dilation: Dilation
    transport: Transport
    ops: list  # the GPU's op records, in plan order
    records: str  # the JSONL file its records go to


def from_plan(plan: PlanFile, gpu: str, records: str) -> AgentConfig:
    """What ``Agent`` runs with, for GPU ``gpu`` of ``plan``."""
    me = plan.host(gpu)
    t = plan.training.transport
    peers = {}
    for o in plan.hosts:
        if o.name == gpu:
            continue
        same_server = o.server == me.server and o.nvlink_ip
        peers[o.name] = Peer(o.index, o.mac, o.addr, o.nvlink_mac if same_server else None,
                             o.nvlink_ip.split("/")[0] if same_server else None)
    nics = {"fabric": NicSpec(f"{gpu}-eth0", me.mac, me.addr, t.fabric_line_bps)}
    if me.nvlink_ip:
        nics["nvlink"] = NicSpec(f"{gpu}-eth1", me.nvlink_mac, me.nvlink_ip.split("/")[0], t.nvlink_line_bps)
    return AgentConfig(gpu=gpu, index=me.index, server=me.server, nics=nics, peers=peers,
                       dilation=plan.dilation, transport=t, ops=plan.training.ops[gpu],
                       records=records)
