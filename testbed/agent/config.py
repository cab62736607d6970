"""An agent's configuration, read from the run's ``plan.json``: its NICs and peers from the
plan's hosts, its ops and transport settings from the plan's training section."""

from __future__ import annotations

from testbed.model.training import Transport


def from_plan(plan: dict, gpu: str, records: str) -> dict:
    """What ``Agent`` runs with, for GPU ``gpu`` of ``plan`` (``Plan.to_dict()``)."""
    hosts = {h["name"]: h for h in plan["hosts"]}
    me = hosts[gpu]
    training = plan["training"]
    t = Transport.from_dict(training["transport"])
    peers = {}
    for name, o in hosts.items():
        if name == gpu:
            continue
        same_server = o["server"] == me["server"] and o["nvlink_ip"]
        peers[name] = {"index": o["index"], "mac": o["mac"], "ip": o["ip"].split("/")[0],
                       "nvlink_mac": o["nvlink_mac"] if same_server else None,
                       "nvlink_ip": o["nvlink_ip"].split("/")[0] if same_server else None}
    nics = {"fabric": {"intf": f"{gpu}-eth0", "mac": me["mac"], "ip": me["ip"].split("/")[0],
                       "line_bps": t.fabric_line_bps}}
    if me["nvlink_ip"]:
        nics["nvlink"] = {"intf": f"{gpu}-eth1", "mac": me["nvlink_mac"], "ip": me["nvlink_ip"].split("/")[0],
                          "line_bps": t.nvlink_line_bps}
    return {"gpu": gpu, "index": me["index"], "server": me["server"], "nics": nics, "peers": peers,
            "dilation": plan["dilation"], "transport": t, "ops": training["ops"][gpu], "records": records}
