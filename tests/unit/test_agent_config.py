"""An agent's configuration from a plan: its NICs and peers from the plan's hosts, NVLink
addresses only for the GPUs of its own server, the plan's transport and dilation."""

from testbed.agent.config import NicSpec, Peer, from_plan
from testbed.model.plan_file import PlanFile
from testbed.units import Dilation

from helpers import plans


def gpu(name, index, server, nvlink=True):
    h = plans.host(name, index)
    h["server"] = server
    if nvlink:
        h["nvlink_ip"], h["nvlink_mac"] = f"10.255.{server}.{index}/24", f"02:ff:00:00:00:{index:02x}"
    return h


def test_peers_on_the_same_server_get_nvlink_addresses_and_the_others_do_not():
    hosts = [gpu("h1", 1, 1), gpu("h2", 2, 1), gpu("h3", 3, 2)]
    ops = {h["name"]: [] for h in hosts}
    plan = PlanFile.from_dict(plans.plan_json(hosts=hosts, dilation=5000,
                                              training=plans.training(ops, [], {}, nvlink_line_bps=3.6e12)))
    cfg = from_plan(plan, "h1", "/tmp/h1.jsonl")
    assert (cfg.gpu, cfg.index, cfg.server, cfg.records) == ("h1", 1, 1, "/tmp/h1.jsonl")
    assert cfg.nics == {"fabric": NicSpec("h1-eth0", "02:00:00:00:01:01", "10.0.1.1", 400e9),
                        "nvlink": NicSpec("h1-eth1", "02:ff:00:00:00:01", "10.255.1.1", 3.6e12)}
    assert cfg.peers == {"h2": Peer(2, "02:00:00:00:01:02", "10.0.1.2", "02:ff:00:00:00:02", "10.255.1.2"),
                         "h3": Peer(3, "02:00:00:00:01:03", "10.0.1.3")}
    assert cfg.peers["h2"].address("nvlink") == ("02:ff:00:00:00:02", "10.255.1.2")
    assert cfg.peers["h3"].address("fabric") == ("02:00:00:00:01:03", "10.0.1.3")
    assert cfg.dilation == Dilation(5000) and cfg.transport == plan.training.transport and cfg.ops == []


def test_a_gpu_without_nvlink_has_one_nic():
    hosts = [gpu("h1", 1, 1, nvlink=False), gpu("h2", 2, 2, nvlink=False)]
    plan = PlanFile.from_dict(plans.plan_json(hosts=hosts, training=plans.training({"h1": [], "h2": []}, [], {})))
    cfg = from_plan(plan, "h2", "h2.jsonl")
    assert list(cfg.nics) == ["fabric"] and cfg.peers == {"h1": Peer(1, "02:00:00:00:01:01", "10.0.1.1")}
