"""Switch queues on the real data path: incast into one switch port of the fabric."""

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.apply import live
from testbed.apply import registry
from testbed.analysis import results
from testbed import run
from testbed.config import scenario
from testbed.apply.processes.child import wait_for

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).resolve().parent.parent / "helpers"  # the traffic scripts
MTU = 1500
# The lab-VM check runs under software CPU emulation (10-20x slower, later timers):
# it loosens timing-derived bounds by this factor (scripts/lab-vm-inside.sh sets it).
TIMING_SLACK = float(os.environ.get("TESTBED_TIMING_SLACK", "1"))


def incast(ctx, senders, receiver, rate_bps, seconds, size=1000, sample=None):
    """Senders blast ECT(0) UDP at ``receiver``; returns (sent, received counts, samples).
    The receiver counts until the senders are done and the receiver's port has drained."""
    fab, plan = ctx.fabric, ctx.plan
    dst = plan.host(receiver)
    port = f"{dst.leaf}-eth{dst.leaf_port}"
    rx = fab.host(receiver).popen([sys.executable, str(SCRIPTS / "ce_count.py"), "--intf", f"{receiver}-eth0",
                                   "--seconds", "600"], text=True, stdin=subprocess.PIPE)
    assert rx.stdout.readline().strip() == "ready"
    tx = [fab.host(h).popen([sys.executable, str(SCRIPTS / "udp_blast.py"), dst.addr, "--rate-bps", str(rate_bps),
                             "--seconds", str(seconds), "--size", str(size)], text=True) for h in senders]
    samples = []
    while any(p.poll() is None for p in tx):
        if sample:
            samples.append(sample())
        time.sleep(0.02)  # sampling period
    sent = sum(json.loads(p.communicate(timeout=30)[0])["sent"] for p in tx)
    wait_for(lambda: ctx.egress.tc.qdisc_stats(port)["backlog_bytes"] == 0, 60, f"{port} to drain")
    counts = json.loads(rx.communicate(input="", timeout=60)[0])
    return sent, counts, samples


def test_incast_marks_equal_ce_at_receiver_drops_only_at_buffer(tmp_path):
    """h2, h3, h4 -> h1 on one leaf at 1.5 x the port rate in total: the queue of leaf1-eth1
    fills, the marker marks and, past the buffer, drops; the TBF behind it never drops.
    Dilation 200000 (400G = 2 Mbit/s): the shadow can only follow the real queue to within
    (qdisc timer lateness x port rate), so the port rate is chosen for ~1 ms of lateness."""
    sc = scenario.load("leaf-spine", ["queues.buffer=300KB", "queues.ecn.kmin=30KB", "queues.ecn.kmax=150KB",
                                      "queues.ecn.pmax=0.2", "dilation=200000"])
    out = {}

    def hook(ctx):
        (pq,) = [q for q in ctx.egress.ports if q.intf == "leaf1-eth1"]
        sample = lambda: ctx.egress.depth_sample("leaf1-eth1")  # noqa: E731
        sent, counts, samples = incast(ctx, ["h2", "h3", "h4"], "h1", pq.emulated_rate_bps / 2, 6,
                                        size=MTU, sample=sample)
        out.update(pq=pq, sent=sent, counts=counts, samples=samples,
                   marker=ctx.egress.counters("leaf1-eth1"), tbf=ctx.egress.tc.qdisc_stats("leaf1-eth1"))
        (me,) = [r for r in registry.live_runs().values() if r["pid"] == os.getpid()]
        (out["view"],) = [r for r in live.snapshot(me) if r["intf"] == "leaf1-eth1"]
        out["tc_text"] = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "leaf1-eth1"], capture_output=True,
                                        text=True, check=True, timeout=30).stdout

    assert run.run(sc, run.RunOptions(results_dir=tmp_path, hook=hook)).status == "ok"
    marker, counts, tbf = out["marker"], out["counts"], out["tbf"]
    assert counts["bad_ip_checksum"] == 0 and counts["socket_drops"] == 0
    assert marker["marked"] > 0 and counts["ce"] == marker["marked"]
    assert marker["drops"] > 0 and tbf["drops"] == 0  # drops happen in the marker, at the buffer
    # every datagram lost was dropped by the marker (its counts also include the few
    # non-test packets that crossed the port, e.g. ICMP)
    lost = out["sent"] - counts["udp"]
    assert lost <= marker["drops"] <= lost + (marker["packets"] - out["sent"])
    assert marker["max_depth_bytes"] <= out["pq"].buffer_bytes
    # `testbed queues`, `tc -s qdisc` and the marker agree (the queue has drained by now)
    view = out["view"]
    assert (view["marked"], view["drops"], view["packets"]) == (marker["marked"], marker["drops"], marker["packets"])
    sent_pkts = int(re.search(r"qdisc tbf .*?Sent \d+ bytes (\d+) pkt \(dropped (\d+)", out["tc_text"], re.S).group(1))
    assert tbf["backlog_bytes"] == 0 and sent_pkts == tbf["sent_packets"] == marker["packets"] - marker["drops"]
    # the shadow queue tracks the real backlog while it is loaded (samples during which no
    # packet arrived, so both views describe the same instant)
    loaded = [abs(shadow - real) for shadow, real, clean in out["samples"] if real > 0 and clean]
    assert len(loaded) > 20
    p95 = statistics.quantiles(loaded, n=20)[-1]
    assert p95 <= MTU * TIMING_SLACK, (p95, loaded)


def victim_run(tmp_path, pfc_on: bool) -> dict:
    """One spine, one uplink per leaf. Incast into h5 (leaf2): h6 and h8 (same leaf) at the
    port rate each, h1 (leaf1, across the spine) at half of it. A victim flow h3 -> h7 at
    0.3 x the port rate shares the leaf1 -> spine -> leaf2 links with h1's traffic but not
    h5's congested port; no link on its path is over-subscribed by itself."""
    sc = scenario.load("leaf-spine", ["fabric.spines=1", "fabric.uplinks.count=1", "queues.buffer=300KB",
                                      "queues.ecn=off", "dilation=200000"] + ([] if pfc_on else ["queues.pfc=off"]))
    out = {}

    def hook(ctx):
        fab, plan = ctx.fabric, ctx.plan
        (pq,) = [q for q in ctx.egress.ports if q.intf == f"{plan.host('h5').leaf}-eth{plan.host('h5').leaf_port}"]
        rate = pq.emulated_rate_bps
        rx = fab.host("h7").popen([sys.executable, str(SCRIPTS / "ce_count.py"), "--intf", "h7-eth0", "--seconds",
                                   "600"], text=True, stdin=subprocess.PIPE)
        assert rx.stdout.readline().strip() == "ready"
        flows = [("h6", "h5", rate), ("h8", "h5", rate), ("h1", "h5", rate / 2), ("h3", "h7", 0.3 * rate)]
        tx = {src + dst: fab.host(src).popen([sys.executable, str(SCRIPTS / "udp_blast.py"), plan.host(dst).addr,
                                              "--rate-bps", str(r), "--seconds", "5", "--size", str(MTU)], text=True)
              for src, dst, r in flows}
        sent = {k: json.loads(p.communicate(timeout=60)[0])["sent"] for k, p in tx.items()}
        for q in ctx.egress.ports:
            wait_for(lambda q=q: ctx.egress.tc.qdisc_stats(q.intf)["backlog_bytes"] == 0, 60, f"{q.intf} to drain")
        out.update(victim_sent=sent["h3h7"], victim_received=json.loads(rx.communicate(input="", timeout=60)[0])["udp"])

    result = run.run(sc, run.RunOptions(results_dir=tmp_path, hook=hook))
    assert result.status == "ok", result.reason
    out["pfc"] = result.manifest.get("pfc")
    out["queues"] = results.load(result.run_dir).queues
    return out


def test_pause_spreads_upstream_and_slows_a_victim_flow(tmp_path, clean_slate):
    """Without PFC the victim is untouched (only h5's port drops). With PFC, h5's port
    pauses the spine's port toward leaf2, whose queue then pauses leaf1's uplink: the
    victim, which never goes near h5's port, waits behind h1's paused packets (head-of-line
    blocking) and loses delivery (the UDP senders, unlike the GPU agents, ignore pauses, so
    leaf1's uplink queue overflows its headroom)."""
    off = victim_run(tmp_path / "off", pfc_on=False)
    assert off["victim_received"] >= 0.99 * off["victim_sent"], off
    on = victim_run(tmp_path / "on", pfc_on=True)
    assert "spine1-eth2" in on["pfc"]["paused_ports"] and "leaf1-eth5" in on["pfc"]["paused_ports"], on["pfc"]
    # the collector's polls saw those ports' paused time grow (the PFC process's counters)
    q = on["queues"]
    assert q[q.intf == "spine1-eth2"].pfc_paused_ns.max() > 0 and q[q.intf == "leaf1-eth5"].pfc_paused_ns.max() > 0
    assert off["queues"].pfc_paused_ns.max() == 0
    assert on["victim_received"] < 0.9 * on["victim_sent"], on
