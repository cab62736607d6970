"""What the labs' checks measure, from a run folder (``observe.RunView``): bytes per switch
port over the run, planned sends, which hops cross the spines. Formatting helpers keep
the checks' sentences in fabric units."""

from __future__ import annotations

from testbed import units
from testbed.model.training import Transport

# RoCEv2 headers around each payload: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 (+ FCS 4
# on a real wire; not counted by OVS)
ROCE_HEADER_BYTES = 58


size, duration, rate = units.format_size, units.format_duration, units.format_rate


def port_bytes(view, column: str = "tx_bytes") -> dict:
    """Bytes each switch port sent (``tx_bytes``) or received over the run: the last poll's
    cumulative counter minus the first's."""
    p = view.results.ports.sort_values("t_ns")
    g = p.groupby("intf")[column]
    return (g.last() - g.first()).to_dict()


def hosts(view) -> dict:
    return {h["name"]: h for h in view.plan["hosts"]}


def host_ports(view) -> dict:
    """GPU name -> the leaf port it hangs off (``leaf1-eth1``)."""
    return {name: f"{h['leaf']}-eth{h['leaf_port']}" for name, h in hosts(view).items()}


def sends(view, link: str = "fabric") -> list:
    """Every planned send of every GPU on ``link`` (``fabric`` or ``nvlink``): dicts with
    gpu, peer, bytes, phase, iteration, step."""
    return [dict(op, gpu=gpu) for gpu, ops in view.plan["training"]["ops"].items() for op in ops
            if op["kind"] == "send" and op["link"] == link]


def crosses_spine(view, src: str, dst: str) -> bool:
    h = hosts(view)
    return h[src]["leaf"] != h[dst]["leaf"]


def wire_bytes(payload: int, mtu: int) -> int:
    """The bytes ``payload`` takes on a switch port: payload plus one set of headers per packet."""
    return payload + -(-payload // mtu) * ROCE_HEADER_BYTES


def uplinks(view) -> list:
    """Leaf ports toward a spine (the plan's queues whose peer is a spine)."""
    return [q["intf"] for q in view.plan["queues"] if q["switch"].startswith("leaf") and q["peer"].startswith("spine")]


def rdma_mtu_bytes(view) -> int:
    """The RoCE payload per packet the run's agents used (its plan's transport)."""
    return Transport.from_dict(view.plan["training"]["transport"]).mtu_bytes


def spine_ports(view) -> list:
    return [q["intf"] for q in view.plan["queues"] if q["switch"].startswith("spine")]


def spine_bytes(view) -> tuple:
    """(measured, planned) bytes the spines sent: measured from their port counters, planned
    from the sends whose GPUs sit on different leaves (payload plus headers)."""
    sent = port_bytes(view)
    measured = sum(sent.get(i, 0) for i in spine_ports(view))
    mtu = rdma_mtu_bytes(view)
    planned = sum(wire_bytes(s["bytes"], mtu) for s in sends(view) if crosses_spine(view, s["gpu"], s["peer"]))
    return measured, planned


def flows_per_uplink(view, ports=None) -> dict:
    """Leaf uplink (or each of ``ports``) -> how many ring flows ECMP hashed onto it: its
    bytes over one flow's bytes (every flow of a ring carries the same bytes)."""
    sent = port_bytes(view)
    mtu = rdma_mtu_bytes(view)
    per_flow = {}
    for s in sends(view):
        if crosses_spine(view, s["gpu"], s["peer"]):
            key = (s["gpu"], s["peer"])
            per_flow[key] = per_flow.get(key, 0) + wire_bytes(s["bytes"], mtu)
    if not per_flow:
        return {}
    flow = max(per_flow.values())
    return {intf: round(sent.get(intf, 0) / flow) for intf in (uplinks(view) if ports is None else ports)}


def fabric_bytes(view) -> tuple:
    """(measured, planned) bytes the GPUs put on the fabric: what the leaves received on
    their GPU ports (data and ACKs), and the planned fabric sends with their headers."""
    received = port_bytes(view, "rx_bytes")
    measured = sum(received.get(p, 0) for p in host_ports(view).values())
    mtu = rdma_mtu_bytes(view)
    return measured, sum(wire_bytes(s["bytes"], mtu) for s in sends(view))
