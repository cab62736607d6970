"""A run's summary in words: the KPI table rows, the "what happened" sentences and the
end-of-run terminal text, from ``summary.json`` (``analysis.kpis`` computes it; this
module only presents it)."""

from __future__ import annotations

from testbed import units
from testbed.analysis import failures

# the next experiment on the default scenario, when its rail-aligned ring congests nothing
DEFAULT_NEXT_STEP = ("; a mapping whose ring crosses the spines congests it (--set workload.mapping=sequential, "
                     "then testbed compare the two runs).")


def kpi_rows(s: dict) -> list[tuple[str, str, str]]:
    """(KPI, measured, reference) rows of a summary, formatted in real units."""
    rows = []
    jct = s.get("jct", {})
    if jct.get("iterations"):
        rows.append(("JCT (mean step time)", units.format_duration(jct["mean_step_ns"]),
                     f"ideal {units.format_duration(jct['ideal_step_ns'])}"))
        rows.append(("JCT ratio (measured / ideal)", f"{jct['mean_ratio']:.3f}", "1.000 = the analytical ideal"))
    for name, j in (s.get("jobs") or {}).items():
        alone = j.get("interference")
        rows.append((f"job {name}: JCT", units.format_duration(j["jct_ns"]) if j.get("jct_ns") else "incomplete",
                     (f"x{alone:.2f} its JCT alone ({units.format_duration(j['jct_alone_ns'])}): the interference"
                      if alone else f"{len(j['gpus'])} GPUs, {j['iterations']} iterations (--isolate-baseline "
                                    f"measures the interference)")))
    for phase, c in s.get("collectives", {}).items():
        if phase == "items":
            continue
        rows.append((f"{phase} collectives: time / ideal", f"mean {c['mean_ratio']:.3f}, max {c['max_ratio']:.3f}",
                     f"{c['count']} collectives"))
        if c.get("mean_busbw_bps"):
            line = max(s.get("fabric", {}).get("link_rates_bps") or [0])
            rows.append((f"{phase} bus bandwidth (busbw)", units.format_rate(c["mean_busbw_bps"]),
                         f"link {units.format_rate(line)}" if line else ""))
    e = s.get("ecn", {})
    if "marking_ratio" in e:
        rows.append(("ECN marking ratio", f"{e['marking_ratio']:.3g}",
                     f"{e['marked_packets']} of {e['ect_packets']} ECT packets marked CE"))
    d = s.get("drops", {})
    if d:
        rows.append(("Drops", f"{d['packets']} ({d['ppm']:.1f} ppm)", f"of {d['offered_packets']} packets"))
        if d.get("trimmed_packets"):
            rows.append(("Trimmed packets (cut to headers, NACKed)", f"{d['trimmed_packets']}",
                         f"{s.get('transport', {}).get('nacks_sent', 0)} NACKs sent by receivers"))
    p = s.get("pfc", {})
    if p.get("enabled"):
        rows.append(("PFC pause frames (XOFF)", f"{p['pause_frames']} ({p['xoff_frames']})",
                     f"{len(p['paused_ports'])} ports paused"))
        rows.append(("PFC paused time (real, all ports)", units.format_duration(p["paused_real_ns"]), ""))
        ref = s.get("references", {})
        kinds = ref.get("pfc_headroom_per_port_kind") or {}
        rows.append(("PFC headroom high-water", units.format_size(p["headroom_high_water_bytes"]) +
                     (f" on {p['headroom_high_water_port']}" if p.get("headroom_high_water_port") else ""),
                     f"{ref.get('pfc_headroom_port', 'its port')}: headroom "
                     f"{units.format_size(ref.get('pfc_headroom_configured_bytes') or 0)} "
                     f"(formula {units.format_size(ref.get('pfc_headroom_formula_bytes') or 0)})" +
                     "".join(f"; {k.replace('_', ' ')} {units.format_size(v['formula_bytes'])}"
                             for k, v in kinds.items())))
    else:
        rows.append(("PFC", "off", ""))
    q = s.get("queues", {})
    if q:
        ref = s.get("references", {})
        rows.append(("Queue depth p95 / max (worst port)",
                     f"{units.format_size(q['p95_depth_bytes'])} / {units.format_size(q['max_depth_bytes'])}",
                     f"Kmin {units.format_size(ref['kmin_bytes']) if ref.get('kmin_bytes') is not None else 'off (ECN off)'}"
                     f"; DCTCP K > C x RTT / 7 = "
                     f"{units.format_size(ref.get('dctcp_k_bytes') or 0)}"))
        if q.get("median_backlogged_depth_bytes"):
            rows.append(("Queue depth while backlogged (median)", units.format_size(q["median_backlogged_depth_bytes"]),
                         f"{q['busiest_port']}, {q['per_port'][q['busiest_port']]['backlogged_polls']} backlogged "
                         f"polls"))
    rows += _load_balancing_rows(s.get("ecmp", {}))
    f = s.get("fairness", {})
    if f:
        rows.append(("Jain fairness of concurrent flows", f"mean {f['jain_mean']:.3f}, min {f['jain_min']:.3f}",
                     "1.000 = equal shares"))
    t = s.get("transport", {})
    if t:
        rows.append(("Retransmitted packets / timeouts / NAKs",
                     f"{t.get('retransmitted', 0)} / {t.get('timeouts', 0)} / {t.get('naks_sent', 0)}",
                     f"of {t.get('packets_sent', 0)} sent"))
        rows.append(("CNPs sent / DCQCN rate cuts", f"{t.get('cnps_sent', 0)} / {t.get('dcqcn_cuts', 0)}", ""))
        if "out_of_order_ratio" in t:
            rows.append(("Out-of-order arrivals / retransmitted bytes",
                         f"{t['out_of_order_ratio']:.2%} / {units.format_size(t.get('retransmitted_bytes', 0))}",
                         f"of {t.get('packets_received', 0)} data packets received"))
    return rows




def narrative(s: dict) -> list[str]:
    """What happened, in a few sentences a newcomer can follow (the numbers are the KPIs')."""
    out = []
    fmt_d, fmt_s, fmt_r = units.format_duration, units.format_size, units.format_rate
    jct, ref = s.get("jct", {}), s.get("references", {})
    ideal = ref.get("ideal", {})
    cut = jct.get("incomplete_iterations") or []
    if cut:
        done = len(jct.get("iterations", []))
        out.append(f"The run was cut short: {done} iteration{'' if done == 1 else 's'} finished on every GPU; "
                   f"iteration {', '.join(str(i + 1) for i in cut)} did not and is left out of every number below.")
    if jct.get("iterations"):
        n = len(jct["iterations"])
        out.append(f"{s['fabric']['gpus']} GPUs trained {n} iteration{'' if n == 1 else 's'}. A step took "
                   f"{fmt_d(jct['mean_step_ns'])} against an ideal of {fmt_d(jct['ideal_step_ns'])} (x"
                   f"{jct['mean_ratio']:.2f}): {fmt_d(ideal.get('compute_ns', 0))} of compute, then the "
                   f"synchronisation, when every GPU sends at once.")
    dp = s.get("collectives", {}).get("dp")
    line = max(s.get("fabric", {}).get("link_rates_bps") or [0])
    if dp and line:
        out.append(f"The data-parallel collectives ran at {fmt_r(dp['mean_busbw_bps'])} of bus bandwidth, "
                   f"{dp['mean_busbw_bps'] / line:.0%} of the {fmt_r(line)} links (x{dp['mean_ratio']:.2f} their "
                   f"ideal time).")
    q, e, d, p, t = (s.get(k, {}) for k in ("queues", "ecn", "drops", "pfc", "transport"))
    kmin = ref.get("kmin_bytes")
    ecn_on = kmin is not None
    if q:
        quiet = (not e.get("marked_packets") and not d.get("packets") and not p.get("pause_frames")
                 and (not ecn_on or q["max_depth_bytes"] <= kmin))
        if not ecn_on:
            out.append(f"ECN is off: queues reached {fmt_s(q['max_depth_bytes'])} on {q['busiest_port']} and nothing "
                       f"told the senders to slow down" + (f"; PFC sent {p['pause_frames']} pause frames"
                                                         if p.get("pause_frames") else "") +
                       (f"; {d['packets']} packets were dropped" if d.get("packets") else "") + ".")
        elif quiet:
            out.append(f"No queue grew past Kmin ({fmt_s(kmin)}; deepest {fmt_s(q['max_depth_bytes'])}): no ECN "
                       f"marks, no drops, no PFC pauses. The burst fits this fabric with this rank mapping"
                       + (DEFAULT_NEXT_STEP if s.get("run", {}).get("scenario") == "default" else "."))
        else:
            parts = [f"Queues reached {fmt_s(q['max_depth_bytes'])} on {q['busiest_port']} (Kmin {fmt_s(kmin)}, "
                     f"p95 {fmt_s(q['p95_depth_bytes'])}; while backlogged it sat at a median of "
                     f"{fmt_s(q.get('median_backlogged_depth_bytes', 0))})"]
            if e.get("marked_packets"):
                parts.append(f"{e['marked_packets']} packets were CE-marked, the receivers answered with "
                             f"{t.get('cnps_sent', 0)} CNPs and DCQCN cut sender rates {t.get('dcqcn_cuts', 0)} "
                             f"times")
            if p.get("pause_frames"):
                parts.append(f"{p['pause_frames']} PFC pause frames stopped upstream ports for "
                             f"{fmt_d(p['paused_real_ns'])} in all")
            if d.get("packets"):
                parts.append(f"{d['packets']} packets were dropped and {t.get('retransmitted', 0)} retransmitted")
            out.append("; ".join(parts) + ".")
    m = s.get("ecmp", {})
    spread = (m.get("load_balancing", "flow") != "flow" or m.get("qps_per_connection", 1) > 1
              or m.get("routing") == "adaptive")
    if m.get("imbalance") and m["imbalance"] > 1.5 and not spread:
        out.append(f"ECMP hashes whole flows onto uplinks: with a few large flows (one queue pair per ring "
                   f"neighbour) a leaf's busiest uplink carried x{m['imbalance']:.2f} the mean.")
    elif m.get("imbalance") and spread:
        qps = m.get("qps_per_connection", 1)
        out.append(("Adaptive routing (each data packet to the least occupied port), " if m.get("routing") == "adaptive"
                    else "") +
                   f"load balancing {m['load_balancing']} with {qps} queue pair{'' if qps == 1 else 's'} per "
                   f"connection: a leaf's busiest uplink carried x{m['imbalance']:.2f} the mean"
                   + (f"; {t['out_of_order_ratio']:.1%} of data packets arrived out of order" if
                      t.get("out_of_order_ratio") else "") + ".")
    if s.get("link_events"):
        out.append(failures.sentence(s["link_events"], t, fmt_d))
    return out



def _load_balancing_rows(m: dict) -> list:
    """The uplink-load rows: MMR, adaptive routing's decisions, Jain of uplink loads."""
    rows: list = []
    if m.get("imbalance") is not None:
        qps = m.get("qps_per_connection", 1)
        rows.append(("ECMP imbalance (max / mean uplink bytes)", f"{m['imbalance']:.2f}",
                     f"the MMR; 1.00 = even; {len(m['per_leaf'])} leaves x {len(next(iter(m['per_leaf'].values()))['bytes'])}"
                     f" uplinks; {m.get('load_balancing', 'flow')}, {qps} QP{'' if qps == 1 else 's'} per connection"
                     + ("; adaptive routing" if m.get("routing") == "adaptive" else "")))
        if m.get("adaptive_decisions") is not None:
            rows.append(("Adaptive routing: packets moved off the hash", f"{m['adaptive_moved_ratio']:.1%}",
                         f"of {m['adaptive_decisions']} decisions (least occupied port, per packet and hop)"))
        if m.get("jain_min") is not None:
            rows.append(("Jain fairness of uplink loads (worst leaf)", f"{m['jain_min']:.3f}", "1.000 = equal loads"))
    return rows


def terminal(s: dict, report_path=None) -> str:
    """The end-of-run summary for the terminal: headline, KPI table, fidelity verdict."""
    run = s["run"]
    lines = [f"== {run['run_id']}: {run['status']}" + (f" ({run['reason']})" if run.get("reason") else "")]
    if not run.get("complete", True):
        lines.append(f"   INCOMPLETE: {run['incomplete_because']} (data collected so far is kept)")
    rows = kpi_rows(s)
    width = max((len(k) for k, _, _ in rows), default=10)
    vwidth = max((len(v) for _, v, _ in rows), default=10)
    for k, v, ref in rows:
        lines.append(f"   {k:<{width}}  {v:<{vwidth}}  {ref}")
    lines.append("   what happened:")
    lines += [f"   - {sentence}" for sentence in narrative(s)]
    lines.append(f"   fidelity: {s['fidelity']['text']}")
    if report_path:
        lines.append(f"   report: {report_path}")
    return "\n".join(lines)
