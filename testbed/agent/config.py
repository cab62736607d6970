"""An agent's configuration, read from the run's ``plan.json`` (``model.plan_file``): its NICs
and peers from the plan's hosts, its ops and transport settings from the plan's training."""

from __future__ import annotations

from testbed.model.plan_file import PlanFile


def from_plan(plan: PlanFile, gpu: str, records: str) -> dict:
    """What ``Agent`` runs with, for GPU ``gpu`` of ``plan``."""
    me = plan.host(gpu)
    t = plan.training.transport
    peers = {}
    for o in plan.hosts:
        if o.name == gpu:
            continue
        same_server = o.server == me.server and o.nvlink_ip
        peers[o.name] = {"index": o.index, "mac": o.mac, "ip": o.addr,
                         "nvlink_mac": o.nvlink_mac if same_server else None,
                         "nvlink_ip": o.nvlink_ip.split("/")[0] if same_server else None}
    nics = {"fabric": {"intf": f"{gpu}-eth0", "mac": me.mac, "ip": me.addr, "line_bps": t.fabric_line_bps}}
    if me.nvlink_ip:
        nics["nvlink"] = {"intf": f"{gpu}-eth1", "mac": me.nvlink_mac, "ip": me.nvlink_ip.split("/")[0],
                          "line_bps": t.nvlink_line_bps}
    return {"gpu": gpu, "index": me.index, "server": me.server, "nics": nics, "peers": peers,
            "dilation": plan.dilation.factor, "transport": t, "ops": plan.training.ops[gpu], "records": records}
