"""One fabric on two servers: this machine builds its share of ``leaf-spine`` and a second
server on this machine (cluster_server.LocalServer: its own network, mount and UTS
namespaces, sshd and Open vSwitch) builds the other share over ssh (run/share.py); the
crossing uplinks are VXLAN tunnels between them, and one controller on this machine's
cluster address programs both servers' switches."""

import json
import os
import re
import subprocess
import sys
from contextlib import ExitStack

import pytest

from helpers.cluster_server import MONOTONIC_OFFSET_S, LocalServer
from testbed.paths import ROOT

pytestmark = pytest.mark.integration

PING_BYTES = 4000  # a jumbo frame with DF set: the tunnels and the underlay carry the fabric's MTU


def tunnel_packets(intf: str) -> tuple[int, int]:
    (link,) = json.loads(subprocess.run(["ip", "-s", "-j", "link", "show", "dev", intf], capture_output=True,
                                        text=True, timeout=30, check=True).stdout)
    return link["stats64"]["tx"]["packets"], link["stats64"]["rx"]["packets"]


def share_request(sc, plan, run_id: str, s2, controller_port: int) -> dict:
    """What the coordinator sends server b (run/share.py): a is this machine."""
    from testbed.model import plan as planning
    from testbed.run.share import make_request

    return make_request(run_id=run_id, scenario=sc.resolved, plan=plan, datapath="user", link_delay=False,
                        telemetry_interval_real_ns=planning.DEFAULT_TELEMETRY_INTERVAL_REAL_NS, slowdown=1.0,
                        machines=("a", "b"),
                        machine="b", underlay={"a": s2.root_address, "b": s2.address},
                        controller_address=s2.root_address, controller_port=controller_port)


class TwoServers:
    """The fabric of ``sc`` on two servers: this machine (a, with the controller on its
    cluster address) and a LocalServer (b, over ssh); ``enter(stack)`` brings it up."""

    def __init__(self, sc, tmp_path, monkeypatch, s2):
        from testbed.model import placement
        from testbed.model import plan as planning

        self.sc, self.tmp_path, self.monkeypatch, self.s2 = sc, tmp_path, monkeypatch, s2
        self.plan = planning.build(sc, "user")
        self.placement = placement.place(self.plan, ("a", "b"))
        self.here, self.there = placement.shares(self.plan, self.placement)
        self.plan_path = tmp_path / "plan.json"
        self.plan_path.write_text(json.dumps(self.plan.to_dict()))
        self.run_id = f"cluster-{tmp_path.name[-20:]}"

    def enter(self, stack: ExitStack, before_far=None):
        from testbed.apply import registry
        from testbed.apply.cluster import remote_share
        from testbed.apply.processes.controller import Controller
        from testbed.apply.fabric import MininetFabric
        from testbed.apply.processes.child import free_tcp_port
        from testbed.apply.datapath.egress import EgressQueues
        from testbed.model import placement

        s2, plan = self.s2, self.plan
        self.monkeypatch.setenv("TESTBED_SSH_CONFIG", str(s2.ssh_config))
        for argv in (["ip", "link", "set", "dev", s2.root_intf, "mtu", "9000"],
                     s2.inside("ip", "link", "set", "dev", "eth0", "mtu", "9000")):
            subprocess.run(argv, check=True, timeout=30)
        underlay = {"a": s2.root_address, "b": s2.address}
        self.record = stack.enter_context(registry.RunRecord(self.run_id, str(self.tmp_path)))
        port = free_tcp_port()
        site = placement.Site(self.here, underlay, s2.root_address)
        self.ctl = stack.enter_context(Controller(self.plan_path, self.tmp_path, port, site=site,
                                                  on_start=lambda pid: self.record.add(processes=[pid])))
        self.ctl.wait_listening(60)
        work = self.tmp_path / "work"
        work.mkdir()
        self.fab = stack.enter_context(MininetFabric(plan, self.run_id, "user", port, self.record, work, site=site))
        self.request = share_request(self.sc, plan, self.run_id, s2, port)
        if before_far:
            before_far(self)
        self.egress = stack.enter_context(EgressQueues(plan, self.run_id, site=site))
        self.far = stack.enter_context(remote_share.RemoteShare(s2.address, self.request))
        # one controller, every switch of both servers connected and programmed
        ready = self.ctl.wait_fabric_ready(len(plan.switches), 120)
        assert len(ready) == len(plan.switches)
        return self


def refused_when_planned_differently(two: "TwoServers"):
    """A server that plans the run differently (another version) refuses, leaving nothing up."""
    from testbed.apply.cluster import remote_share
    from testbed.errors import RunError

    s2 = two.s2
    refused = (rf"{re.escape(s2.address)}: its share of the run did not come up: this server plans the run "
               rf"differently \(plan \w+, the coordinator's 0+\)")
    with pytest.raises(RunError, match=refused):
        with remote_share.RemoteShare(s2.address, dict(two.request, plan_digest="0" * 16)):
            pass
    assert subprocess.run(["ssh", "-F", str(s2.ssh_config), s2.address, "ovs-vsctl", "list-br"],
                          capture_output=True, text=True, timeout=30, check=True).stdout == ""


@pytest.mark.datapath_independent  # the second server runs OVS's userspace datapath everywhere
def test_two_servers_build_one_fabric_and_forward_across_tunnels(clean_slate, tmp_path, monkeypatch):
    from testbed.config import scenario as scenarios

    with LocalServer(tmp_path, 2) as s2, ExitStack() as stack:
        two = TwoServers(scenarios.load("leaf-spine"), tmp_path, monkeypatch, s2).enter(
            stack, before_far=refused_when_planned_differently)
        plan, here, there, far, fab, egress = two.plan, two.here, two.there, two.far, two.fab, two.egress
        assert far.ready["switches"] == list(there.switches) and far.ready["hosts"] == list(there.hosts)
        assert sorted(far.ready["tunnels"]) == sorted(t.intf for t in there.tunnels)
        # the other server's switches are not on this machine's OVS
        local = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, timeout=30,
                               check=True).stdout.split()
        assert set(there.switches).isdisjoint(local) and set(here.switches) <= set(local)

        # a tunnel end has its queue like any switch port (mq root, TBF on the data queue),
        # here and on the other server
        for intf, on in [(t.intf, []) for t in here.tunnels] + [(t.intf, s2.inside()) for t in there.tunnels]:
            shown = subprocess.run([*on, "tc", "qdisc", "show", "dev", intf], capture_output=True, text=True,
                                   timeout=30, check=True).stdout
            assert re.search(r"qdisc mq 1: root", shown) and "qdisc tbf" in shown and "qdisc clsact" in shown, (
                intf, shown)
        before = {t.intf: tunnel_packets(t.intf) for t in here.tunnels}
        marked = {t.intf: egress.counters(t.intf).get("packets", 0) for t in here.tunnels}
        far_hosts = [h for h in plan.hosts if h.name in there.hosts]
        sent = 0
        for h in here.hosts:
            node = fab.host(h)
            for dst in far_hosts:
                ping = node.popen(["ping", "-c", "2", "-i", "0.2", "-W", "3", "-M", "do", "-s", str(PING_BYTES),
                                   dst.ip.split("/")[0]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                out = ping.communicate(timeout=30)[0].decode()
                assert ping.returncode == 0, f"{h} -> {dst.name} ({dst.ip}) across the servers: {out}"
                sent += 2
        after = {t.intf: tunnel_packets(t.intf) for t in here.tunnels}
        # every request leaves through exactly one of this server's tunnel ends and every
        # reply arrives through one (static neighbours, no IPv6): nothing else crosses
        tx = sum(after[i][0] - before[i][0] for i in after)
        rx = sum(after[i][1] - before[i][1] for i in after)
        assert (tx, rx) == (sent, sent), (before, after)
        # and each went through that port's queue: the ECN marker counted every one
        for t in here.tunnels:
            assert egress.counters(t.intf).get("packets", 0) - marked[t.intf] == after[t.intf][0] - before[t.intf][0]
        # ECMP spreads the pairs over the crossing uplinks: more than one of them carried traffic
        assert sum(1 for i in after if after[i][0] > before[i][0]) > 1, (before, after)

        # PFC crosses too: a pause sent out of a tunnel end here (as this server's PFC process
        # would, for a congested queue fed from there) reaches the other server's PFC process
        # on the far end, which pauses that port's data class, then resumes it
        from testbed.wire import pfc

        end = here.tunnels[0]
        mac = open(f"/sys/class/net/{end.intf}/address").read().strip()
        sock = pfc.open_socket(end.intf)
        try:
            sock.send(pfc.frame(mac, {pfc.LOSSLESS_PRIORITY: 0xFFFF}))
            sock.send(pfc.frame(mac, {pfc.LOSSLESS_PRIORITY: 0}))
        finally:
            sock.close()
        files = far.ask("telemetry", "telemetry", 60, "its telemetry")["files"]
        events = [json.loads(line) for line in files["pfc"].splitlines()]
        at_far_end = [e for e in events if e.get("port") == end.peer_intf]
        assert [e["event"] for e in at_far_end if e["event"] in ("paused", "resumed")] == ["paused", "resumed"], events
        (totals,) = [e for e in at_far_end if e["event"] == "port"]
        assert totals["frames_received"] == 2, totals
        # the other server's PFC process serves exactly its own ports
        assert {e["port"] for e in events if e["event"] == "port"} == {pq.intf for pq in there.queues}


@pytest.mark.datapath_independent
def test_a_share_killed_mid_run_is_named_and_clean_cluster_removes_what_it_left(clean_slate, tmp_path, monkeypatch):
    """The coordinator says a share died without tearing down; ``clean --cluster`` then
    removes what it left on that server, from that server's own run registry."""
    from testbed.apply.cluster import remote_share
    from testbed.config import scenario as scenarios
    from testbed.errors import RunError
    from testbed.model import placement
    from testbed.model import plan as planning

    sc = scenarios.load("leaf-spine")
    plan = planning.build(sc, "user")
    _here, there = placement.shares(plan, placement.place(plan, ("a", "b")))
    with LocalServer(tmp_path, 2) as s2:
        monkeypatch.setenv("TESTBED_SSH_CONFIG", str(s2.ssh_config))

        def on_server(*argv) -> str:
            return subprocess.run(["ssh", "-F", str(s2.ssh_config), s2.address, *argv], capture_output=True,
                                  text=True, timeout=30, check=True).stdout

        request = share_request(sc, plan, f"killed-{tmp_path.name[-16:]}", s2, 6653)
        with pytest.raises(RunError, match=rf"{re.escape(s2.address)}: its share did not confirm its teardown"):
            with remote_share.RemoteShare(s2.address, request) as far:
                assert sorted(on_server("ovs-vsctl", "list-br").split()) == sorted(there.switches)
                on_server("kill", "-KILL", str(far.ready["pid"]))  # the share process we started
        left = sorted(on_server("ovs-vsctl", "list-br").split())
        assert left == sorted(there.switches)  # a killed share leaves its fabric up
        env = dict(os.environ, TESTBED_SSH_CONFIG=str(s2.ssh_config))
        done = subprocess.run([sys.executable, "-m", "testbed", "clean", "--cluster", s2.address],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        for name in there.switches:
            assert f"{s2.address}: delete OVS bridge {name} (run {request['run_id']})" in done.stdout, done.stdout
        for end in there.tunnels:
            assert f"{s2.address}: delete interface {end.intf} (run {request['run_id']})" in done.stdout, done.stdout
        assert on_server("ovs-vsctl", "list-br") == ""
        assert {link["ifname"] for link in json.loads(on_server("ip", "-j", "link", "show"))} == {"lo", "eth0"}
        # an unreachable server is named, and the exit says it was not cleaned
        done = subprocess.run([sys.executable, "-m", "testbed", "clean", "--cluster", f"{s2.address[:-1]}3"],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
        assert done.returncode == 1 and f"{s2.address[:-1]}3: NOT CLEANED: ssh: connect to host" in done.stdout, (
            done.stdout + done.stderr)


@pytest.mark.datapath_independent
def test_training_across_two_servers_delivers_every_byte_and_the_tunnels_carry_the_crossing_traffic(
        clean_slate, tmp_path, monkeypatch):
    """The default job (dp-ring, one iteration) on leaf-spine split over two servers: the
    agents of both start on one deadline (the other server's shifted by its measured clock
    offset), every planned op of every GPU is recorded in one folder, the bytes that crossed
    between the servers are exactly the plan's crossing sends, and the tunnel ends carried
    exactly the packets the agents say they sent across (data, ACKs, NAKs, CNPs)."""
    from testbed.analysis.training import load_records, summarise_run
    from testbed.model.plan_file import TrainingFile
    from testbed.apply.processes.agents import Agents
    from testbed.config import scenario as scenarios
    from testbed.model import placement
    from testbed.run.coordination import train_across

    source = tmp_path / "leaf-spine-dp.yaml"
    source.write_text((ROOT / "scenarios" / "leaf-spine.yaml").read_text() + "traffic: dp-ring\n")
    sc = scenarios.load(str(source), ["workload.iterations=1", "workload.collective.bytes=256KB"])
    with LocalServer(tmp_path, 2) as s2, ExitStack() as stack:
        two = TwoServers(sc, tmp_path, monkeypatch, s2).enter(stack)
        plan, here = two.plan, two.here
        at = two.placement.node_machine
        before = {t.intf: tunnel_packets(t.intf) for t in here.tunnels}
        records_dir = tmp_path / "run" / "agents"
        records_dir.parent.mkdir()
        ours = [g for g in plan.training.ranks if g in here.hosts]
        with Agents(two.fab, ours, two.plan_path, records_dir, two.record) as agents:
            started = train_across(agents, [two.far], records_dir, timeout_s=120)
        after = {t.intf: tunnel_packets(t.intf) for t in here.tunnels}
    assert set(started["clocks"]) == {s2.address}
    # the other server's CLOCK_MONOTONIC runs MONOTONIC_OFFSET_S ahead (its time namespace):
    # measured within the measurement's error (+1 us of rounding)
    clock = started["clocks"][s2.address]
    assert abs(clock["offset_ns"] - MONOTONIC_OFFSET_S * 10**9) <= clock["error_ns"] + 1000, clock

    # both servers' records, in one folder, on one time line
    assert sorted(p.name for p in records_dir.glob("*.jsonl")) == sorted(f"{g}.jsonl" for g in plan.training.ranks)
    records = load_records(records_dir)
    ops = [r for r in records if r["type"] == "op"]
    planned_ops = plan.training.to_dict()["ops"]
    assert len(ops) == sum(len(v) for v in planned_ops.values())
    summary = summarise_run(records_dir.parent, records, TrainingFile.from_dict(plan.training.to_dict()), plan.dilation)
    assert len(summary["iterations"]) == 1 and summary["collectives"], summary
    # one time line, not two: every message received across the servers ended after its
    # sender started it (in the coordinator's clock; the other server's records shifted back)
    sends = {(o["gpu"], o["peer"], o["iteration"], o["collective"], o["step"]): o for o in ops if o["kind"] == "send"}
    crossed = [o for o in ops if o["kind"] == "recv" and at[o["peer"]] != at[o["gpu"]]]
    assert crossed
    for r in crossed:
        s = sends[(r["peer"], r["gpu"], r["iteration"], r["collective"], r["step"])]
        assert s["start_ns"] <= r["end_ns"], (s, r)

    # every byte the plan sends between the servers arrived, in order, exactly once
    qps = [r for r in records if r["type"] == "qp"]
    received = {}
    for q in qps:
        if at[q["peer"]] != at[q["gpu"]]:
            key = (at[q["peer"]], at[q["gpu"]])
            received[key] = received.get(key, 0) + q["bytes_received"]
    expected = placement.crossing_bytes(plan, two.placement)
    assert expected and set(expected) == {("a", "b"), ("b", "a")}
    assert received == expected, (received, expected)

    # the tunnel ends carried exactly what the agents sent across, nothing more or less
    def sent_across(src: str) -> int:
        return sum(q["packets_sent"] + sum(q.get(k, 0) for k in ("acks_sent", "naks_sent", "cnps_sent", "nacks_sent"))
                   for q in qps if at[q["gpu"]] == src and at[q["peer"]] != src)

    tx = sum(after[i][0] - before[i][0] for i in after)
    rx = sum(after[i][1] - before[i][1] for i in after)
    assert (tx, rx) == (sent_across("a"), sent_across("b")), (before, after)


@pytest.mark.datapath_independent
def test_a_share_whose_coordinator_goes_away_mid_training_tears_down_at_once(clean_slate, tmp_path, monkeypatch):
    """The other server's GPUs train (their peers here never answer: no agents run here)
    when the coordinator closes the session: the share ends the wait for its agents and tears
    down within seconds, not at the training's hang deadline (minutes)."""
    import time

    from testbed.apply.cluster import remote_share
    from testbed.config import scenario as scenarios
    from testbed.model import plan as planning

    source = tmp_path / "leaf-spine-dp.yaml"
    source.write_text((ROOT / "scenarios" / "leaf-spine.yaml").read_text() + "traffic: dp-ring\n")
    sc = scenarios.load(str(source), ["workload.iterations=1"])
    plan = planning.build(sc, "user")
    with LocalServer(tmp_path, 2) as s2:
        monkeypatch.setenv("TESTBED_SSH_CONFIG", str(s2.ssh_config))
        request = share_request(sc, plan, f"gone-{tmp_path.name[-16:]}", s2, 6653)
        with remote_share.RemoteShare(s2.address, request) as far:
            offset_ns, _error_ns = far.clock_offset()
            far.ask("agents", "agents", 120, "its agents")
            start_ns = time.monotonic_ns() + int(offset_ns) + 10**9
            hang_s = 600  # the hang deadline the share would otherwise wait out
            # the share reads this line before the end of its stdin: it is waiting for its
            # agents (for up to hang_s) when the session closes below
            far.send(f"train {start_ns} {start_ns + hang_s * 10**9} {hang_s}")
            t0 = time.monotonic()
        # RemoteShare's exit closed the session and got "down" (else it raised)
        assert time.monotonic() - t0 < 30
        left = subprocess.run(["ssh", "-F", str(s2.ssh_config), s2.address, "ovs-vsctl", "list-br"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        assert left == ""
