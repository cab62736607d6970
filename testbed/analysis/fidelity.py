"""The fidelity guard: can this run's numbers be trusted? Every run checks that the
emulation kept up with the time dilation it was given:

- ``dequeue_rate``: switch ports with a standing backlog must send at their configured
  (emulated) rate, judged over the poll intervals whose starting backlog alone outlasts the
  interval (so the port had work throughout); a slower port means OVS or the kernel could not keep up and every
  queue, mark and pause downstream of it is wrong;
- ``agent_pacing``: GPU agents' packets leave close to when they are due (mean lateness
  in packet gaps at line rate): late packets mean the agents cannot pace at this dilation.
  Its limit is calibrated against the same run five times slower: on the default ring a
  mean of 0.03 / 0.13 / 0.37 gaps came with collectives 0.4 / 3 / 10 % slower than at
  D = 250000, and on rail-32 0.048 gaps came with 2 %, so the limit is 0.07 gaps
  (docs/measurements.md, "The fidelity guard against a slower run"); the detail says how much of the sending time the
  agents' schedule slipped for good (wake-ups later than the two-packet catch-up);
- ``receive_lateness``: what completed a message is read soon after it arrived (the
  kernel's receive timestamp against the loop's read): every op that waits for a message
  (the next ring step, a pipeline stage) starts that much late, so each GPU's summed
  lateness of such reads, as a share of the training's duration, is time the run lost
  to the agents and not to the fabric (mean over the GPUs that received); a ring whose
  chunks are a packet or two loses it on every step while its packets leave on time;
- ``timer_lateness``: compute phases end when they should (mean lateness, real-fabric
  time, as a share of the ideal step);
- ``host_cpu``: the host's CPUs were not saturated (share of polls with every core busy);
- ``ovs_cpu``: ovs-vswitchd (whose userspace datapath forwards on one thread) was not
  saturated (p95 of its CPU use in cores);
- ``telemetry``: the collector missed no poll;

  these three judge each server of a cluster run (its own polls: its CPUs, its
  ovs-vswitchd, its share's collector) and report the worst; they judge the polls of the training (from the first op ready to the last op
  ended) when the run trained, the whole run otherwise: bring-up, the all-pairs check (every
  GPU starting a probe process at once) and teardown load the host but time nothing a
  trained run reports;
- ``reordering``: in a run where no queue dropped a packet and each QP keeps one path
  (``load_balancing: flow``, ECMP routing), no packet of a flow arrived out of order (flow-hashed
  ECMP keeps a flow on one path, so only the emulation can
  reorder it: a busy host delivering one flow through two CPUs' backlogs); each such
  arrival costs a go-back-N retransmission a real fabric would not have;
- ``cluster_clock``: a run across servers started every server's GPUs on one deadline, each
  shifted by its measured clock offset; the offset's error (half the best round trip),
  dilated, must stay within a tenth of one MTU's serialisation on the fastest link, or
  GPUs on different servers start (and their records line up) further apart than the
  shortest event the fabric times;
- ``pfc_reaction``: the PFC process saw a queue cross XOFF and applied a received pause
  within a quarter of the peer response time the headroom formula budgets (1 us real):
  a slower emulated reaction lets more bytes in after XOFF than a real switch would.

A failed check names its cause and the dilation that would fix it: the current one
scaled by how far the check missed, with a margin, rounded up to 1/2/5 x 10^k.
Pure: reads a ``results.Results``.
"""

from __future__ import annotations

from dataclasses import replace

from testbed import units
from testbed.config.scenario import MAX_DILATION
from testbed.model import placement, queues

LIMITS = {
    "dequeue_rate": 0.9,  # achieved / configured, at least
    "agent_pacing": 0.07,  # mean lateness in line-rate packet gaps, at most (calibrated: see above)
    "receive_lateness": 0.01,  # summed lateness of message-completing reads / training duration, GPU mean, at most
    "timer_lateness": 0.01,  # mean compute-end lateness / ideal step, at most
    "host_cpu": 0.25,  # share of polls with the host >= SATURATED busy, at most
    "ovs_cpu": 0.95,  # p95 of ovs-vswitchd CPU in cores, at most
    "telemetry": 0,  # polls skipped, at most
    "reordering": 0,  # out-of-order arrivals of a flow in a run without drops, at most
    "pfc_reaction": 0.25,  # the emulation's PFC reaction (real) / the headroom formula's response time, at most
    "cluster_clock": 1.0,  # worst server clock error (emulated) / a tenth of an MTU at the fastest link, at most
}
SATURATED = 0.98
MARGIN = 1.5


def _check(name, value, ok, cause, factor=None, detail=""):
    return {"name": name, "value": value, "limit": LIMITS[name], "ok": bool(ok), "cause": "" if ok else cause,
            "detail": detail, "_factor": factor}


def dequeue_rate(r) -> dict | None:
    q = r.queues
    # the rate in force at each sample (a link event may slow a port); older runs: the plan's
    rate_col = "emulated_rate_now_bps" if "emulated_rate_now_bps" in q else "emulated_rate_bps"
    if q.empty or "tbf_backlog_bytes" not in q or rate_col not in q:
        return None
    paused = _paused_spans(r)
    sent = capacity = 0.0
    ports = set()
    for intf, g in q.sort_values("t_ns").groupby("intf"):
        rows = g[["t_ns", "tbf_backlog_bytes", "tbf_sent_bytes", rate_col]].to_numpy()
        for (t0, b0, s0, rate), (t1, b1, s1, rate1) in zip(rows[:-1], rows[1:]):
            # busy for the whole interval only if the backlog at its start could not drain in it
            # (arrivals only add): a small backlog seen at both polls may have drained in between
            if (b1 <= 0 or b0 * 8 < rate * (t1 - t0) / 1e9 or rate1 != rate
                    or any(a < t1 and b > t0 for a, b in paused.get(intf, ()))):
                continue
            sent += (s1 - s0) * 8
            capacity += rate * (t1 - t0) / 1e9
            ports.add(intf)
    if capacity <= 0:
        return None
    ratio = sent / capacity
    ok = ratio >= LIMITS["dequeue_rate"]
    return _check("dequeue_rate", round(float(ratio), 4), ok,
                  f"backlogged switch ports sent at {ratio:.0%} of their configured rate: ovs-vswitchd or the "
                  f"kernel could not keep up", LIMITS["dequeue_rate"] / max(ratio, 1e-3),
                  f"{len(ports)} ports had a standing backlog")


def _paused_spans(r) -> dict:
    spans: dict[str, list] = {}
    ev = r.pfc_events
    if ev.empty or "event" not in ev:
        return spans
    open_at: dict[str, int] = {}
    for row in ev.sort_values("t_ns").to_dict("records"):
        if row.get("event") == "paused":
            open_at[row["port"]] = row["t_ns"]
        elif row.get("event") == "resumed" and row["port"] in open_at:
            spans.setdefault(row["port"], []).append((open_at.pop(row["port"]), row["t_ns"]))
    for port, t in open_at.items():
        spans.setdefault(port, []).append((t, float("inf")))
    return spans


def agent_pacing(r) -> dict | None:
    n = r.nics
    if n.empty or "tx_gap_ns" not in n or not n.tx_gap_ns.sum():
        return None
    late = n.tx_late_ns.sum() / n.tx_gap_ns.sum()
    ok = late <= LIMITS["agent_pacing"]
    slip = f"; schedule slipped {n.tx_slip_ns.sum() / n.tx_gap_ns.sum():.2%} of line-rate time" if "tx_slip_ns" in n else ""
    return _check("agent_pacing", round(float(late), 4), ok,
                  f"GPU agents sent packets {late:.2f} packet gaps late on average: they cannot pace at this "
                  f"dilation", late / LIMITS["agent_pacing"],
                  f"{int(n.tx_count.sum())} packets, worst {int(n.tx_late_max_ns.max())} ns late (emulated){slip}")


def training_span(ops) -> tuple:
    """(first op ready, last op ended), CLOCK_MONOTONIC ns of the agents."""
    return ops.ready_ns.min(), ops.end_ns.max()


def receive_lateness(r) -> dict | None:
    n, ops = r.nics, r.ops
    if n.empty or "rx_done_count" not in n or not n.rx_done_count.sum() or ops.empty:
        return None
    t0, t1 = training_span(ops)
    span_ns = float(t1 - t0)  # the agents' clock, as the lateness
    if span_ns <= 0:
        return None
    got = n[n.rx_done_count.fillna(0) > 0]
    shares = got.rx_done_late_ns / span_ns
    share = float(shares.mean())
    ok = share <= LIMITS["receive_lateness"]
    mean_real_ns = r.dilation.real_duration_ns(got.rx_done_late_ns.sum() / got.rx_done_count.sum())
    worst = got.loc[shares.idxmax()]
    return _check("receive_lateness", round(share, 5), ok,
                  f"GPU agents read what completed a message {mean_real_ns:.1f} ns (real) late on average: "
                  f"{share:.1%} of the training waited for reads", share / LIMITS["receive_lateness"],
                  f"{int(got.rx_done_count.sum())} messages on {len(got)} GPUs; worst {worst.gpu} "
                  f"{shares.max():.1%}")


def timer_lateness(r) -> dict | None:
    n, its = r.nics, r.iterations
    if n.empty or "timer_count" not in n or not n.timer_count.sum() or its.empty:
        return None
    mean_real_ns = r.dilation.real_duration_ns(n.timer_late_ns.sum() / n.timer_count.sum())
    share = mean_real_ns / float(its.ideal_ns.iloc[0])
    ok = share <= LIMITS["timer_lateness"]
    return _check("timer_lateness", round(float(share), 5), ok,
                  f"compute phases ended {mean_real_ns:.0f} ns (real) late on average, {share:.1%} of a step",
                  share / LIMITS["timer_lateness"], f"{int(n.timer_count.sum())} compute phases")


def judged_polls(r):
    """The polls the host, OVS and telemetry checks judge: each whose interval overlaps the
    training (first op ready to last op end, CLOCK_MONOTONIC like the polls) when the run
    trained; every poll otherwise, and also when no poll overlaps the training (a training
    shorter than one poll interval: judging nothing would pass a run unjudged)."""
    p, ops = r.polls, r.ops
    if p.empty or ops.empty or "t_ns" not in p:
        return p
    p = p.sort_values("t_ns")
    t0, t1 = training_span(ops)
    inside = p[(p.t_ns > t0) & (p.t_ns.shift(1, fill_value=t0 - 1) < t1)]
    return inside if not inside.empty else p


def host_cpu(r) -> dict | None:
    p = judged_polls(r)
    if p.empty or "host_busy" not in p or p.host_busy.isna().all():
        return None
    share = float((p.host_busy.dropna() >= SATURATED).mean())
    ok = share <= LIMITS["host_cpu"]
    return _check("host_cpu", round(share, 3), ok,
                  f"every CPU core was busy in {share:.0%} of the polls: the host is saturated",
                  max(1.0, share / LIMITS["host_cpu"]) * 2, f"mean busy {p.host_busy.mean():.0%}")


def ovs_cpu(r) -> dict | None:
    p = judged_polls(r)
    if p.empty or "ovs_cpu_cores" not in p or p.ovs_cpu_cores.isna().all():
        return None
    p95 = float(p.ovs_cpu_cores.dropna().quantile(0.95))
    ok = p95 <= LIMITS["ovs_cpu"]
    return _check("ovs_cpu", round(p95, 3), ok,
                  f"ovs-vswitchd used {p95:.2f} cores (p95): its forwarding thread is saturated",
                  p95 / LIMITS["ovs_cpu"] * 2, "")


def telemetry_loss(r) -> dict | None:
    every, p = r.polls, judged_polls(r)
    if p.empty:
        return None
    before = every[every.t_ns < p.t_ns.min()].skipped_total  # the counter is cumulative
    skipped = int(p.skipped_total.max() - (before.max() if len(before) else 0))
    return _check("telemetry", skipped, skipped <= LIMITS["telemetry"],
                  f"the collector skipped {skipped} polls: it fell behind", 2.0, f"{len(p)} polls")


def reordering(r) -> dict | None:
    q, qps = r.queues, r.qps
    if qps.empty or "out_of_order_received" not in qps or q.empty:
        return None
    last = q.sort_values("t_ns").groupby("intf").tail(1)  # the counters are cumulative
    if int(last.drops.sum()) or any(c in last and int(last[c].fillna(0).sum()) for c in ("tbf_drops", "trimmed")):
        return None  # after a dropped (or trimmed) packet the next ones arrive "out of order": nothing to tell apart
    if r.plan is None:
        return None
    if r.plan.training and r.plan.training.transport.load_balancing != "flow":
        return None  # spraying and flowlets send a QP's packets over several paths: they reorder
    if r.plan.routing == "adaptive":
        return None  # so does adaptive routing: each packet takes the least occupied port
    if r.extra.get("link_events"):
        return None  # a link went down: what was on it is lost, and rerouted flows change path mid-stream
    n = int(qps.out_of_order_received.fillna(0).sum())
    lost = int(r.nics.udp_receive_errors.fillna(0).sum()) if "udp_receive_errors" in r.nics else 0
    cause = (f"the GPUs' receive sockets dropped {lost} packets (an agent did not read in time)" if lost else
             "the host reordered them")
    return _check("reordering", n, n <= LIMITS["reordering"],
                  f"{n} packets arrived out of order on a fabric that dropped none: {cause} "
                  f"(each cost a go-back-N retransmission)", 2.0, f"{len(qps)} queue pairs")


def pfc_reaction(r) -> dict | None:
    p = r.manifest.get("pfc") or {}
    if not p.get("xoff_polls"):
        return None
    worst_real_ns = r.dilation.real_duration_ns(max(p.get("xoff_detect_max_ns", 0), p.get("pause_apply_max_ns", 0)))
    share = worst_real_ns / queues.PFC_RESPONSE_NS
    ok = share <= LIMITS["pfc_reaction"]
    return _check("pfc_reaction", round(share, 3), ok,
                  f"the PFC process took up to {worst_real_ns:.0f} ns (real) to see a queue pass XOFF or to apply a "
                  f"pause, {share:.0%} of the {queues.PFC_RESPONSE_NS} ns response the headroom formula allows",
                  share / LIMITS["pfc_reaction"], f"{p['xoff_polls']} XOFF decisions")


def cluster_clock(r) -> dict | None:
    clocks = (r.manifest.get("cluster") or {}).get("clocks")
    links = [lk.rate_bps for lk in r.plan.fabric_links] if r.plan else []
    if not clocks or not links:
        return None
    server, worst = max(((s, c["error_ns"]) for s, c in clocks.items()), key=lambda x: x[1])
    budget_ns = placement.clock_budget_ns(max(links))
    worst_real_ns = r.dilation.real_duration_ns(worst)
    share = worst_real_ns / budget_ns
    ok = share <= LIMITS["cluster_clock"]
    return _check("cluster_clock", round(share, 3), ok,
                  f"the clock offset of {server} is known to +-{worst / 1e3:.1f} us (real), {worst_real_ns:.2f} ns emulated: "
                  f"more than a tenth of an MTU's serialisation ({budget_ns:.2f} ns) at {max(links) / 1e9:g}G",
                  share / LIMITS["cluster_clock"], f"{len(clocks)} other servers")


def each_server(check):
    """``check`` on this machine's polls and on each other server's of a cluster run; the
    failed one (else the highest value), its cause and detail naming the server."""

    def judged(r):
        hosts = [("this machine", r.polls), *sorted(r.server_polls.items())]
        done = [(name, c) for name, c in ((n, check(replace(r, polls=p))) for n, p in hosts) if c is not None]
        if not done:
            return None
        if not r.server_polls:
            return done[0][1]
        name, worst = max(done, key=lambda nc: (not nc[1]["ok"], nc[1]["_factor"] or 0, nc[1]["value"]))
        return {**worst, "cause": f"{name}: {worst['cause']}" if worst["cause"] else "",
                "detail": "; ".join(x for x in (name, worst["detail"]) if x)}

    judged.__name__ = check.__name__
    return judged


CHECKS = (dequeue_rate, agent_pacing, receive_lateness, timer_lateness, each_server(host_cpu), each_server(ovs_cpu),
          each_server(telemetry_loss), reordering, pfc_reaction, cluster_clock)


def check(r) -> dict:
    """Every check that has data; verdict ``trusted``, ``not trusted`` or ``unchecked``."""
    done = [c for c in (f(r) for f in CHECKS) if c is not None]
    failed = [c for c in done if not c["ok"]]
    d = r.dilation.factor
    suggested = None
    if failed:
        factor = max(c["_factor"] or 2.0 for c in failed)
        # never past what a scenario may set (config.scenario.MAX_DILATION): a suggestion the
        # next run refuses is no suggestion
        suggested = min(units.nice_ceil(r.dilation.scaled(max(factor, 1.0) * MARGIN)), int(MAX_DILATION))
        suggested = suggested if suggested > d else None
    for c in done:
        c.pop("_factor")
    verdict = "unchecked" if not done else ("not trusted" if failed else "trusted")
    if failed:
        why = "; ".join(c["cause"] for c in failed)
        text = (f"NOT TRUSTED: {why}. Rerun with a larger dilation: --set dilation={suggested} (now {r.dilation})."
                if suggested else f"NOT TRUSTED: {why}. Already at the largest dilation a scenario may set "
                f"({r.dilation}): this machine cannot run it trusted; a smaller fabric or workload can.")
    elif done:
        text = f"trusted: {len(done)} checks passed ({', '.join(c['name'] for c in done)})"
    else:
        text = "unchecked: the run collected nothing to check"
    return {"verdict": verdict, "text": text, "checks": done, "suggested_dilation": suggested, "dilation": d}
