"""The controller's decisions, without a switch."""

import json

from testbed.model import plan
from testbed.model.plan_file import PlanFile
from testbed.controller import routing
from testbed.config import scenario


def program(name, ref="leaf-spine", ports=()):
    p = plan.build(scenario.load(ref), "user")
    return routing.switch_program(p.routes_for(name), ports)


def test_leaf_program():
    msgs = program("leaf1")
    assert msgs[0] == routing.ClearSwitch() and msgs[-1] == routing.Barrier()
    assert [m for m in msgs if isinstance(m, routing.GroupAdd)] == [routing.GroupAdd(1, (5, 6, 7, 8))]
    flows = [m for m in msgs if isinstance(m, routing.FlowAdd)]
    assert flows[0] == routing.FlowAdd(1000, (("eth_type", 0x8808),), ())  # pause frames never forwarded
    assert routing.FlowAdd(132, (("eth_type", 0x0800), ("ipv4_dst", ("10.0.1.3", "255.255.255.255"))),
                           (("dec_nw_ttl",), ("output", 3)), table=1) in flows
    assert routing.FlowAdd(124, (("eth_type", 0x0800), ("ipv4_dst", ("10.0.2.0", "255.255.255.0"))),
                           (("dec_nw_ttl",), ("group", 1)), table=1) in flows
    # longest prefixes first, one flow per route plus the pause drop
    assert len(flows) == 1 + 4 + 1


def test_ecn_counting_flows_per_port_and_codepoint_ahead_of_routing():
    flows = [m for m in program("leaf1", ports=(2, 1)) if isinstance(m, routing.FlowAdd)]
    counting = [f for f in flows if f.table == 0 and f.goto == 1]
    assert counting[:4] == [routing.FlowAdd(10, (("in_port", 1), ("eth_type", 0x0800), ("ip_ecn", ecn)), (),
                                            table=0, goto=1) for ecn in range(4)]
    assert [dict(f.match)["in_port"] for f in counting] == [1] * 4 + [2] * 4
    # the pause drop outranks counting in table 0; routes live in table 1 only
    assert flows[0].priority > counting[0].priority and all(f.table == 1 for f in flows if f.actions)


def test_spine_groups_deduplicated_per_port_set():
    msgs = program("spine1")
    assert [m for m in msgs if isinstance(m, routing.GroupAdd)] == [routing.GroupAdd(1, (1, 2)),
                                                                    routing.GroupAdd(2, (3, 4))]


def test_fabric_ready_only_after_every_barrier():
    p = plan.build(scenario.load("default"), "user")
    ctl = routing.FabricController(p)
    dpids = sorted(ctl.switches)
    assert ctl.switch_connected(999, now=0.0) == []  # not in the plan: left alone
    for d in dpids:
        assert ctl.switch_connected(d, now=1.0)
    for d in dpids[:-1]:
        (ready,) = ctl.barrier_reply(d, now=1.5)
        assert ready.seconds == 0.5 and ready.flows > 0
    assert not ctl.all_ready
    ctl.barrier_reply(dpids[-1], now=2.0)
    assert ctl.all_ready
    ctl.switch_disconnected(dpids[0], now=3.0)
    assert not ctl.all_ready
    assert ctl.barrier_reply(dpids[0], now=3.1) == []  # a stray barrier does not make it ready


def test_adaptive_routing_follows_the_tag_above_every_route():
    """fabric.routing: adaptive adds, per select-group port, a flow for the VLAN id the hop
    before chose (bpf/marker.c): pop the tag and output there, above every route; ECMP has none."""
    p = plan.build(scenario.load("collisions", ["fabric.routing=adaptive"]), "user")
    msgs = routing.switch_program(p.routes_for("spine1"), adaptive=True)
    steered = [m for m in msgs if isinstance(m, routing.FlowAdd) and m.priority == routing.PRIORITY_STEERED]
    assert steered == [routing.FlowAdd(200, (("eth_type", 0x0800), ("vlan_vid", 0x1000 | port)),
                                       (("pop_vlan",), ("dec_nw_ttl",), ("output", port)), table=1)
                       for port in (1, 2, 3, 4)]
    routes = [m for m in msgs if isinstance(m, routing.FlowAdd) and m.table == 1 and m not in steered]
    assert routes and max(m.priority for m in routes) < routing.PRIORITY_STEERED
    assert isinstance(msgs[-1], routing.Barrier)
    assert not [m for m in program("spine1") if getattr(m, "priority", 0) == routing.PRIORITY_STEERED]
    # the controller takes the mode from the plan
    ctl = routing.FabricController(PlanFile.from_dict(json.loads(json.dumps(p.to_dict()))))
    leaf1 = next(d for d, s in ctl.switches.items() if s.name == "leaf1")
    flows = [m for m in ctl.switch_connected(leaf1, now=0.0) if isinstance(m, routing.FlowAdd)]
    assert [dict(f.match)["vlan_vid"] & 0xFFF for f in flows if f.priority == 200] == [5, 6, 7, 8]
    assert routing.FabricController(plan.build(scenario.load("collisions"), "user")).adaptive is False
