"""Plan outputs for each topology kind: golden JSON plus the properties that matter."""

import dataclasses
import json
import os

import pytest

from helpers import GOLDEN
from testbed.model import plan
from testbed.model.plan_file import PlanFile
from testbed.config import scenario
from testbed.config.workload import BALANCE_DEFAULTS, Workload
from testbed.model.training import Transport
from testbed.units import Dilation
from testbed.views.digest import digest

CASES = ["default", "leaf-spine", "incast", "rail-32", "topologies/tor-2x4.yaml", "topologies/leaf-spine-oversub.yaml"]


def build(ref, *overrides):
    return plan.build(scenario.load(ref, list(overrides)), "user")


@pytest.mark.parametrize("ref", CASES)
def test_plan_golden(ref):
    """Counts, per-port queue settings, routes and per-step bytes: any change to the plan
    shows up as a diff of this short text. TESTBED_REGEN_GOLDEN=1 rewrites the file and
    fails, so a regeneration is always reviewed (git diff) and rerun, never passed."""
    got = digest(build(ref))
    path = GOLDEN / "plans" / (ref.replace("topologies/", "topology-").replace(".yaml", "") + ".txt")
    if os.environ.get("TESTBED_REGEN_GOLDEN"):
        path.write_text(got)
        pytest.fail(f"regenerated {path.name}: review it with git diff, then rerun without TESTBED_REGEN_GOLDEN")
    assert got == path.read_text()


def test_plan_json_holds_the_whole_plan():
    """plan.json is the run's one plan: queues with their PFC feeders, the training
    schedule with its ideal, and the telemetry settings are in it, each checked against
    what the default scenario (2 servers x 4 GPUs on 4 rail leaves, 2 spines, 400G, a
    2 MB ring AllReduce of 8 ranks, 3 iterations, D = 50000) says it must be."""
    d = json.loads(json.dumps(build("default").to_dict()))
    queue = {q["intf"]: q for q in d["queues"]}
    assert len(queue) == 8 + 8 + 8  # leaf ports to GPUs, leaf uplinks, spine downlinks
    # leaf1's port to h1 is fed by the other GPU on rail 1 (h5) and by both spines
    assert queue["leaf1-eth1"]["peer"] == "h1"
    assert {queue[f]["peer"] for f in queue["leaf1-eth1"]["feeders"]} == {"h5", "spine1", "spine2"}
    # a leaf's uplink is fed by its GPUs only: traffic does not turn around at a leaf
    uplink = next(q for q in d["queues"] if q["switch"] == "leaf1" and q["peer"].startswith("spine"))
    assert {queue[f]["peer"] for f in uplink["feeders"]} == {"h1", "h5"}
    training = d["training"]
    assert training["iterations"] == 3
    # per GPU and iteration: forward and backward compute, then a ring of 8: 2 x 7 sends and 2 x 7 receives
    assert {gpu: len(ops) for gpu, ops in training["ops"].items()} == {f"h{i}": 3 * (2 + 4 * 7) for i in range(1, 9)}
    # the textbook ring: 2 (N - 1) / N x 2 MB at 400G is 70 us; the ideal adds RoCE headers (~1.4 % at MTU 4096)
    textbook_ns = 2 * 7 / 8 * 2_000_000 * 8 / 400e9 * 1e9
    assert 1.0 < training["ideal"]["data_parallel_ns"] / textbook_ns < 1.02
    assert training["ideal"]["iteration_ns"] == training["ideal"]["compute_ns"] + training["ideal"]["data_parallel_ns"]
    assert d["telemetry"] == {"interval_real_ns": 10_000, "interval_emulated_ns": 10_000 * 50_000}


@pytest.mark.parametrize("ref", CASES)
def test_every_process_reads_the_plan_it_was_planned_with(ref):
    """What the agents, the PFC process, the controller and ``testbed queues`` read: plan.json
    through JSON, typed again (``PlanFile``), equal to the plan's own objects, field by field
    (tuples again where the plan has tuples)."""
    p = build(ref)
    again = PlanFile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert (again.scenario, again.routing, again.dilation, again.link_delay) == (
        p.scenario.name, p.routing, p.dilation, p.link_delay)
    for part in ("switches", "hosts", "servers", "links", "routes", "queues", "telemetry"):
        assert getattr(again, part) == getattr(p, part), part
    assert all(isinstance(q.feeders, tuple) for q in again.queues)
    assert all(isinstance(r.ports, tuple) for r in again.routes)
    if p.training is None:
        assert again.training is None
    else:
        t = again.training
        assert t.transport == p.training.transport and t.iterations == p.training.iterations
        assert t.ideal == json.loads(json.dumps(p.training.ideal)) and t.ranks == p.training.ranks
        assert t.ops == json.loads(json.dumps(p.training.to_dict()["ops"]))
    assert again.host("h1") == p.host("h1")


def test_balance_defaults_live_in_one_place():
    """How a connection spreads when the traffic file does not say: config.workload's
    BALANCE_DEFAULTS, which the Workload fields, model.training.Transport and a plan of a
    traffic file that is silent about them all agree with."""
    for cls in (Workload, Transport):
        assert {f.name: f.default for f in dataclasses.fields(cls) if f.name in BALANCE_DEFAULTS} == BALANCE_DEFAULTS
    t = build("default").training.transport  # its traffic (dp-ring) says nothing of load balancing
    assert {k: getattr(t, k) for k in BALANCE_DEFAULTS} == BALANCE_DEFAULTS
    assert Transport.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_rail_optimised_puts_gpu_k_of_every_server_on_rail_leaf_k():
    p = build("default")
    assert len(p.hosts) == 8 and len(p.servers) == 2
    for h in p.hosts:
        assert h.leaf == f"leaf{h.local_rank + 1}"
    assert [h.name for h in p.hosts if h.leaf == "leaf1"] == ["h1", "h5"]
    # same rail, different servers: one switch; different rails: via a spine, 2 ECMP paths
    assert [len(path) for path in p.ecmp_paths("h1", "h5")] == [3]
    assert len(p.ecmp_paths("h1", "h6")) == 2
    assert {path[2][0] for path in p.ecmp_paths("h1", "h6")} == {"spine1", "spine2"}


def test_top_of_rack_puts_a_whole_server_on_one_leaf():
    p = build("topologies/tor-2x4.yaml")
    for server in p.servers:
        assert len({p.host(g).leaf for g in server.gpus}) == 1
    assert p.host("h1").leaf != p.host("h5").leaf
    # 4 uplinks, 2 per spine, each spine has 2 links to the far leaf: 4 x 2 = 8 paths
    assert len(p.ecmp_paths("h1", "h5")) == 8


def test_nvlink_is_separate_from_the_fabric():
    p = build("default")
    nv = [link for link in p.links if link.kind == "nvlink"]
    assert len(nv) == 8 and {link.b for link in nv} == {"nvl1", "nvl2"}
    assert all(link not in p.fabric_links for link in nv)
    assert all(not r.switch.startswith("nvl") for r in p.routes)
    assert p.host("h1").nvlink_ip == "10.128.1.1/24" and p.host("h8").nvlink_ip == "10.128.2.4/24"
    assert build("leaf-spine").host("h1").nvlink_ip is None  # single-GPU servers have no NVLink


def test_oversubscription_and_bisection():
    assert set(build("leaf-spine").oversubscription().values()) == {1.0}
    oversub = build("topologies/leaf-spine-oversub.yaml")
    assert set(oversub.oversubscription().values()) == {4.0}
    assert oversub.bisection_bps() == 2 * 400e9  # only 2 uplinks leave each leaf
    assert build("leaf-spine").bisection_bps() == 4 * 400e9
    # rail: half the servers to the other half; same-rail pairs never touch a spine
    assert build("default").bisection_bps() == 4 * 400e9
    assert build("default", "fabric.spines=1", "fabric.uplinks.count=1").bisection_bps() == 4 * 400e9


def test_routes_and_ecmp_groups():
    p = build("leaf-spine")
    leaf1 = {r.prefix: r.ports for r in p.routes_for("leaf1")}
    assert leaf1["10.0.1.1/32"] == (1,)
    assert leaf1["10.0.2.0/24"] == (5, 6, 7, 8)  # all four uplinks
    spine1 = {r.prefix: r.ports for r in p.routes_for("spine1")}
    assert spine1 == {"10.0.1.0/24": (1, 2), "10.0.2.0/24": (3, 4)}


def test_uplinks_spread_round_robin_over_spines():
    p = build("leaf-spine")
    ups = [(link.a_intf, link.b_intf) for link in p.links if link.kind == "uplink" and link.a == "leaf1"]
    assert ups == [("leaf1-eth5", "spine1-eth1"), ("leaf1-eth6", "spine2-eth1"),
                   ("leaf1-eth7", "spine1-eth2"), ("leaf1-eth8", "spine2-eth2")]


def test_interface_names_fit_ifnamsiz():
    p = build("rail-32")
    for link in p.links:
        assert len(link.a_intf) <= 15 and len(link.b_intf) <= 15


def test_dilation_auto_and_explicit():
    # forwarding: 8 GPUs x 400G x 3 hops = 9.6T over a 400M userspace budget: D >= 24000; the
    # agents' packets: 8 x 400G / (8 x 4154-byte frames) = 96.3M/s over 2000/s: D >= 48146 -> 50000
    p = build("default")
    assert p.dilation.factor == 50000
    assert "D >= 24000" in p.dilation_reason and "D >= 48146" in p.dilation_reason
    # the kernel datapath forwards more, the agents send no faster
    assert plan.build(scenario.load("default"), "kernel").dilation.factor == 50000
    assert build("default", "dilation=40000").dilation == Dilation(40000)
    # a 2048-byte path MTU: twice the packets per byte, 8 x 400G / (8 x 2106) / 2000 = 94967 -> 100000
    assert build("default", "workload.transport.mtu=2048").dilation.factor == 100000
    # 32, 64 and 128 GPUs: packets 385M, 770M, 1.54G per second -> 200000, 500000, 1000000
    big = ("fabric.spines=8", "fabric.uplinks.count=8")
    assert build("rail-32").dilation.factor == 200000
    assert build("rail-32", "fabric.servers=8", *big).dilation.factor == 500000
    assert build("rail-32", "fabric.servers=16", *big).dilation.factor == 1000000


def test_a_slower_machine_multiplies_the_automatic_dilation_and_says_so():
    # the default's 50000 (trusted on the budgets' machine kind) x 22.1 (the speed probe in the
    # lab VM under QEMU without KVM) = 1105000, to two digits; not rounded again to 2000000
    slow = plan.build(scenario.load("default"), "user", slowdown=22.1)
    assert slow.dilation.factor == 1100000
    assert "D >= 48146; rounded to 50000; x22.1 for this machine's measured speed = 1100000" in slow.dilation_reason
    assert "measured speed" not in build("default").dilation_reason
    # a dilation the scenario sets is the user's, whatever the machine
    fixed = plan.build(scenario.load("default", ["dilation=40000"]), "user", slowdown=12.5)
    assert fixed.dilation == Dilation(40000)


def test_single_leaf_without_spines():
    p = build("topologies/leaf-spine.yaml", "fabric.spines=0", "fabric.leaves=1", "fabric.uplinks={count: 0}")
    assert [s.name for s in p.switches] == ["leaf1"]
    assert p.oversubscription() == {"leaf1": None}
    assert len(p.ecmp_paths("h1", "h4")) == 1


def test_show_renders_real_and_emulated_units():
    from testbed.views import show

    text = show.render(build("default"))
    assert "400G /     8Mbit/s" in text
    assert "ECMP paths h1 -> h8: 2" in text
    assert "bisection bandwidth: 1.6Tbit/s real" in text


def test_adaptive_choices_where_a_switch_has_a_choice():
    """Every hop into a switch with several shortest-path ports gets a decision entry: each
    GPU NIC for its leaf's uplinks (4), each leaf uplink for the spine's two parallel links
    down to the other leaf; spine ports toward a leaf do not (the leaf's /32s have one port),
    nor does a leaf uplink for its own /24. ECMP plans have none."""
    from testbed.model.routing import Steer

    p = plan.build(scenario.load("collisions", ["fabric.routing=adaptive"]), "user")
    assert p.routing == "adaptive" and p.to_dict()["routing"] == "adaptive"
    entries = p.adaptive_choices()
    nics = [e for e in entries if e.hop is None]
    ports = [e for e in entries if e.hop is not None]
    assert len(nics) == 8 and len(ports) == 8
    assert Steer(None, "10.0.1.1", "10.0.2.0/24",
                 (("leaf1-eth5", 5), ("leaf1-eth6", 6), ("leaf1-eth7", 7), ("leaf1-eth8", 8))) in nics
    assert Steer("leaf1-eth5", None, "10.0.2.0/24", (("spine1-eth3", 3), ("spine1-eth4", 4))) in ports
    assert all(e.hop.startswith("leaf") for e in ports)
    assert not [e for e in ports if e.hop.startswith("leaf1") and e.dst_net == "10.0.1.0/24"]
    assert plan.build(scenario.load("collisions"), "user").adaptive_choices() == []


def _routes_one_search_per_leaf(switches, links, leaves):
    """The reference: a breadth-first search from every leaf, every port on a shortest path."""
    from collections import deque

    adj = {s.name: [] for s in switches}
    for link in links:
        if link.kind == "uplink":
            adj[link.a].append((link.a_port, link.b))
            adj[link.b].append((link.b_port, link.a))
    out = []
    for li, dest in enumerate(leaves):
        dist, queue = {dest.name: 0}, deque([dest.name])
        while queue:
            u = queue.popleft()
            for _, v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        for s in switches:
            if s.name != dest.name and s.name in dist:
                out.append((s.name, f"10.0.{li + 1}.0/24",
                            tuple(sorted(p for p, v in adj[s.name] if dist.get(v) == dist[s.name] - 1))))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_routes_shared_by_leaves_with_the_same_neighbours_match_a_search_per_leaf(seed):
    """routing.compute searches once per class of leaves with the same neighbours; on random
    fabrics (leaves that share spines and leaves that do not, parallel links, leaf-leaf and
    spine-spine links, unreachable switches) it must give every port a search per leaf gives."""
    import random

    from testbed.model import routing

    rng = random.Random(seed)
    n_leaves, n_spines = rng.randint(1, 9), rng.randint(0, 5)
    leaves = [plan.Switch(f"leaf{i + 1}", "leaf", i + 1, i + 1) for i in range(n_leaves)]
    spines = [plan.Switch(f"spine{i + 1}", "spine", 100 + i, i + 1) for i in range(n_spines)]
    switches = spines + leaves
    next_port = {s.name: 1 for s in switches}
    links = []

    def connect(a, b):
        links.append(plan.Link("uplink", a.name, next_port[a.name], b.name, next_port[b.name], 1, 0))
        next_port[a.name] += 1
        next_port[b.name] += 1

    patterns = [rng.sample(spines, rng.randint(0, n_spines)) for _ in range(rng.randint(1, 3))]
    for leaf in leaves:
        for spine in rng.choice(patterns):
            for _ in range(rng.randint(1, 2)):
                connect(leaf, spine)
    for _ in range(rng.randint(0, 3)):
        a, b = rng.sample(switches, 2) if len(switches) > 1 else (None, None)
        if a is not None:
            connect(a, b)
    got = [(r.switch, r.prefix, r.ports) for r in routing.compute(switches, [], links, leaves)]
    assert got == _routes_one_search_per_leaf(switches, links, leaves)
