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
- ECMP imbalance (the draft's MMR, max-to-mean ratio of link load): per group of parallel
  uplinks (a leaf's ports to the spines), max/mean of the bytes sent over the run; 1.0 is
  perfect spreading; and Jain's index of the same loads (1.0: equal; 1/n: one link
  carries everything).
- out-of-order ratio: data packets that arrived ahead of the PSN their QP expected, over
  the data packets that arrived; retransmitted bytes on the wire (go-back-N resends every
  packet after a gap).
- Jain fairness: (sum x)^2 / (n sum x^2) over the throughputs of the fabric sends that
  ran at the same time (the sends of one collective step), averaged over steps.

Every function takes a ``results.Results`` (pandas frames) and returns plain JSON data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from testbed.analysis import fidelity
from testbed.config.workload import BALANCE_DEFAULTS
from testbed.model import collectives, queues

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
        "link_events": r.extra.get("link_events", []),
        "jobs": _jobs(r),
        "references": _references(r),
    }
    out["run"]["complete"], out["run"]["incomplete_because"] = _completeness(r, out)
    out["fidelity"] = fidelity.check(r)
    return out


def _jobs(r) -> dict:
    """Several jobs: each one's JCT, step and bus bandwidth, and with ``--isolate-baseline``
    its JCT alone and interference (JCT with the others / alone; 1.00: unaffected)."""
    out = {}
    for name, j in (r.extra.get("jobs") or {}).items():
        row = {k: j.get(k) for k in ("gpus", "start_ns", "jct_ns", "mean_step_ns", "mean_ratio", "mean_busbw_bps")}
        row["iterations"] = len(j.get("iterations", []))
        base = (r.extra.get("baselines") or {}).get(name)
        if base:
            row.update(jct_alone_ns=base.get("jct_alone_ns"), interference=base.get("interference"),
                       baseline_run=base.get("run_dir"), baseline_fidelity=base.get("fidelity"))
        out[name] = row
    return out


def _completeness(r, out) -> tuple[bool, str]:
    m = r.manifest
    its = out["jct"]["iterations"]
    want = (m.get("workload") or {}).get("iterations")
    if m.get("status") != "ok":
        done = f"; cut short: {len(its)} of {want} iterations finished" if want else ""
        return False, f"run {m.get('status')}: {m.get('reason') or 'no reason recorded'}{done}"
    if want and len(its) < want:
        return False, f"{len(its)} of {want} iterations completed"
    cut = out["jct"].get("incomplete_iterations")
    if cut:
        return False, f"iteration {', '.join(str(i + 1) for i in cut)} did not finish on every GPU"
    return True, ""


def _fabric(r) -> dict:
    plan = r.plan
    if plan is None:
        return {"gpus": 0, "switches": 0, "switch_ports": 0, "link_rates_bps": []}
    return {"gpus": len(plan.hosts), "switches": len(plan.switches), "switch_ports": len(plan.queues),
            "link_rates_bps": sorted({q.rate_bps for q in plan.queues})}


def _jct(r) -> dict:
    its = r.iterations.to_dict("records") if not r.iterations.empty else []
    out = {"iterations": its, "incomplete_iterations": r.extra.get("incomplete_iterations", [])}
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
                c["busbw_bps"] = collectives.bus_bandwidth_bps(c["bytes"], c["ranks"], c["time_ns"], c["algorithm"])
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
    out = {"packets": drops, "offered_packets": packets, "ppm": drops / packets * 1e6 if packets else 0.0,
           "per_port": {row.intf: int(row.drops) for row in last.itertuples() if row.drops}}
    if "trimmed" in last:  # cut to their headers where the data class would have dropped them
        out["trimmed_packets"] = int(last.trimmed.fillna(0).sum())
    return out


def _pfc(r) -> dict:
    p = r.manifest.get("pfc")
    if not p:
        return {"enabled": False}
    out = {"enabled": True, "pause_frames": p.get("frames_sent", 0), "xoff_frames": p.get("xoff_sent", 0),
           "paused_real_ns": r.dilation.real_duration_ns(p.get("paused_ns", 0)), "paused_ports": p.get("paused_ports", []),
           "headroom_high_water_bytes": p.get("headroom_high_water_bytes", 0), "drops": p.get("drops", 0)}
    if _headroom_worst_port(r):
        out["headroom_high_water_port"] = _headroom_worst_port(r)
    if not r.pfc_ports.empty:
        out["per_port"] = {row["port"]: {k: row[k] for k in ("frames_sent", "paused_ns") if k in row}
                           for row in r.pfc_ports.to_dict("records") if row.get("frames_sent") or row.get("paused_ns")}
    return out


def _headroom_worst_port(r):
    """The switch port whose PFC headroom filled most (None: no headroom used)."""
    if r.pfc_ports.empty or "headroom_high_water_bytes" not in r.pfc_ports:
        return None
    worst = r.pfc_ports.sort_values("headroom_high_water_bytes").iloc[-1]
    return worst["port"] if worst["headroom_high_water_bytes"] else None


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


def uplink_groups(plan) -> dict:
    """Per switch, its ports toward higher-tier switches (spines): the ECMP members."""
    if plan is None:
        return {}
    roles = {s.name: s.role for s in plan.switches}
    groups: dict[str, list] = {}
    for link in plan.links:
        for me, intf, peer in ((link.a, link.a_intf, link.b), (link.b, link.b_intf, link.a)):
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
        per_leaf[leaf] = {"bytes": dict(zip(intfs, map(int, b))), "imbalance": max(b) / mean if mean else None,
                          "jain": jain(b)}
    vals = [v["imbalance"] for v in per_leaf.values() if v["imbalance"] is not None]
    jains = [v["jain"] for v in per_leaf.values() if v["jain"] is not None]
    t = r.plan.training.transport if r.plan.training else None
    out = {"per_leaf": per_leaf, "imbalance": max(vals) if vals else None,
           "jain_min": min(jains) if jains else None,
           "load_balancing": t.load_balancing if t else BALANCE_DEFAULTS["load_balancing"],
           "qps_per_connection": t.qps_per_connection if t else BALANCE_DEFAULTS["qps_per_connection"],
           "routing": r.plan.routing}
    adaptive = r.manifest.get("routing") or {}
    if adaptive.get("decisions") is not None:
        # data packets the hops tagged with a chosen port (a packet crossing the spines is
        # decided twice: by its NIC for the leaf, by the leaf's uplink for the spine), and
        # the share sent elsewhere than the flow hash would have
        out["adaptive_decisions"] = adaptive["decisions"]
        out["adaptive_moved_ratio"] = adaptive["moved"] / adaptive["decisions"] if adaptive["decisions"] else 0.0
    return out


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
    qs = r.plan.queues if r.plan else ()
    if qs:
        fastest = max(qs, key=lambda q: q.rate_bps)
        delay = {link.kind: link.delay_ns for link in r.plan.links}
        # GPU -> leaf -> spine -> leaf -> GPU and back: propagation plus one MTU serialised per hop
        hop_ns = queues.MTU_BYTES * 8 / fastest.rate_bps * 1e9
        rtt_ns = 2 * (2 * delay.get("host", 0) + 2 * delay.get("uplink", 0)) + 2 * 4 * hop_ns
        out["dctcp_k_bytes"] = int(fastest.rate_bps * rtt_ns / 1e9 / 8 / DCTCP_K_DIVISOR)
        out["dctcp_k_rtt_ns"] = rtt_ns
        out["kmin_bytes"] = fastest.kmin_bytes if fastest.ecn else None  # None: ECN off
        out.update(_headroom_references(qs, _headroom_worst_port(r)))
    return out


def _headroom_references(qs, worst_port) -> dict:
    """The PFC headroom each kind of port needs (GPU ports: 3 m host cables; switch ports:
    100 m uplinks) and has, and the same for the port whose headroom filled most."""
    out = {"pfc_headroom_per_port_kind": {}}
    for kind, ports in (("gpu_ports", [q for q in qs if not _is_switch(q.peer)]),
                        ("switch_ports", [q for q in qs if _is_switch(q.peer)])):
        if ports:
            out["pfc_headroom_per_port_kind"][kind] = {
                "formula_bytes": max(queues.headroom_formula_bytes(q.rate_bps, q.delay_ns) for q in ports),
                "configured_bytes": max(q.headroom_bytes for q in ports)}
    by_intf = {q.intf: q for q in qs}
    worst = by_intf.get(worst_port or "") or max(qs, key=lambda q: queues.headroom_formula_bytes(q.rate_bps, q.delay_ns))
    out["pfc_headroom_port"] = worst.intf
    out["pfc_headroom_formula_bytes"] = queues.headroom_formula_bytes(worst.rate_bps, worst.delay_ns)
    out["pfc_headroom_configured_bytes"] = worst.headroom_bytes
    return out


def _is_switch(name: str) -> bool:
    return name.startswith(("leaf", "spine"))


def _plain(v):
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def write(s: dict, path: Path):
    path.write_text(json.dumps(s, indent=1, default=_plain) + "\n")
