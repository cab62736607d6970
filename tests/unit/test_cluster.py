"""Placement of a fabric on several machines (model.placement): pure, no root."""

import json
import re

import pytest

from testbed import cli
from testbed.config import scenario
from testbed.errors import ConfigError
from testbed.model import placement, plan


def build(ref, *overrides):
    return plan.build(scenario.load(ref, list(overrides)), "user")


def test_leaf_spine_places_one_pod_per_server_and_only_uplinks_cross():
    p = build("leaf-spine")
    placed = placement.place(p, ("a", "b"))
    assert [pod.leaves for pod in placed.pods] == [("leaf1",), ("leaf2",)]
    assert placed.pod_machine == ("a", "b") and placed.gpus_on("a") == placed.gpus_on("b") == 4
    assert {placed.node_machine[f"spine{i}"] for i in (1, 2)} == {"a", "b"}
    # every GPU link stays on its pod's machine; an uplink crosses iff its spine is elsewhere
    for link in p.links:
        crosses = placed.node_machine[link.a] != placed.node_machine[link.b]
        assert crosses == (link in placed.cross_links)
        assert not crosses or link.kind == "uplink"
    assert len(placed.cross_links) == 4 and len([lk for lk in p.links if lk.kind == "uplink"]) == 8


def test_uneven_pods_go_to_the_machine_with_fewest_gpus():
    p = build("leaf-spine", "fabric.leaves=5", "fabric.spines=3", "fabric.uplinks.count=3")
    placed = placement.place(p, ("a", "b", "c"))
    assert sorted(placed.gpus_on(m) for m in placed.machines) == [4, 8, 8]
    assert sorted(placed.node_machine[s] for s in ("spine1", "spine2", "spine3")) == ["a", "b", "c"]
    assert sum(len(pod.gpus) for pod in placed.pods) == len(p.hosts)
    assert set(placed.node_machine) == {s.name for s in p.switches} | {h.name for h in p.hosts} | \
        {s.nvlink_bridge for s in p.servers if s.nvlink_bridge}


def test_a_rail_optimised_fabric_is_one_pod_and_is_not_split():
    """Every server reaches every rail leaf and shares one NVLink: splitting would put a
    GPU link or an NVLink across machines, which the placement refuses by pod count."""
    p = build("default")
    assert len(placement.pods(p)) == 1
    assert placement.place(p, ("a",)).cross_links == ()
    with pytest.raises(ConfigError, match=r"2 servers but fabric rail-optimised of scenario default has 1 pod"):
        placement.place(p, ("a", "b"))


@pytest.mark.parametrize("text, error", [
    ("", "expected a comma-separated list"), ("a,,b", "expected a comma-separated list"),
    ("a,a", "a is listed twice"), ("a;rm", "is not a host name"), ("-oProxyCommand=x", "is not a host name")])
def test_bad_server_lists_are_refused(text, error):
    with pytest.raises(ConfigError, match=error):
        placement.parse_machines(text)


def test_show_cluster_prints_the_placement_and_the_crossing_links(capsys, in_repo):
    assert cli.main(["show", "leaf-spine", "--cluster", "10.0.0.1,10.0.0.2"]) == 0
    out = capsys.readouterr().out
    assert "10.0.0.1: 4 GPUs (h1..h4), leaves leaf1, spines spine1" in out
    assert "cross-server links: 4 of 8 uplinks" in out and "leaf1-eth6     <-> spine2-eth1" in out
    assert cli.main(["show", "default", "--cluster", "a,b"]) == 2
    assert "has 1 pod" in capsys.readouterr().err


def test_the_clock_offset_comes_from_the_shortest_round_trip():
    from testbed.apply.cluster.ssh import ClockSample, best_offset

    # remote runs 1000 ns ahead; a slow sample's answer came late in its round trip
    samples = [ClockSample(0, 1_000 + 900, 1_000), ClockSample(5_000, 6_000 + 50, 5_100),
               ClockSample(9_000, 10_000 + 3000, 13_000)]
    offset, error = best_offset(samples)
    assert (offset, error) == (1_000 + 50 - 50, 50)


def test_the_clock_error_sets_the_smallest_dilation():
    from testbed.apply.cluster.doctor import clock_error_dilation

    # a tenth of a 4214-byte frame at 400G is 8.428 ns: 84.28 us of real error needs 10000
    assert clock_error_dilation(84_280) == pytest.approx(10_000)


def test_ssh_uses_keys_only_and_the_cluster_ssh_config(monkeypatch):
    from testbed.apply.cluster import doctor
    from testbed.apply.cluster import ssh

    monkeypatch.setenv("TESTBED_SSH_CONFIG", "/etc/cluster_ssh")
    argv = ssh.ssh_argv("10.0.0.2", doctor.probe_command())
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={ssh.SSH_CONNECT_TIMEOUT_S}"]
    assert argv[-3:-1] == ["/etc/cluster_ssh", "10.0.0.2"] and argv[-1].endswith("-m testbed.apply.cluster.doctor probe")


def test_shares_split_the_plan_exactly_and_both_ends_of_a_crossing_link_agree():
    p = build("leaf-spine")
    placed = placement.place(p, ("a", "b"))
    a, b = placement.shares(p, placed)
    assert (a.machine, b.machine) == ("a", "b")
    # every node, queue and link once (a crossing link as one tunnel end on each side)
    assert sorted(a.switches + b.switches) == sorted(s.name for s in p.switches)
    assert sorted(a.hosts + b.hosts) == sorted(h.name for h in p.hosts)
    assert sorted(q.intf for q in a.queues + b.queues) == sorted(q.intf for q in p.queues)
    assert len(a.links) + len(b.links) + len(placed.cross_links) == len(p.links)
    assert len(a.tunnels) == len(b.tunnels) == len(placed.cross_links) == 4
    by_key = {}
    for end in a.tunnels + b.tunnels:
        by_key.setdefault(end.key, []).append(end)
    for key, (x, y) in by_key.items():
        link = p.links[key - 1]
        assert {x.intf, y.intf} == {link.a_intf, link.b_intf}
        assert (x.peer_intf, y.peer_intf) == (y.intf, x.intf) and {x.peer, y.peer} == {"a", "b"}
        assert x.intf == f"{x.switch}-eth{x.port}"
    # a spine's queue toward a leaf on its own machine is fed by the other leaf's uplinks:
    # with PFC on, its pauses go out of tunnel ends
    tunnel_intfs = {t.intf for t in a.tunnels}
    assert a.paused_across and all(f in tunnel_intfs for _q, f in a.paused_across)


def test_one_machine_has_no_tunnels():
    p = build("default")
    (only,) = placement.shares(p, placement.place(p, ("a",)))
    assert only.tunnels == () and only.paused_across == () and len(only.links) == len(p.links)


def test_a_site_is_the_whole_plan_or_one_share_of_it():
    p = build("leaf-spine")
    a, _b = placement.shares(p, placement.place(p, ("a", "b")))
    assert placement.WHOLE.switches is None and placement.WHOLE.queues(p) == tuple(p.queues)
    assert placement.WHOLE.controller_address == "127.0.0.1" and placement.WHOLE.share is None
    site = placement.Site(a, {"a": "10.0.0.1", "b": "10.0.0.2"}, "10.0.0.1")
    assert site.switches == a.switches and site.queues(p) == a.queues and len(a.queues) < len(p.queues)


@pytest.mark.parametrize("name, ref, sets, machines", [
    ("leaf-spine-2", "leaf-spine", (), ("a", "b")),
    ("leaf-spine-5-leaves-3", "leaf-spine", ("fabric.leaves=5", "fabric.spines=3", "fabric.uplinks.count=3"),
     ("a", "b", "c"))])
def test_cluster_view_golden(name, ref, sets, machines):
    """The placement as `show --cluster` prints it: any change to where things run or what
    crosses shows up as a diff (TESTBED_REGEN_GOLDEN=1 rewrites and fails, as the plan goldens)."""
    import os

    from helpers import GOLDEN
    from testbed.views import cluster as view

    p = build(ref, *sets)
    got = view.render(p, placement.place(p, machines)) + "\n"
    path = GOLDEN / "cluster" / f"{name}.txt"
    if os.environ.get("TESTBED_REGEN_GOLDEN"):
        path.write_text(got)
        pytest.fail(f"regenerated {path.name}: review it with git diff, then rerun without TESTBED_REGEN_GOLDEN")
    assert got == path.read_text()


@pytest.mark.parametrize("address, ok", [("127.0.0.1", True), ("10.250.2.1", True), ("0.0.0.0", False),
                                         ("255.255.255.255", False), ("224.0.0.1", False), ("leaf1", False),
                                         ("::1", False)])
def test_the_controller_listens_on_one_explicit_address(address, ok):
    from testbed.apply.processes.controller import check_listen_address
    from testbed.errors import RunError

    if ok:
        assert check_listen_address(address) == address
    else:
        with pytest.raises(RunError, match=f"controller address {re.escape(address)}"):
            check_listen_address(address)


def test_a_tunnel_end_is_a_vxlan_device_named_and_keyed_by_the_plan():
    from testbed.apply.cluster import tunnel
    from testbed.model.queues import LINK_MTU_BYTES

    p = build("leaf-spine")
    a, _b = placement.shares(p, placement.place(p, ("a", "b")))
    end = a.tunnels[0]
    argv = tunnel.vxlan_argv(end, "192.168.56.11", "192.168.56.12")
    assert argv[:5] == ["ip", "link", "add", "name", end.intf]
    opts = dict(zip(argv[5::2], argv[6::2]))
    assert opts["type"] == "vxlan" and opts["id"] == str(end.key) and opts["mtu"] == str(LINK_MTU_BYTES)
    assert (opts["local"], opts["remote"], opts["dstport"]) == ("192.168.56.11", "192.168.56.12", "4789")
    assert opts["numtxqueues"] == "2" and argv[-1] == "nolearning"


def test_tunnels_need_every_peer_address():
    from testbed.apply.cluster import tunnel
    from testbed.errors import RunError

    p = build("leaf-spine")
    a, _b = placement.shares(p, placement.place(p, ("a", "b")))
    with pytest.raises(RunError, match="no underlay address for b"):
        tunnel.TunnelPorts(a.tunnels, "r", None, "10.0.0.1", {"a": "10.0.0.1"})


def test_fabric_builds_only_its_share():
    from testbed.apply import fabric

    p = build("leaf-spine")
    a, b = placement.shares(p, placement.place(p, ("a", "b")))
    topo = fabric.build_topo(p, "user", a)
    assert sorted(topo.switches()) == sorted(a.switches) and sorted(topo.hosts()) == sorted(a.hosts)
    assert len(topo.links()) == len(a.links)
    ours = set(fabric.root_interfaces(p, a))
    assert ours.isdisjoint(fabric.root_interfaces(p, b))
    assert ours.isdisjoint(t.intf for t in a.tunnels)  # tunnel ends are apply.cluster.tunnel's
    assert set(fabric.root_interfaces(p)) == ours | set(fabric.root_interfaces(p, b)) | {
        t.intf for t in a.tunnels + b.tunnels}


def test_a_servers_records_come_back_on_the_coordinators_time_line():
    text = "\n".join([
        '{"gpu": "h5", "type": "op", "ready_ns": 5000, "start_ns": 5100, "end_ns": 7000, "bytes": 32000}',
        '{"gpu": "h5", "type": "rate", "t_ns": 6000, "rate_bps": 100}',
        '{"gpu": "h5", "type": "qp", "packets_sent": 8, "nscc_base_rtt_ns": 900}',
        '{"gpu": "h5", "type": "op", "ready_ns": 8000, "sta',  # cut short by an interrupted run
    ]) + "\n"
    out = placement.to_coordinator_clock(text, 1000).splitlines()
    assert json.loads(out[0]) == {"gpu": "h5", "type": "op", "ready_ns": 4000, "start_ns": 4100, "end_ns": 6000,
                                  "bytes": 32000}
    assert json.loads(out[1])["t_ns"] == 5000 and json.loads(out[1])["rate_bps"] == 100
    # durations and counters are not times on a clock
    assert json.loads(out[2]) == {"gpu": "h5", "type": "qp", "packets_sent": 8, "nscc_base_rtt_ns": 900}
    assert out[3] == '{"gpu": "h5", "type": "op", "ready_ns": 8000, "sta'
    # a server behind the coordinator (negative offset) moves forward
    assert json.loads(placement.to_coordinator_clock(text, -1000).splitlines()[1])["t_ns"] == 7000


def test_crossing_bytes_are_the_sends_whose_peer_is_on_another_server(tmp_path):
    source = tmp_path / "s.yaml"
    source.write_text("name: ls-dp\ntopology: leaf-spine\ntraffic: dp-ring\n")
    p = plan.build(scenario.load(str(source), ["workload.iterations=2", "workload.collective.bytes=256KB"]), "user")
    placed = placement.place(p, ("a", "b"))
    # the ring h1..h8 crosses twice (h4 -> h5, h8 -> h1), each 2 x 7 steps of 256 KB / 8 per iteration
    per_pair = 2 * (2 * 7 * 32000)
    assert placement.crossing_bytes(p, placed) == {("a", "b"): per_pair, ("b", "a"): per_pair}
    # without a workload nothing crosses; on one machine nothing crosses
    assert placement.crossing_bytes(build("leaf-spine"), placement.place(build("leaf-spine"), ("a", "b"))) == {}
    assert placement.crossing_bytes(p, placement.place(p, ("a",))) == {}


def test_a_cluster_run_checks_its_servers_before_anything_is_built(tmp_path):
    """``run --cluster`` (or ``cluster:``): at least two servers, this machine's address
    first (never loopback), no server twice, and what does not cross servers yet refused,
    each naming where the list came from."""
    from types import SimpleNamespace

    from testbed.run import coordination

    p = build("leaf-spine")
    opts = SimpleNamespace(pcap="", cli=False, isolate_baseline=False)
    with pytest.raises(ConfigError, match=r"f.yaml: cluster: '10.0.0.1' lists one server"):
        coordination.layout(p, "10.0.0.1", opts, "f.yaml: cluster")
    with pytest.raises(ConfigError, match=r"--cluster: the first server must be this machine's address .* got "
                                          r"'127.0.0.1'"):
        coordination.layout(p, "127.0.0.1,192.0.2.7", opts)
    with pytest.raises(ConfigError, match=r"--cluster: the first server must be this machine's address .* got "
                                          r"'192.0.2.7'"):
        coordination.layout(p, "192.0.2.7,192.0.2.8", opts)  # TEST-NET-1: never this machine's
    with pytest.raises(ConfigError, match=r"--cluster: server 'no-such-host\.invalid' does not resolve to an IPv4 "):
        coordination.layout(p, "192.0.2.7,no-such-host.invalid", opts)
    refused = coordination.unsupported(build("leaf-spine", "fabric.routing=adaptive"),
                                       SimpleNamespace(pcap="leaf1-eth1", cli=True, isolate_baseline=True))
    assert [r.split(":")[0] for r in refused] == ["routing", "--pcap", "--cli", "--isolate-baseline"]
