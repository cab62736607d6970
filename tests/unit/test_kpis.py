"""KPIs, the fidelity guard, the report page and training progress, from a hand-made run
folder (no root, no fabric): every number here is worked out by hand."""

import io
import json
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import plans
from testbed import units
from testbed.analysis import fidelity, kpis, results
from testbed.views import report
from testbed.views import summary as summary_text
from testbed.views.progress import Progress

D = 1000  # dilation


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def queue_rows(intf, samples, rate=8e6):
    """(t_ns, backlog, sent, marked, ect, drops, max_depth[, depth]) per poll."""
    return [{"t_ns": t, "switch": intf.split("-")[0], "port": int(intf[-1]), "intf": intf,
             "depth_bytes": depth[0] if depth else 0,
             "max_depth_bytes": mx, "packets": ect + 10, "bytes": 0, "ect": ect, "marked": mk, "drops": dr,
             "control_packets": 0, "tbf_backlog_bytes": b, "tbf_sent_bytes": s, "tbf_drops": 0}
            for t, b, s, mk, ect, dr, mx, *depth in samples]


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({
        "run_id": "r1", "scenario": "unit", "status": "ok", "dilation": D, "datapath": "user",
        "workload": {"iterations": 1}, "telemetry": {"interval_real_ns": 10_000}}))
    q = {"rate_bps": 400e9, "emulated_rate_bps": 400e6, "kmin_bytes": 100, "kmax_bytes": 400, "xoff_bytes": 900,
         "buffer_bytes": 1000, "ecn": True, "pfc": False, "delay_ns": 100, "headroom_bytes": 5}
    # the plan's schedule: h1 computes (120 us) and sends, h2 sends; an ideal step of 100 us
    send = {"kind": "send", "iteration": 0, "phase": "dp", "collective": 0, "step": 0, "bytes": 1000}
    plan = plans.plan_json(
        dilation=D, hosts=[plans.host("h1", 1), plans.host("h2", 2)],
        switches=[plans.switch("leaf1"), plans.switch("spine1", "spine", 2), plans.switch("spine2", "spine", 3)],
        links=[plans.link("host", "h1", "leaf1", 0, 1, delay_ns=100),
               plans.link("uplink", "leaf1", "spine1", 2, 1, delay_ns=200),
               plans.link("uplink", "leaf1", "spine2", 3, 1, delay_ns=200)],
        queues=[plans.queue(**q, switch="leaf1", port=p, intf=f"leaf1-eth{p}", peer=peer)
                for p, peer in ((1, "h1"), (2, "spine1"), (3, "spine2"))],
        training=plans.training(
            ideal={"iteration_ns": 100_000, "link_bps": 400e9, "compute_ns": 60_000},
            collectives=[{"id": 0, "iteration": 0, "phase": "dp", "algorithm": "ring", "bytes": 1000, "ranks": 2,
                          "gpus": ["h1", "h2"], "ideal_ns": 1500}],
            ops={"h1": [{**send, "id": 0, "peer": "h2"}, {"kind": "compute", "iteration": 0, "phase": "forward",
                                                          "collective": -1, "step": -1, "bytes": 0, "id": 1}],
                 "h2": [{**send, "id": 0, "peer": "h1"}]}))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "agents").mkdir()
    op = {"type": "op", "iteration": 0, "phase": "dp", "collective": 0, "step": 0, "link": "fabric",
          "micro_batch": -1, "kind": "send", "bytes": 1000}
    # two concurrent sends of 1000 B: 1 us and 3 us (real) -> 8 and 2.67 Gbit/s
    write(tmp_path / "agents" / "h1.jsonl", [
        {**op, "gpu": "h1", "id": 0, "peer": "h2", "ready_ns": 0, "start_ns": 0, "end_ns": 1000 * D},
        {**op, "gpu": "h1", "id": 1, "kind": "compute", "phase": "forward", "collective": -1, "step": -1,
         "peer": None, "bytes": 0, "ready_ns": 0, "start_ns": 0, "end_ns": 120_000 * D},
        {"gpu": "h1", "type": "nic", "tx_count": 10, "tx_late_ns": 60, "tx_late_max_ns": 30, "tx_gap_ns": 1000,
         "tx_slip_ns": 20,
         "timer_count": 2, "timer_late_ns": 2000 * D, "timer_late_max_ns": 1500 * D},
        {"gpu": "h1", "type": "qp", "peer": "h2", "link": "fabric", "packets_sent": 10, "retransmitted": 0}])
    write(tmp_path / "agents" / "h2.jsonl", [
        {**op, "gpu": "h2", "id": 0, "peer": "h1", "ready_ns": 0, "start_ns": 0, "end_ns": 3000 * D}])
    # leaf1-eth2 backlogged for 1 s (emulated: 50 MB waiting at its start, a second's worth at
    # 400 Mbit/s) and sent 25 MB = 200 Mbit: 50 %
    write(tmp_path / "queues.jsonl",
          queue_rows("leaf1-eth1", [(0, 0, 0, 0, 0, 0, 0), (10 ** 9, 0, 0, 5, 100, 1, 300)])
          + queue_rows("leaf1-eth2", [(0, 50_000_000, 0, 0, 0, 0, 500, 300),
                                      (10 ** 9, 25_000_500, 25_000_000, 0, 0, 0, 800, 700)])
          + queue_rows("leaf1-eth3", [(0, 0, 0, 0, 0, 0, 0), (10 ** 9, 0, 0, 0, 0, 0, 0)]))
    ports = []
    for intf, sent in (("leaf1-eth2", 3000), ("leaf1-eth3", 1000)):
        for t, b in ((0, 0), (10 ** 9, sent)):
            ports.append({"t_ns": t, "switch": "leaf1", "port": int(intf[-1]), "intf": intf, "tx_bytes": b,
                          "rx_bytes": 0, "tx_packets": 0, "rx_packets": 0})
    write(tmp_path / "ports.jsonl", ports)
    # polls through the training (0 to 120 us x D): the first covers what came before it
    write(tmp_path / "polls.jsonl", polls(((0, 0.2), (40_000 * D, 0.5), (80_000 * D, 0.99), (120_000 * D, 0.4))))
    return tmp_path


def polls(samples, ovs_cores=0.5, skipped=0):
    return [{"t_ns": t, "poll": i, "read_ns": 1, "skipped_total": skipped, "queues": 3, "host_busy": busy,
             "ovs_cpu_cores": ovs_cores} for i, (t, busy) in enumerate(samples)]


def test_kpis_worked_by_hand(run_dir):
    s = kpis.summary(results.load(run_dir))
    assert s["run"]["complete"] and s["jct"]["mean_ratio"] == 1.2
    (c,) = s["collectives"]["items"]
    # every member in at 0, the last out at 3 us: 2x its 1.5 us ideal
    assert c["time_ns"] == 3000 and c["ratio"] == 2.0
    # 1000 bytes in 3 us: algbw 2.67 Gb/s; an AllReduce of 2 ranks moves 2 (n - 1) / n = 1 x that per rank
    assert c["algbw_bps"] == pytest.approx(2.6667e9, rel=1e-4) and c["busbw_bps"] == pytest.approx(2.6667e9, rel=1e-4)
    assert s["ecn"]["marking_ratio"] == 5 / 100
    assert s["drops"]["packets"] == 1 and s["drops"]["ppm"] == pytest.approx(1 / 130 * 1e6)  # 110 + 10 + 10 offered
    assert s["queues"]["max_depth_bytes"] == 800 and s["queues"]["busiest_port"] == "leaf1-eth2"
    # where a queue sits while backlogged: the depth at the polls whose interval saw a backlog
    assert s["queues"]["median_backlogged_depth_bytes"] == (300 + 700) / 2
    assert s["queues"]["per_port"]["leaf1-eth1"]["backlogged_polls"] == 1
    assert s["queues"]["per_port"]["leaf1-eth3"]["backlogged_polls"] == 0
    assert s["ecmp"]["imbalance"] == 3000 / 2000  # max / mean of the two uplinks
    j = (8 + 8 / 3) ** 2 / (2 * (64 + 64 / 9))
    assert s["fairness"]["jain_mean"] == pytest.approx(j)
    # DCTCP K over a GPU-leaf-spine-leaf-GPU round trip at 400G: 2 x (2 x 100 + 2 x 200) ns
    # of cable plus an MTU serialised at each of 8 hops
    rtt = 2 * 600 + 8 * 4214 * 8 / 400e9 * 1e9
    assert s["references"]["dctcp_k_rtt_ns"] == pytest.approx(rtt)
    assert s["references"]["dctcp_k_bytes"] == int(400e9 * rtt / 1e9 / 8 / 7)
    json.dumps(s, default=kpis._plain)
    story = " ".join(summary_text.narrative(s))
    assert "trained 1 iteration. A step took 120us against an ideal of 100us (x1.20)" in story
    assert "while backlogged it sat at a median of 500B" in story
    assert "5 packets were CE-marked" in story and "1 packets were dropped" in story
    assert "busiest uplink carried x1.50 the mean" not in story  # 1.5 is not worth a sentence


def test_fidelity_names_every_failed_check_and_a_dilation_that_fixes_it(run_dir):
    f = fidelity.check(results.load(run_dir))
    by = {c["name"]: c for c in f["checks"]}
    assert by["dequeue_rate"]["value"] == 0.5 and not by["dequeue_rate"]["ok"]
    # 60 ns late over 1000 ns of line-rate gaps: 0.06 gaps, within 0.07; 20 ns slipped for good
    assert by["agent_pacing"]["value"] == 0.06 and by["agent_pacing"]["ok"]
    assert by["agent_pacing"]["detail"] == "10 packets, worst 30 ns late (emulated); schedule slipped 2.00% of line-rate time"
    # 1 us real lateness on average against a 100 us ideal step: 1 %, at the limit
    assert by["timer_lateness"]["value"] == 0.01 and by["timer_lateness"]["ok"]
    assert by["host_cpu"]["value"] == 0.333 and not by["host_cpu"]["ok"]
    assert by["ovs_cpu"]["ok"] and by["telemetry"]["ok"]
    assert f["verdict"] == "not trusted"
    # worst miss: host CPU (1/3 over 1/4, x2) -> 1000 x 2.67 x 1.5 = 4000 -> 5000
    assert f["suggested_dilation"] == 5000 and "--set dilation=5000" in f["text"]


def test_fidelity_counts_the_training_lost_to_reading_arrivals_late(run_dir):
    """h1's reads of the packets that completed its 4 messages were 1.2 ms late in all (the
    agents' clock) in a training of 120 us x D = 120 ms: 1 % of it waited for reads, at the
    limit; 2.4 ms is 2 %, not trusted, and the guard asks for twice the dilation with a
    margin. h2 received nothing and is not averaged in."""
    rows = [json.loads(line) for line in (run_dir / "agents" / "h1.jsonl").read_text().splitlines()]

    def with_reads(late_ns):
        nic = {"rx_done_count": 4, "rx_done_late_ns": late_ns, "rx_done_late_max_ns": late_ns // 2}
        write(run_dir / "agents" / "h1.jsonl", [{**r, **nic} if r["type"] == "nic" else r for r in rows])
        f = fidelity.check(results.load(run_dir))
        return f, {c["name"]: c for c in f["checks"]}["receive_lateness"]

    f, c = with_reads(1_200_000)
    assert c["value"] == 0.01 and c["ok"] and c["detail"] == "4 messages on 1 GPUs; worst h1 1.0%"
    f, c = with_reads(2_400_000)
    assert c["value"] == 0.02 and not c["ok"]
    # 2.4 ms over 4 reads: 600 us on the agents' clock, 600 ns real at D = 1000
    assert c["cause"] == ("GPU agents read what completed a message 600.0 ns (real) late on average: "
                          "2.0% of the training waited for reads")
    assert "2.0% of the training waited for reads" in f["text"]


def test_the_suggested_dilation_is_one_a_scenario_may_set(run_dir):
    """The same misses at D = 5000000: x2.67 x 1.5 would be 2e7, past the largest dilation a
    scenario accepts (1e7, which the next run would refuse); the guard suggests 1e7. At 1e7
    it has nothing larger to suggest and says the machine cannot run it trusted."""
    from testbed.config.scenario import MAX_DILATION

    for d, want in ((5_000_000, int(MAX_DILATION)), (int(MAX_DILATION), None)):
        m = json.loads((run_dir / "manifest.json").read_text())
        (run_dir / "manifest.json").write_text(json.dumps({**m, "dilation": d}))
        f = fidelity.check(results.load(run_dir))
        assert f["verdict"] == "not trusted" and f["suggested_dilation"] == want, f["text"]
    assert "Already at the largest dilation a scenario may set (10000000)" in f["text"]


def test_host_ovs_and_telemetry_checks_judge_the_training_not_bring_up_or_teardown(run_dir):
    """A saturated host, a saturated OVS thread and skipped polls before the first op (the
    all-pairs check) and after the last (teardown) do not touch the verdict of a trained
    run, unless a poll's interval overlaps the training; without ops the whole run is judged."""
    before = polls(((-2 * 10 ** 9, 1.0), (-10 ** 9, 1.0)), ovs_cores=1.4, skipped=3)
    during = polls(((40_000 * D, 0.5), (80_000 * D, 0.6)), skipped=3)
    after = polls(((10 ** 9, 1.0), (2 * 10 ** 9, 1.0)), ovs_cores=1.4, skipped=9)

    def checks(rows, **change):
        write(run_dir / "polls.jsonl", rows)
        r = replace(results.load(run_dir), **change)
        return {c["name"]: c for c in fidelity.check(r)["checks"]}, fidelity.judged_polls(r)

    # the last op ends at 120 us x D: the poll at 1 s covers (80 us x D, 1 s], the end of training
    by, judged = checks(before + during + after)
    assert list(judged.t_ns) == [40_000 * D, 80_000 * D, 10 ** 9]
    assert by["host_cpu"]["value"] == 0.333 and not by["host_cpu"]["ok"]
    assert not by["ovs_cpu"]["ok"] and by["telemetry"]["value"] == 6
    # a poll as the last op ends: teardown's polls are outside
    by, judged = checks(before + during + polls(((120_000 * D, 0.4),), skipped=3) + after)
    assert list(judged.t_ns) == [40_000 * D, 80_000 * D, 120_000 * D]
    assert by["host_cpu"]["value"] == 0 and by["ovs_cpu"]["ok"] and by["telemetry"]["value"] == 0
    # a run that did not train: every poll
    by, judged = checks(before + during + after, ops=pd.DataFrame())
    assert len(judged) == 6 and by["host_cpu"]["value"] == round(4 / 6, 3)
    assert not by["ovs_cpu"]["ok"] and by["telemetry"]["value"] == 9


def test_fidelity_checks_the_pfc_reaction_against_the_headroom_budget(run_dir):
    """At D = 1000 a 100 us (emulated) gap before the poll that sent an XOFF is 100 ns real,
    10 % of the 1 us response the headroom formula allows: trusted; 500 us is 50 %: not."""
    m = json.loads((run_dir / "manifest.json").read_text())
    pfc = {"xoff_polls": 3, "xoff_detect_max_ns": 100_000, "pause_apply_max_ns": 40_000}
    (run_dir / "manifest.json").write_text(json.dumps({**m, "pfc": pfc}))
    by = {c["name"]: c for c in fidelity.check(results.load(run_dir))["checks"]}
    assert by["pfc_reaction"]["value"] == 0.1 and by["pfc_reaction"]["ok"]
    (run_dir / "manifest.json").write_text(json.dumps({**m, "pfc": {**pfc, "pause_apply_max_ns": 500_000}}))
    f = fidelity.check(results.load(run_dir))
    by = {c["name"]: c for c in f["checks"]}
    assert by["pfc_reaction"]["value"] == 0.5 and not by["pfc_reaction"]["ok"]
    assert "500 ns (real)" in by["pfc_reaction"]["cause"]


def test_fidelity_says_when_the_host_reordered_a_flow(run_dir):
    """Out-of-order arrivals in a run that dropped nothing can only be the emulation's
    doing: not trusted. With a drop in the run they are the drop's gap: not judged."""
    rows = [json.loads(line) for line in (run_dir / "agents" / "h1.jsonl").read_text().splitlines()]
    for r in rows:
        if r["type"] == "qp":
            r["out_of_order_received"] = 3
    write(run_dir / "agents" / "h1.jsonl", rows)
    assert "reordering" not in {c["name"] for c in fidelity.check(results.load(run_dir))["checks"]}  # a drop
    queues = [json.loads(line) for line in (run_dir / "queues.jsonl").read_text().splitlines()]
    write(run_dir / "queues.jsonl", [{**q, "drops": 0} for q in queues])
    by = {c["name"]: c for c in fidelity.check(results.load(run_dir))["checks"]}
    assert by["reordering"]["value"] == 3 and not by["reordering"]["ok"]
    assert "3 packets arrived out of order" in by["reordering"]["cause"]


@pytest.mark.parametrize("x,want", [(0.3, 1), (1, 1), (1.01, 2), (3, 5), (7, 10), (4000, 5000), (20001, 50000)])
def test_nice_ceil(x, want):
    assert units.nice_ceil(x) == want


def test_an_interrupted_run_is_incomplete_and_says_why(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**m, "status": "interrupted", "reason": "SIGINT (Ctrl-C)"}))
    s = kpis.summary(results.load(run_dir))
    assert not s["run"]["complete"] and "SIGINT" in s["run"]["incomplete_because"]
    assert "INCOMPLETE" in summary_text.terminal(s)


def test_an_iteration_cut_short_stays_out_of_every_kpi(run_dir):
    """h2 never finished its send (an interrupted run): iteration 1 and its collective are
    incomplete, so there is no step time, no bus bandwidth above the line, and the
    summary and its sentences say so."""
    lines = (run_dir / "agents" / "h2.jsonl").read_text().splitlines()
    (run_dir / "agents" / "h2.jsonl").write_text("".join(line + "\n" for line in lines[1:]))
    m = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**m, "status": "interrupted", "reason": "SIGINT (Ctrl-C)"}))
    s = kpis.summary(results.load(run_dir))
    assert s["jct"]["iterations"] == [] and s["jct"]["incomplete_iterations"] == [0]
    assert "mean_ratio" not in s["jct"] and s["collectives"]["items"] == []
    assert not s["run"]["complete"] and "cut short: 0 of 1 iterations finished" in s["run"]["incomplete_because"]
    story = " ".join(summary_text.narrative(s))
    assert "The run was cut short: 0 iterations finished on every GPU; iteration 1 did not" in story


def test_sentences_fit_the_scenario_that_ran():
    """The default scenario's next step (remap the ring) is suggested after the default
    scenario only."""
    quiet = {"fabric": {"gpus": 8, "link_rates_bps": [400e9]}, "references": {"kmin_bytes": 100_000},
             "queues": {"max_depth_bytes": 9000, "busiest_port": "leaf1-eth1", "p95_depth_bytes": 8000},
             "ecn": {"marked_packets": 0}, "drops": {"packets": 0}, "pfc": {"pause_frames": 0}}
    default = " ".join(summary_text.narrative({**quiet, "run": {"scenario": "default"}}))
    other = " ".join(summary_text.narrative({**quiet, "run": {"scenario": "leaf-spine"}}))
    assert "No queue grew past Kmin" in default and "No queue grew past Kmin" in other
    assert "workload.mapping=sequential" in default and "workload.mapping" not in other


def test_report_page_and_compare_table(run_dir):
    r = results.load(run_dir)
    s = kpis.summary(r)
    page = report.render(r, s)
    assert page.startswith("<!DOCTYPE html>") and "<script src=" not in page
    assert 'id="plot-timeline"' in page and 'id="plot-queues"' in page and "NOT TRUSTED" in page
    header, rows = report.compare_rows([s, {**s, "run": {**s["run"], "run_id": "r2"}}])
    assert header == ["KPI", "r1", "r2"] and rows[0][0] == "scenario"
    assert ["JCT ratio (measured / ideal)", "1.200", "1.200"] in rows


def test_progress_counts_ops_as_they_are_written(tmp_path):
    ops = {"h1": [SimpleNamespace(iteration=0), SimpleNamespace(iteration=1)],
           "h2": [SimpleNamespace(iteration=0), SimpleNamespace(iteration=1)]}
    out = io.StringIO()
    p = Progress(ops, tmp_path, iterations=2, out=out)
    rec = {"type": "op", "kind": "send", "phase": "dp"}
    (tmp_path / "h1.jsonl").write_text(json.dumps({**rec, "iteration": 0}) + "\n" + '{"type": "op", "iter')
    p.tick()
    assert p.done == 1 and p.iterations_done == 0 and out.getvalue() == ""
    with open(tmp_path / "h2.jsonl", "w") as f:
        f.write(json.dumps({**rec, "iteration": 0}) + "\n")
    p.tick()
    assert p.iterations_done == 1 and "iteration 1/2 done on every GPU (2/4 ops)" in out.getvalue()
    assert "50%" in p.line() and "dp sends" in p.line()


def test_progress_bar_on_a_terminal_is_redrawn_and_ended(tmp_path):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress({"h1": [SimpleNamespace(iteration=0), SimpleNamespace(iteration=0)]}, tmp_path, iterations=1,
                 out=out)
    (tmp_path / "h1.jsonl").write_text(json.dumps({"type": "op", "kind": "compute", "phase": "forward",
                                                   "iteration": 0}) + "\n")
    p.tick()
    assert out.getvalue().startswith("\rtraining [###############...............]  50%") and "forward" in out.getvalue()
    assert not out.getvalue().endswith("\n")
    p.close()  # training ended early: the bar gets its newline
    assert out.getvalue().endswith("\n")


def test_dequeue_rate_is_measured_against_the_rate_in_force():
    """A port slowed by a link event to a quarter sends a quarter: that is the rate working,
    not OVS falling behind; an interval across the change is left out (pandas through its
    one importer, analysis.results)."""
    ms = 1_000_000
    rows = [{"t_ns": t * ms, "intf": "leaf1-eth5", "tbf_backlog_bytes": 5000, "tbf_sent_bytes": sent,
             "emulated_rate_now_bps": rate, "emulated_rate_bps": 8e6}
            for t, sent, rate in ((0, 0, 8e6), (1, 1000, 8e6), (2, 1250, 2e6), (3, 1500, 2e6))]
    r = SimpleNamespace(queues=results.pd.DataFrame(rows), pfc_events=results.pd.DataFrame())
    check = fidelity.dequeue_rate(r)
    assert check["value"] == 1.0 and check["ok"]
    # against the plan's rate alone (a run from before the column) the slowed port looks slow
    old = SimpleNamespace(queues=r.queues.drop(columns="emulated_rate_now_bps"), pfc_events=r.pfc_events)
    assert not fidelity.dequeue_rate(old)["ok"]


def test_dequeue_rate_leaves_out_an_interval_a_small_backlog_could_drain_in():
    """A backlog seen at two polls is not a port busy between them: 500 B drains in 0.5 ms at
    8 Mbit/s, so a 1 ms interval starting with it says nothing about the port's rate; one
    starting with 1000 B or more does."""
    ms = 1_000_000
    rows = [{"t_ns": t * ms, "intf": "leaf1-eth5", "tbf_backlog_bytes": b, "tbf_sent_bytes": sent,
             "emulated_rate_bps": 8e6} for t, b, sent in ((0, 500, 0), (1, 500, 500), (2, 1000, 1000))]
    r = SimpleNamespace(queues=results.pd.DataFrame(rows), pfc_events=results.pd.DataFrame())
    assert fidelity.dequeue_rate(r) is None
    rows.append({**rows[-1], "t_ns": 3 * ms, "tbf_sent_bytes": 1900})
    r = SimpleNamespace(queues=results.pd.DataFrame(rows), pfc_events=results.pd.DataFrame())
    assert fidelity.dequeue_rate(r)["value"] == 0.9


def test_fidelity_fails_a_cluster_run_whose_clock_error_outgrows_a_tenth_of_an_mtu(run_dir):
    """A run across servers: the worst server's clock error (real), dilated, against a tenth
    of one MTU's serialisation on the fastest link. A single-machine run has no such check."""
    from testbed.model import placement

    assert "cluster_clock" not in {c["name"] for c in fidelity.check(results.load(run_dir))["checks"]}
    plan = json.loads((run_dir / "plan.json").read_text())
    for lk in plan["links"]:
        lk["rate_bps"] = 400e9
    (run_dir / "plan.json").write_text(json.dumps(plan))
    m = json.loads((run_dir / "manifest.json").read_text())
    budget_real_ns = placement.clock_budget_ns(400e9) * D  # 8.4 ns emulated at 400G
    within = {"b": {"offset_ns": 10**12, "error_ns": round(0.5 * budget_real_ns)}, "c": {"offset_ns": 0, "error_ns": 1}}
    (run_dir / "manifest.json").write_text(json.dumps({**m, "cluster": {"clocks": within}}))
    by = {c["name"]: c for c in fidelity.check(results.load(run_dir))["checks"]}
    assert by["cluster_clock"]["ok"] and by["cluster_clock"]["value"] == 0.5
    over = {**within, "c": {"offset_ns": -5, "error_ns": round(3 * budget_real_ns)}}
    (run_dir / "manifest.json").write_text(json.dumps({**m, "cluster": {"clocks": over}}))
    f = fidelity.check(results.load(run_dir))
    by = {c["name"]: c for c in f["checks"]}
    assert not by["cluster_clock"]["ok"] and by["cluster_clock"]["value"] == 3.0
    assert "the clock offset of c is known to" in by["cluster_clock"]["cause"] and f["verdict"] == "not trusted"
    assert f["suggested_dilation"] >= 3 * D


def test_fidelity_judges_every_servers_polls_of_a_cluster_run(run_dir):
    """The host, OVS and telemetry checks judge each server's own polls (a cluster run keeps
    the others' in servers/SERVER/polls.jsonl); a saturated other server fails the run by name."""
    during = [(40_000 * D, 0.5), (80_000 * D, 0.5), (120_000 * D, 0.5)]
    write(run_dir / "polls.jsonl", polls(during, ovs_cores=0.2))
    by = {c["name"]: c for c in fidelity.check(results.load(run_dir))["checks"]}
    assert by["host_cpu"]["ok"] and "this machine" not in by["host_cpu"]["detail"]  # one machine: as before
    (run_dir / "servers" / "10.0.0.2").mkdir(parents=True)
    write(run_dir / "servers" / "10.0.0.2" / "polls.jsonl", polls(during, ovs_cores=0.3, skipped=2))
    by = {c["name"]: c for c in fidelity.check(results.load(run_dir))["checks"]}
    assert by["host_cpu"]["ok"] and by["ovs_cpu"]["value"] == 0.3 and by["ovs_cpu"]["detail"] == "10.0.0.2"
    assert not by["telemetry"]["ok"] and by["telemetry"]["cause"].startswith("10.0.0.2: the collector skipped 2 polls")
    write(run_dir / "servers" / "10.0.0.2" / "polls.jsonl", polls([(t, 1.0) for t, _ in during], ovs_cores=0.3))
    f = fidelity.check(results.load(run_dir))
    by = {c["name"]: c for c in f["checks"]}
    assert not by["host_cpu"]["ok"] and by["host_cpu"]["cause"].startswith("10.0.0.2: every CPU core was busy")
    assert f["verdict"] == "not trusted" and "10.0.0.2: every CPU core was busy" in f["text"]
