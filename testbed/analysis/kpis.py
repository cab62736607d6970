"""The run's KPIs (``summary.json``) from its loaded results: what a report and ``compare``
show, with the analytical references beside the measured values.

Definitions (the IETF BMWG AI-fabric benchmarking draft's KPIs; nccl-tests' bandwidths):
- JCT: an iteration's step time (first op ready -> last op done, every GPU), real-fabric
  time; JCT ratio = step / analytical ideal (compute + ideal collectives).
- algbw = bytes / collective time; busbw = algbw x 2(n-1)/n (AllReduce) or x (n-1)/n
  (reduce-scatter, all-gather, all-to-all).
- ECN marking ratio = CE-marked / ECT packets at the switch egress queues.
- drops: packets the queues dropped (buffer full); ppm of packets offered to them.
- PFC: pause frames sent by switch ports and paused time (real), per port and in all.
- queue depth p95/max per port: the p95 of the per-poll maximum depth (the marker's
  "max since the last poll") and the run's maximum; and the median depth at the polls that
  ended a backlogged interval (max since the last poll > 0): where the queue sits while it
  is congested, the number ECN's Kmin is meant to set.
- ECMP imbalance: per group of parallel uplinks (a leaf's ports to the spines), max/mean
  of the bytes sent over the run; 1.0 is perfect spreading.
- Jain fairness: (sum x)^2 / (n sum x^2) over the throughputs of the fabric sends that
  ran at the same time (the sends of one collective step), averaged over steps.

Every function takes a ``results.Results`` (pandas frames) and returns plain JSON data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from testbed.analysis import fidelity
from testbed.model import queues, schedule
from testbed import units

SCHEMA = "testbed-summary/1"
DCTCP_K_DIVISOR = 7  # K > C x RTT / 7 (Alizadeh et al., DCTCP)


def summary(r) -> dict:
    m = r.manifest
    out = {
        "schema": SCHEMA,
        "run": {k: m.get(k) for k in ("run_id", "scenario", "status", "reason", "started_utc", "ended_utc",
                                      "datapath", "dilation", "link_delay_emulated")},
        "fabric": _fabric(r),
        "jct": _jct(r),
        "collectives": _collectives(r),
        "ecn": _ecn(r),
        "drops": _drops(r),
        "pfc": _pfc(r),
        "queues": _queue_depths(r),
        "ecmp": _ecmp(r),
        "fairness": _fairness(r),
        "transport": r.extra.get("transport", {}),
        "references": _references(r),
    }
    out["run"]["complete"], out["run"]["incomplete_because"] = _completeness(r, out)
    out["fidelity"] = fidelity.check(r)
    return out


def _completeness(r, out) -> tuple[bool, str]:
    m = r.manifest
    if m.get("status") != "ok":
        return False, f"run {m.get('status')}: {m.get('reason') or 'no reason recorded'}"
    its = out["jct"]["iterations"]
    want = (m.get("workload") or {}).get("iterations")
    if want and len(its) < want:
        return False, f"{len(its)} of {want} iterations completed"
    if any(not it.get("complete", True) for it in its):
        return False, "an iteration did not complete on every GPU"
    return True, ""


def _fabric(r) -> dict:
    plan = r.plan
    hosts = plan.get("hosts", [])
    rates = sorted({q["rate_bps"] for q in plan.get("queues", [])})
    return {"gpus": len(hosts), "switches": len(plan.get("switches", [])), "switch_ports": len(plan.get("queues", [])),
            "link_rates_bps": rates}


def _jct(r) -> dict:
    its = r.iterations.to_dict("records") if not r.iterations.empty else []
    out = {"iterations": its}
    if its:
        out["mean_step_ns"] = sum(i["step_ns"] for i in its) / len(its)
        out["mean_ratio"] = sum(i["ratio"] for i in its) / len(its)
        out["ideal_step_ns"] = its[0]["ideal_ns"]
    return out


def _collectives(r) -> dict:
    if r.collectives.empty:
        return {"items": []}
    rows = []
    for c in r.collectives.to_dict("records"):
        c = {k: v for k, v in c.items() if not (isinstance(v, float) and math.isnan(v))}
        if c.get("time_ns"):
            c["algbw_bps"] = c["bytes"] * 8 / (c["time_ns"] / 1e9)
            if "busbw_bps" not in c:
                c["busbw_bps"] = schedule.bus_bandwidth_bps(c["bytes"], c["ranks"], c["time_ns"], c["algorithm"])
        rows.append(c)
    out = {"items": rows}
    for phase in sorted({c["phase"] for c in rows}):
        mine = [c for c in rows if c["phase"] == phase and c.get("ratio")]
        if mine:
            out[phase] = {"count": len(mine), "mean_ratio": sum(c["ratio"] for c in mine) / len(mine),
                          "max_ratio": max(c["ratio"] for c in mine),
                          "mean_busbw_bps": sum(c.get("busbw_bps", 0) for c in mine) / len(mine)}
    return out


def last_poll(df, by="intf"):
    """The last poll of every port (collector counters are cumulative: these are the totals)."""
    return df.sort_values("t_ns").groupby(by).tail(1)


def _ecn(r) -> dict:
    out = {}
    if not r.queues.empty:
        last = last_poll(r.queues)
        ect, marked = int(last.ect.sum()), int(last.marked.sum())
        out.update(ect_packets=ect, marked_packets=marked, marking_ratio=marked / ect if ect else 0.0,
                   per_port={row.intf: {"ect": int(row.ect), "marked": int(row.marked)}
                             for row in last.itertuples() if row.ect})
    if not r.ecn.empty:
        last = last_poll(r.ecn)
        out["links"] = {row.intf: {"from": row.peer, "not_ect": int(row.not_ect), "ect0": int(row.ect0),
                                   "ect1": int(row.ect1), "ce": int(row.ce)}
                        for row in last.itertuples() if row.not_ect + row.ect0 + row.ect1 + row.ce}
        out["ce_arrivals"] = int(last.ce.sum())
    return out


def _drops(r) -> dict:
    if r.queues.empty:
        return {}
    last = last_poll(r.queues)
    drops, packets = int(last.drops.sum()), int(last.packets.sum())
    return {"packets": drops, "offered_packets": packets, "ppm": drops / packets * 1e6 if packets else 0.0,
            "per_port": {row.intf: int(row.drops) for row in last.itertuples() if row.drops}}


def _pfc(r) -> dict:
    p = r.manifest.get("pfc")
    if not p:
        return {"enabled": False}
    d = float(r.manifest.get("dilation") or 1)
    out = {"enabled": True, "pause_frames": p.get("frames_sent", 0), "xoff_frames": p.get("xoff_sent", 0),
           "paused_real_ns": p.get("paused_ns", 0) / d, "paused_ports": p.get("paused_ports", []),
           "headroom_high_water_bytes": p.get("headroom_high_water_bytes", 0), "drops": p.get("drops", 0)}
    if not r.pfc_ports.empty:
        out["per_port"] = {row["port"]: {k: row[k] for k in ("frames_sent", "paused_ns") if k in row}
                           for row in r.pfc_ports.to_dict("records") if row.get("frames_sent") or row.get("paused_ns")}
    return out


def _queue_depths(r) -> dict:
    if r.queues.empty:
        return {}
    per_port = {}
    for intf, g in r.queues.groupby("intf"):
        backlogged = g[g.max_depth_bytes > 0]
        per_port[intf] = {"p95_depth_bytes": float(g.max_depth_bytes.quantile(0.95)),
                          "max_depth_bytes": int(g.max_depth_bytes.max()),
                          "backlogged_polls": len(backlogged),
                          "median_backlogged_depth_bytes": float(backlogged.depth_bytes.median()) if len(backlogged) else 0.0,
                          "max_backlog_bytes": int(g.tbf_backlog_bytes.max()) if "tbf_backlog_bytes" in g else 0,
                          "kmin_bytes": _num(g.kmin_bytes.iloc[0]) if "kmin_bytes" in g else None,
                          "kmax_bytes": _num(g.kmax_bytes.iloc[0]) if "kmax_bytes" in g else None,
                          "xoff_bytes": _num(g.xoff_bytes.iloc[0]) if "xoff_bytes" in g else None}
    busiest = max(per_port, key=lambda k: per_port[k]["max_depth_bytes"])
    return {"per_port": per_port, "max_depth_bytes": per_port[busiest]["max_depth_bytes"], "busiest_port": busiest,
            "p95_depth_bytes": max(v["p95_depth_bytes"] for v in per_port.values()),
            "median_backlogged_depth_bytes": per_port[busiest]["median_backlogged_depth_bytes"]}


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)


def uplink_groups(plan: dict) -> dict:
    """Per switch, its ports toward higher-tier switches (spines): the ECMP members."""
    roles = {s["name"]: s["role"] for s in plan.get("switches", [])}
    groups: dict[str, list] = {}
    for link in plan.get("links", []):
        for me, intf, peer in ((link["a"], link["a_intf"], link["b"]), (link["b"], link["b_intf"], link["a"])):
            if roles.get(me) == "leaf" and roles.get(peer) == "spine":
                groups.setdefault(me, []).append(intf)
    return {k: sorted(v) for k, v in groups.items() if len(v) > 1}


def _ecmp(r) -> dict:
    groups = uplink_groups(r.plan)
    if r.ports.empty or not groups:
        return {}
    first = r.ports.sort_values("t_ns").groupby("intf").head(1).set_index("intf").tx_bytes
    last = last_poll(r.ports).set_index("intf").tx_bytes
    sent = (last - first).to_dict()
    per_leaf = {}
    for leaf, intfs in groups.items():
        b = [sent.get(i, 0) for i in intfs]
        mean = sum(b) / len(b)
        per_leaf[leaf] = {"bytes": dict(zip(intfs, map(int, b))), "imbalance": max(b) / mean if mean else None}
    vals = [v["imbalance"] for v in per_leaf.values() if v["imbalance"] is not None]
    return {"per_leaf": per_leaf, "imbalance": max(vals) if vals else None}


def jain(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _fairness(r) -> dict:
    ops = r.ops
    if ops.empty:
        return {}
    sends = ops[(ops.kind == "send") & (ops.link == "fabric") & (ops.duration_real_ns > 0)]
    if sends.empty:
        return {}
    sends = sends.assign(rate_bps=sends.bytes * 8 / (sends.duration_real_ns / 1e9))
    per_step = [jain(g.rate_bps.tolist()) for _, g in sends.groupby(["collective", "step", "iteration"]) if len(g) > 1]
    per_step = [j for j in per_step if j is not None]
    if not per_step:
        return {}
    return {"jain_mean": sum(per_step) / len(per_step), "jain_min": min(per_step), "steps": len(per_step)}


def _references(r) -> dict:
    ideal = r.extra.get("ideal", {})
    out = {"ring_allreduce": "t = 2(n-1)/n x S / B + 2(n-1) x per-step latency",
           "bus_bandwidth": "busbw = algbw x 2(n-1)/n (AllReduce), x (n-1)/n (RS, AG, all-to-all)",
           "pfc_headroom": "2 x MTU + (2 x cable delay + response time) x rate",
           "dctcp_k": "K > C x RTT / 7"}
    if ideal:
        out["ideal"] = ideal
    qs = r.plan.get("queues", [])
    if qs:
        fastest = max(qs, key=lambda q: q["rate_bps"])
        delay = {link["kind"]: link["delay_ns"] for link in r.plan.get("links", [])}
        # GPU -> leaf -> spine -> leaf -> GPU and back: propagation plus one MTU serialised per hop
        hop_ns = queues.MTU_BYTES * 8 / fastest["rate_bps"] * 1e9
        rtt_ns = 2 * (2 * delay.get("host", 0) + 2 * delay.get("uplink", 0)) + 2 * 4 * hop_ns
        out["dctcp_k_bytes"] = int(fastest["rate_bps"] * rtt_ns / 1e9 / 8 / DCTCP_K_DIVISOR)
        out["dctcp_k_rtt_ns"] = rtt_ns
        out["kmin_bytes"] = fastest.get("kmin_bytes") if fastest.get("ecn") else None  # None: ECN off
        out["pfc_headroom_formula_bytes"] = queues.headroom_formula_bytes(fastest["rate_bps"],
                                                                          fastest.get("delay_ns", 0))
        out["pfc_headroom_configured_bytes"] = fastest.get("headroom_bytes")
    return out


def kpi_rows(s: dict) -> list[tuple[str, str, str]]:
    """(KPI, measured, reference) rows of a summary, formatted in real units."""
    rows = []
    jct = s.get("jct", {})
    if jct.get("iterations"):
        rows.append(("JCT (mean step time)", units.format_duration(jct["mean_step_ns"]),
                     f"ideal {units.format_duration(jct['ideal_step_ns'])}"))
        rows.append(("JCT ratio (measured / ideal)", f"{jct['mean_ratio']:.3f}", "1.000 = the analytical ideal"))
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
    p = s.get("pfc", {})
    if p.get("enabled"):
        rows.append(("PFC pause frames (XOFF)", f"{p['pause_frames']} ({p['xoff_frames']})",
                     f"{len(p['paused_ports'])} ports paused"))
        rows.append(("PFC paused time (real, all ports)", units.format_duration(p["paused_real_ns"]), ""))
        ref = s.get("references", {})
        rows.append(("PFC headroom high-water", units.format_size(p["headroom_high_water_bytes"]),
                     f"headroom {units.format_size(ref.get('pfc_headroom_configured_bytes') or 0)} "
                     f"(formula {units.format_size(ref.get('pfc_headroom_formula_bytes') or 0)})"))
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
    m = s.get("ecmp", {})
    if m.get("imbalance") is not None:
        rows.append(("ECMP imbalance (max / mean uplink bytes)", f"{m['imbalance']:.2f}",
                     f"1.00 = even; {len(m['per_leaf'])} leaves x {len(next(iter(m['per_leaf'].values()))['bytes'])}"
                     f" uplinks"))
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
    return rows




def narrative(s: dict) -> list[str]:
    """What happened, in a few sentences a newcomer can follow (the numbers are the KPIs')."""
    out = []
    fmt_d, fmt_s, fmt_r = units.format_duration, units.format_size, units.format_rate
    jct, ref = s.get("jct", {}), s.get("references", {})
    ideal = ref.get("ideal", {})
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
                       f"marks, no drops, no PFC pauses. The burst fits this fabric with this rank mapping; a "
                       f"mapping whose ring crosses the spines congests it (on the default scenario: --set "
                       f"workload.mapping=sequential, then testbed compare the two runs).")
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
    if m.get("imbalance") and m["imbalance"] > 1.5:
        out.append(f"ECMP hashes whole flows onto uplinks: with a few large flows (one queue pair per ring "
                   f"neighbour) a leaf's busiest uplink carried x{m['imbalance']:.2f} the mean.")
    return out


def _plain(v):
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def write(s: dict, path: Path):
    path.write_text(json.dumps(s, indent=1, default=_plain) + "\n")


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
