"""Link failures, the pure parts: events resolved on the plan, the controller's reroute
(make before break, only the switches that change, back to the plan on link up) and what a
failure cost, from the files a run writes."""

import json

import pytest

from testbed.analysis import failures
from testbed.config import scenario
from testbed.controller import routing
from testbed.errors import ConfigError
from testbed.model import plan as planning
from testbed.units import Dilation


def programmed(sets=()):
    """The collisions fabric (2 leaves x 4 uplinks, 2 spines) with every switch programmed."""
    p = planning.build(scenario.load("collisions", list(sets)))
    fc = routing.FabricController(p)
    for dp in fc.switches:
        fc.switch_connected(dp, 0.0)
        fc.barrier_reply(dp, 0.0)
    by_name = {s.name: dp for dp, s in fc.switches.items()}
    return fc, by_name


def test_a_dead_uplink_is_routed_around_make_before_break():
    fc, dp = programmed()
    before = {k: dict(v) for k, v in fc.routes.items()}
    out = dict(fc.port_status(dp["leaf1"], 5, False, 10.0))  # leaf1-eth5 -> spine1-eth1
    assert {fc.switches[d].name for d in out} == {"leaf1", "spine1"}
    leaf1 = out[dp["leaf1"]]
    group = next(m for m in leaf1 if isinstance(m, routing.GroupAdd))
    assert group.ports == (6, 7, 8) and group.group_id == 2  # a new group: the old one still forwards meanwhile
    flow = next(m for m in leaf1 if isinstance(m, routing.FlowAdd))
    assert flow.actions[-1] == ("group", 2) and dict(flow.match)["ipv4_dst"][0] == "10.0.2.0"
    assert leaf1.index(group) < leaf1.index(flow) and isinstance(leaf1[-1], routing.Barrier)
    # spine1 reaches leaf1 over its other link only
    assert [m.actions[-1] for m in out[dp["spine1"]] if isinstance(m, routing.FlowAdd)] == [("output", 2)]
    # the far end's report of the same link changes nothing more
    assert fc.port_status(dp["spine1"], 1, False, 10.001) == []
    # a GPU's port is not a fabric link
    assert fc.port_status(dp["leaf1"], 1, False, 10.002) == []
    assert fc.barrier_reply(dp["leaf1"], 10.2) == []
    done = fc.barrier_reply(dp["spine1"], 10.25)
    assert done == [routing.RerouteDone(("leaf1", "spine1"), 2, 1, pytest.approx(0.25), ("leaf1-eth5",))]
    # plugged back: every switch's routes are the plan's again (in new groups)
    back = dict(fc.port_status(dp["spine1"], 1, True, 20.0))
    assert {fc.switches[d].name for d in back} == {"leaf1", "spine1"}
    assert fc.routes == before
    assert [m.ports for m in back[dp["leaf1"]] if isinstance(m, routing.GroupAdd)] == [(5, 6, 7, 8)]


def test_a_reconnecting_switch_gets_the_routes_of_now():
    fc, dp = programmed()
    fc.port_status(dp["leaf1"], 5, False, 1.0)
    msgs = fc.switch_connected(dp["leaf1"], 2.0)
    assert [m.ports for m in msgs if isinstance(m, routing.GroupAdd)] == [(6, 7, 8)]


def test_events_name_links_of_the_plan():
    p = planning.build(scenario.load("collisions", ["events=[{at: 1us, action: down, link: spine2-leaf2}, "
                                                    "{at: 2us, action: up, link: leaf1-eth7}]"]))
    assert [(e.action, e.intfs, e.peers) for e in p.events] == [("down", ("leaf2-eth6", "leaf2-eth8"),
                                                                 ("spine2-eth3", "spine2-eth4")),
                                                                ("up", ("leaf1-eth7",), ("spine1-eth2",))]
    rnd = planning.build(scenario.load("collisions", ["events=[{at: 1us, action: down, link: random uplink}]"]))
    assert len(rnd.events[0].intfs) == 1 and rnd.events[0].name.endswith(f"({rnd.events[0].intfs[0]})")
    with pytest.raises(ConfigError, match="adaptive are not built"):
        scenario.load("collisions", ["events=[{at: 1us, action: down, link: leaf1-spine1}]",
                                     "fabric.routing=adaptive"])
    with pytest.raises(ConfigError, match="give the scenario a workload"):
        scenario.load("topologies/rail-2x4.yaml", ["events=[{at: 1us, action: down, link: leaf1-spine1}]"])


def test_a_spine_down_is_every_link_of_it():
    p = planning.build(scenario.load("collisions", ["events=[{at: 1us, action: down, switch: spine2}, "
                                                    "{at: 2us, action: up, switch: spine2}]"]))
    down, up = p.events
    assert down.name == up.name == "spine2 (every link)"
    assert down.intfs == ("leaf1-eth6", "leaf1-eth8", "leaf2-eth6", "leaf2-eth8")
    assert all(peer.startswith("spine2-") for peer in down.peers) and len(set(down.peers)) == 4
    # the controller, told port by port, ends with the leaves forwarding over spine1 alone
    fc, dp = programmed()
    before = {k: dict(v) for k, v in fc.routes.items()}
    changed = set()
    for intf in down.intfs:
        leaf, port = intf.split("-eth")
        changed |= {fc.switches[d].name for d, _ in fc.port_status(dp[leaf], int(port), False, 1.0)}
    # spine2 too, while its links go one by one (the cables are pulled one after another)
    assert changed == {"leaf1", "leaf2", "spine2"}
    spine1_ports = {"leaf1": {5, 7}, "leaf2": {5, 7}}
    for leaf in ("leaf1", "leaf2"):
        remote = [ports for prefix, ports in fc.routes[leaf].items() if ports != before[leaf][prefix]]
        assert remote and all(set(ports) == spine1_ports[leaf] for ports in remote), fc.routes[leaf]
    for intf in down.intfs:
        leaf, port = intf.split("-eth")
        fc.port_status(dp[leaf], int(port), True, 2.0)
    assert fc.routes == before


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_what_a_failure_cost_comes_from_the_runs_files(tmp_path):
    s = 1_000_000_000  # CLOCK_MONOTONIC ns
    write_jsonl(tmp_path / "link-events.jsonl", [
        {"event": "link_down", "link": "leaf1-spine1", "intfs": ["leaf1-eth5"], "peers": ["spine1-eth1"],
         "at_real_ns": 80_000, "due_ns": 14 * s, "t_ns": 14 * s + 2_000, "late_ns": 2_000},
        {"event": "end", "t_ns": 30 * s, "restored": ["leaf1-eth5"]}])
    write_jsonl(tmp_path / "controller-events.jsonl", [
        {"event": "switch_ready", "t_mono": 1.0},
        {"event": "port_status", "t_mono": 14.003, "live": False},
        {"event": "port_status", "t_mono": 14.004, "live": False},
        {"event": "reroute_done", "t_mono": 14.010, "switches": ["leaf1", "spine1"], "flows": 2, "groups": 1},
        # after the end record: the link put back, then the fabric's teardown: not the event's
        {"event": "reroute_done", "t_mono": 31.0, "switches": ["leaf1", "leaf2"], "flows": 9, "groups": 3}])
    # cumulative port counters: spine1-eth1 dropped 3 after the event, 5 more at teardown;
    # another port's drops are not the link's
    write_jsonl(tmp_path / "ports.jsonl", [
        {"t_ns": 13 * s, "intf": "spine1-eth1", "tx_dropped": 1, "rx_dropped": 0},
        {"t_ns": 13 * s, "intf": "leaf2-eth5", "tx_dropped": 0, "rx_dropped": 0},
        {"t_ns": 15 * s, "intf": "spine1-eth1", "tx_dropped": 3, "rx_dropped": 1},
        {"t_ns": 15 * s, "intf": "leaf2-eth5", "tx_dropped": 7, "rx_dropped": 0},
        {"t_ns": 31 * s, "intf": "spine1-eth1", "tx_dropped": 8, "rx_dropped": 1}])
    records = [{"type": "op", "iteration": it, "ready_ns": (10 + 5 * it) * s, "end_ns": (14 + 5 * it) * s + end}
               for it, end in ((0, 0), (1, 0), (2, 0))]
    records[0]["end_ns"] = 14 * s + s // 2  # iteration 0 ran past the event
    iterations = [{"iteration": 0, "step_ns": 150_000}, {"iteration": 1, "step_ns": 100_000},
                  {"iteration": 2, "step_ns": 100_000}]
    rows = failures.summarise(tmp_path, records, iterations, dilation=Dilation(50_000))
    assert len(rows) == 1
    r = rows[0]
    assert r["iteration"] == 0 and r["port_status_messages"] == 2
    assert r["reroute_emulated_ns"] == pytest.approx(10e6 - 2_000, rel=1e-6)
    assert r["reroute_real_ns"] == pytest.approx((10e6 - 2_000) / 50_000, rel=1e-6)
    assert r["stretch"] == pytest.approx(1.5) and r["rerouted_switches"] == ["leaf1", "spine1"]
    assert r["reroutes"] == 1 and r["flows_changed"] == 2 and r["dropped_packets"] == 3
    text = failures.sentence(rows, {"retransmitted": 40, "timeouts": 3}, lambda ns: f"{ns:.0f}ns")
    assert "link leaf1-spine1 down in iteration 1" in text and "x1.50" in text and "40 packets" in text
    assert "dropped 3 packets" in text


def test_a_switch_not_connected_yet_gets_its_new_routes_when_it_connects():
    p = planning.build(scenario.load("collisions"))
    fc = routing.FabricController(p)
    by_name = {s.name: dp for dp, s in fc.switches.items()}
    fc.switch_connected(by_name["leaf1"], 0.0)
    out = fc.port_status(by_name["leaf1"], 5, False, 1.0)
    assert [fc.switches[d].name for d, _ in out] == ["leaf1"]  # spine1 is not connected: nothing sent to it
    msgs = fc.switch_connected(by_name["spine1"], 2.0)
    flows = {dict(m.match).get("ipv4_dst", ("",))[0]: m.actions[-1] for m in msgs
             if isinstance(m, routing.FlowAdd) and m.table == routing.ROUTE_TABLE}
    assert flows["10.0.1.0"] == ("output", 2)


def test_a_slowed_link_sets_its_rate_on_both_ends_and_up_restores_it():
    p = planning.build(scenario.load("collisions", [
        "events=[{at: 1us, action: slow, link: leaf1-spine2, rate: 100G}, {at: 2us, action: down, link: leaf2-eth5},"
        " {at: 3us, action: up, link: leaf2-eth5}, {at: 4us, action: up, link: leaf1-spine2}]"]))
    slow, down, up_plain, up_slowed = p.events
    assert slow.action == "slow" and slow.rate_bps == 100_000_000_000
    assert slow.intfs == ("leaf1-eth6", "leaf1-eth8") and len(slow.peers) == 2
    uplink_rate = next(lk.rate_bps for lk in p.links if lk.kind == "uplink")
    assert uplink_rate > slow.rate_bps
    # up on a link that was only down sets no rate; up on the slowed one puts the plan's back
    assert down.rate_bps == 0 and up_plain.rate_bps == 0 and up_slowed.rate_bps == uplink_rate
    # the rate is checked against the link's and against what this machine can run
    with pytest.raises(ConfigError, match=r"\[0\]\.rate: expected a rate below the link's"):
        planning.build(scenario.load("collisions", ["events=[{at: 1us, action: slow, link: leaf1-spine2, "
                                                    f"rate: {uplink_rate // 10**9}G}}]"]))
    with pytest.raises(ConfigError, match=r"\[0\]\.rate: at dilation .* runs at .* bit/s here"):
        planning.build(scenario.load("collisions", ["events=[{at: 1us, action: slow, link: leaf1-spine2, rate: 1M}]"]))


def test_what_a_slowed_link_cost_and_how_it_is_told(tmp_path):
    s = 1_000_000_000
    write_jsonl(tmp_path / "link-events.jsonl", [
        {"event": "link_slow", "link": "leaf1-spine1", "intfs": ["leaf1-eth5"], "peers": ["spine1-eth1"],
         "at_real_ns": 80_000, "due_ns": 14 * s, "t_ns": 14 * s, "late_ns": 0, "rate_bps": 100_000_000_000,
         "rate_set_ns": 14 * s + 1_000_000},
        {"event": "link_up", "link": "leaf1-spine1", "intfs": ["leaf1-eth5"], "peers": ["spine1-eth1"],
         "at_real_ns": 400_000, "due_ns": 22 * s, "t_ns": 22 * s, "late_ns": 0, "rate_bps": 400_000_000_000,
         "rate_set_ns": 22 * s + 1_000_000},
        {"event": "end", "t_ns": 30 * s, "restored": []}])
    records = [{"type": "op", "iteration": it, "ready_ns": (10 + 5 * it) * s, "end_ns": (14 + 5 * it) * s + s // 2}
               for it in range(4)]
    iterations = [{"iteration": 0, "step_ns": 300_000}, {"iteration": 1, "step_ns": 100_000},
                  {"iteration": 2, "step_ns": 100_000}, {"iteration": 3, "step_ns": 100_000}]
    rows = failures.summarise(tmp_path, records, iterations, dilation=Dilation(50_000))
    slow, up = rows
    assert slow["iteration"] == 0 and slow["rate_bps"] == 100_000_000_000 and slow["stretch"] == pytest.approx(3.0)
    assert slow["reroutes"] == 0 and slow["reroute_real_ns"] is None and slow["port_status_messages"] == 0
    text = failures.sentence(rows, {}, lambda ns: f"{ns:.0f}ns")
    assert "link leaf1-spine1 slowed to 100 Gbit/s in iteration 1: the routes kept sending traffic over it" in text
    assert "x3.00" in text and "link leaf1-spine1 back at 400 Gbit/s in iteration 3: nothing to reroute" in text
    # a link slowed while it was down comes up rerouted and at its rate
    up["port_status_messages"], up["reroute_real_ns"] = 2, 200.0
    assert "link leaf1-spine1 up (at 400 Gbit/s again) in iteration 3: the controller rerouted 0 switches in 200ns" \
        in failures.sentence(rows, {}, lambda ns: f"{ns:.0f}ns")
