"""A whole ``plan.json`` from the few fields a hand-made run folder cares about: every other
field of a switch, GPU, link, queue and the transport gets a plain default, so the file reads
back as a typed ``PlanFile`` the way a run's does, and a test states only what its worked
numbers depend on."""

from testbed.model.plan_file import PlanFile

TRANSPORT = {"mtu_bytes": 4096, "dcqcn": False, "dcqcn_params": {}, "rto_ns": 128_000,
             "fabric_line_bps": 400e9, "nvlink_line_bps": 0.0}
QUEUE = {"switch": "leaf1", "port": 1, "intf": "leaf1-eth1", "peer": "h1", "rate_bps": 400e9,
         "emulated_rate_bps": 400e6, "buffer_bytes": 1000, "ecn": True, "kmin_bytes": 100, "kmax_bytes": 400,
         "pmax": 0.2, "pfc": False, "xoff_bytes": 0, "xon_bytes": 0, "headroom_bytes": 0,
         "headroom_formula_bytes": 0, "burst_bytes": 8192, "fifo_limit_bytes": 2000, "delay_ns": 0,
         "emulated_delay_ns": 0.0, "feeders": [], "trim": False}


def switch(name: str, role: str = "leaf", index: int = 1) -> dict:
    return {"name": name, "role": role, "dpid": index, "index": index}


def host(name: str, index: int = 1, leaf: str = "leaf1") -> dict:
    return {"name": name, "index": index, "server": index, "local_rank": 0, "leaf": leaf, "leaf_port": index,
            "ip": f"10.0.1.{index}/24", "mac": f"02:00:00:00:01:{index:02x}", "nvlink_ip": None, "nvlink_mac": None}


def link(kind: str, a: str, b: str, a_port: int = 1, b_port: int = 1, rate_bps: float = 400e9,
         delay_ns: int = 0) -> dict:
    return {"kind": kind, "a": a, "a_port": a_port, "b": b, "b_port": b_port, "rate_bps": rate_bps,
            "delay_ns": delay_ns}


def queue(**fields) -> dict:
    return {**QUEUE, **fields}


def training(ops: dict, collectives: list, ideal: dict, iterations: int = 1, jobs: dict | None = None,
             **transport) -> dict:
    return {"iterations": iterations, "ideal": ideal, "transport": {**TRANSPORT, **transport}, "ranks": {},
            "collectives": collectives, "ops": ops, "jobs": jobs or {}}


def route(switch: str, prefix: str, ports) -> dict:
    return {"switch": switch, "prefix": prefix, "ports": list(ports)}


def plan_json(*, switches=(), hosts=(), links=(), routes=(), queues=(), training=None, dilation: float = 1,
              routing: str = "ecmp") -> dict:
    """``plan.json`` as a run writes it; checked by reading it back typed."""
    plan = {"scenario": "unit", "routing": routing, "dilation": dilation, "switches": list(switches),
            "hosts": list(hosts), "servers": [], "links": list(links), "routes": list(routes), "queues": list(queues),
            "training": training, "telemetry": {"interval_real_ns": 10_000, "interval_emulated_ns": 10_000 * dilation},
            "link_delay": False}
    PlanFile.from_dict(plan)
    return plan
