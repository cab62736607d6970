"""``report.html``: one self-contained page per run (plotly.js inlined, no server, opens
from a synced folder), and the side-by-side page of ``compare``. The only plotly import.

Every plot is in real-fabric units (time in microseconds of the real fabric, rates in
Gbit/s of the real links, depths in bytes) and says in a sentence how to read it.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

import plotly.graph_objects as go
import yaml
from plotly.offline import get_plotlyjs

from testbed.analysis import kpis, results
from testbed.config.scenario import REPORT_SECTIONS
from testbed import units
from testbed.views import summary

MAX_TIMELINE_ITERATIONS = 3  # a per-GPU timeline of more would be unreadable (and heavy)
MAX_QUEUE_PORTS = 6
COLOURS = {"compute": "#7f7f7f", "dp": "#1f77b4", "pp": "#2ca02c", "tp": "#9467bd", "wait": "#d62728",
           "forward": "#7f7f7f", "backward": "#5f5f5f"}
CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f4f4f4} .ok{background:#e6f4e6} .bad{background:#fbe3e3} .na{background:#f4f4f4}
.verdict{padding:.6em 1em;border-radius:4px;font-weight:600} p.how{color:#555;max-width:60em}
code{background:#f4f4f4;padding:0 .2em}
"""


def _fig_html(fig, div_id: str) -> str:
    fig.update_layout(margin=dict(l=60, r=20, t=30, b=50), height=fig.layout.height or 380,
                      template="plotly_white")
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _us(ns):
    return ns / 1e3


def _table(rows, header=None) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>")
    for row in rows:
        cls = ""
        if isinstance(row, dict):
            cls, row = row.get("class", ""), row["cells"]
        out.append(f"<tr class='{cls}'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>" + CSS
            + "</style><script type='text/javascript'>" + get_plotlyjs() + "</script></head><body>"
            + "\n".join(body) + "</body></html>")


def _fidelity_html(fid: dict) -> str:
    cls = {"trusted": "ok", "not trusted": "bad"}.get(fid.get("verdict"), "na")
    rows = [{"class": "ok" if c["ok"] else "bad",
             "cells": [c["name"], c["value"], c["limit"], "pass" if c["ok"] else "FAIL", c["cause"] or c["detail"]]}
            for c in fid.get("checks", [])]
    return (f"<p class='verdict {cls}'>{html.escape(fid.get('text', ''))}</p>"
            + _table(rows, ["check", "measured", "limit", "", "detail"]))


# -- plots ---------------------------------------------------------------------------------------
def _port_rates(r):
    """Port polls with a rate (none when the run failed before the controller polled)."""
    return r.ports.dropna(subset=["tx_bps"]) if "tx_bps" in r.ports else r.ports.iloc[0:0]


def throughput_fig(r):
    p = _port_rates(r)
    if p.empty:
        return None
    busy = p.groupby("intf").tx_bps.max()
    p = p[p.intf.isin(busy[busy > 0].index)]
    fig = go.Figure()
    for intf, g in p.groupby("intf"):
        fig.add_trace(go.Scatter(x=_us(g.t_real_ns), y=g.tx_bps / 1e9, mode="lines", name=intf, line_shape="hv"))
    fig.update_layout(xaxis_title="time (us, real fabric)", yaxis_title="transmitted (Gbit/s)")
    return fig


def utilisation_fig(r):
    p = _port_rates(r)
    if p.empty or "tx_utilisation" not in p:
        return None
    # switches answer a poll at slightly different times: one column per telemetry interval
    interval = float((r.manifest.get("telemetry") or {}).get("interval_real_ns") or 1)
    p = p.assign(t_bin=(p.t_real_ns / interval).round() * interval)
    wide = p.pivot_table(index="intf", columns="t_bin", values="tx_utilisation", aggfunc="mean")
    fig = go.Figure(go.Heatmap(z=wide.values, x=_us(wide.columns.to_numpy()), y=list(wide.index), zmin=0, zmax=1,
                               colorscale="Viridis", colorbar=dict(title="utilisation")))
    fig.update_layout(xaxis_title="time (us, real fabric)", height=max(300, 18 * len(wide.index) + 100))
    return fig


def queue_fig(r):
    q = r.queues
    if q.empty:
        return None
    top = q.groupby("intf").max_depth_bytes.max().sort_values(ascending=False)
    top = top[top > 0].index[:MAX_QUEUE_PORTS]
    if not len(top):
        top = q.intf.unique()[:1]
    fig = go.Figure()
    for intf in top:
        g = q[q.intf == intf]
        fig.add_trace(go.Scatter(x=_us(g.t_real_ns), y=g.max_depth_bytes, mode="lines", name=f"{intf} max depth",
                                 line_shape="hv"))
    first = q[q.intf == top[0]].iloc[0]
    for col, label, dash in (("kmin_bytes", "Kmin", "dot"), ("kmax_bytes", "Kmax", "dash"),
                             ("xoff_bytes", "XOFF", "dashdot")):
        v = first.get(col)
        if v is not None and v == v and v < 2 ** 62 and (col != "xoff_bytes" or first.get("pfc")):
            fig.add_hline(y=float(v), line_dash=dash, annotation_text=label)
    fig.update_layout(xaxis_title="time (us, real fabric)", yaxis_title="queue depth (bytes, max per poll)",
                      yaxis_type="log")
    return fig


def counters_fig(r, s):
    if r.queues.empty:
        return None
    last = kpis.last_poll(r.queues).set_index("intf")
    pfc = {}
    if not r.pfc_ports.empty:
        pfc = {row["port"]: row.get("frames_sent", 0) for row in r.pfc_ports.to_dict("records")}
    last = last.assign(pfc=[pfc.get(i, 0) for i in last.index])
    last = last[(last.marked + last.drops + last.pfc) > 0]
    if last.empty:
        return None
    fig = go.Figure([go.Bar(x=list(last.index), y=last.marked, name="CE marked"),
                     go.Bar(x=list(last.index), y=last.drops, name="dropped"),
                     go.Bar(x=list(last.index), y=last.pfc, name="PFC frames sent")])
    fig.update_layout(barmode="group", yaxis_title="packets / frames", xaxis_title="switch egress port")
    return fig


def timeline_fig(r):
    ops = r.ops
    if ops.empty:
        return None
    ops = ops[ops.iteration < MAX_TIMELINE_ITERATIONS]
    fig = go.Figure()
    shown = set()

    def bars(df, base_col, end_col, kind, colour, text, width=0.8):
        if df.empty:
            return
        fig.add_trace(go.Bar(y=df.gpu, base=_us(df[base_col]), x=_us(df[end_col] - df[base_col]), orientation="h",
                             marker_color=colour, name=kind, legendgroup=kind, showlegend=kind not in shown,
                             hovertext=text, hoverinfo="text", width=width))
        shown.add(kind)

    comp = ops[ops.kind == "compute"]
    bars(comp, "start_real_ns", "end_real_ns", "compute", COLOURS["compute"],
         [f"{g} {p} it{i}" for g, p, i in zip(comp.gpu, comp.phase, comp.iteration)])
    waits = ops[(ops.kind == "recv") & (ops.wait_real_ns > 0)]
    bars(waits, "ready_real_ns", "end_real_ns", "waiting on a peer", COLOURS["wait"],
         [f"{g} waits for {p} ({units.format_duration(w)})" for g, p, w in zip(waits.gpu, waits.peer,
                                                                               waits.wait_real_ns)])
    for phase in ("dp", "pp", "tp"):
        sends = ops[(ops.kind == "send") & (ops.phase == phase)]
        bars(sends, "start_real_ns", "end_real_ns", f"send ({phase})", COLOURS[phase],
             [f"{g} -> {p}: {units.format_size(b)} ({lk})" for g, p, b, lk in
              zip(sends.gpu, sends.peer, sends.bytes, sends.link)], width=0.4)
    n = ops.gpu.nunique()
    fig.update_layout(barmode="overlay", xaxis_title="time (us, real fabric)", height=max(300, 28 * n + 120),
                      yaxis=dict(categoryorder="category descending"))
    fig.update_traces(opacity=0.8)
    return fig


def collectives_fig(s):
    items = [c for c in s.get("collectives", {}).get("items", []) if c.get("ideal_ns")]
    if not items:
        return None
    fig = go.Figure([go.Bar(x=[f"#{c['id']} {c['phase']} {c['algorithm']}" for c in items],
                            y=[c["time_ns"] / 1e3 for c in items], name="measured"),
                     go.Bar(x=[f"#{c['id']} {c['phase']} {c['algorithm']}" for c in items],
                            y=[c["ideal_ns"] / 1e3 for c in items], name="ideal")])
    fig.update_layout(barmode="group", yaxis_title="time (us, real fabric)")
    return fig


def dcqcn_fig(r):
    if r.rates.empty:
        return None
    fig = go.Figure()
    for (gpu, peer), g in r.rates[r.rates.link == "fabric"].groupby(["gpu", "peer"]):
        fig.add_trace(go.Scatter(x=_us(g.t_real_ns), y=g.rate_bps / 1e9, mode="lines", line_shape="hv",
                                 name=f"{gpu}->{peer}"))
    if not len(fig.data):
        return None
    fig.update_layout(xaxis_title="time (us, real fabric)", yaxis_title="DCQCN sending rate (Gbit/s)")
    return fig


def cnp_fig(r):
    q = r.qps
    if q.empty or "cnps_sent" not in q or not q.cnps_sent.fillna(0).sum():
        return None
    per_gpu = q.groupby("gpu")[["ce_received", "cnps_sent", "cnps_received"]].sum()
    fig = go.Figure([go.Bar(x=list(per_gpu.index), y=per_gpu[c], name=label) for c, label in
                     (("ce_received", "CE-marked packets received"), ("cnps_sent", "CNPs sent"),
                      ("cnps_received", "CNPs received (rate cuts follow)"))])
    fig.update_layout(barmode="group", yaxis_title="packets", height=320)
    return fig


SECTIONS = (
    ("throughput", "Per-port throughput over time",
     "Each line is one switch egress port (real Gbit/s per telemetry interval). Training alternates compute "
     "(quiet) with synchronisation (every GPU sends at once): the spikes are the collectives.", throughput_fig),
    ("utilisation", "Link utilisation heat map",
     "Rows are switch egress ports, columns telemetry intervals; colour is the share of the link's rate used. "
     "Idle uplinks next to busy ones are ECMP imbalance.", utilisation_fig),
    ("queues", "Queue depth against Kmin / Kmax / XOFF",
     "The deepest ports' maximum depth in each interval (the marker keeps the maximum between polls, so short "
     "bursts are not lost). Above Kmin packets start being CE-marked; at Kmax every ECT packet is; above XOFF "
     "the port sends PFC pause frames upstream.", queue_fig),
    ("timeline", "Per-GPU timeline",
     "Grey is compute; thin coloured bars are sends (data-, pipeline-, tensor-parallel: first packet to "
     "last); red is time a GPU waited for a peer's data (hover for whom). The first iterations only.", timeline_fig),
    ("counters", "Marks, drops and pause frames per port",
     "Only ports with any. Marks are ECN doing its job; drops mean the buffer overflowed (with PFC on there "
     "should be none); PFC frames are pauses sent to this port's upstream neighbours.", None),
    ("collectives", "Collective time against the ideal",
     "Each collective's time (from when every member had entered it to when the last finished) next to the "
     "analytical ideal (ring: 2(n-1)/n x S / B plus per-step latency).", None),
    ("dcqcn", "DCQCN sending rates",
     "Each line is one fabric queue pair's rate: cuts follow CNPs (congestion notifications for CE-marked "
     "packets), then the rate recovers.", dcqcn_fig),
    ("cnps", "ECN marks seen and CNPs per GPU",
     "A receiver that gets CE-marked packets sends CNPs to the sender (at most one per queue pair per 4 us, "
     "real): CE received is per receiver, CNPs received per sender.", cnp_fig),
)


assert tuple(sec[0] for sec in SECTIONS) == REPORT_SECTIONS


def _order(run_dir) -> list:
    """SECTIONS with the scenario's ``report.first`` plots moved to the front (in its order)."""
    try:
        doc = yaml.safe_load((Path(run_dir) / "scenario.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        doc = {}
    first = list((doc.get("report") or {}).get("first") or [])
    return sorted(SECTIONS, key=lambda sec: first.index(sec[0]) if sec[0] in first else len(first))


def render(r, s: dict) -> str:
    m = r.manifest
    title = f"testbed run {m.get('run_id')}"
    run = s.get("run", {})
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>scenario <code>{html.escape(str(m.get('scenario')))}</code>, status <b>{html.escape(str(run.get('status')))}"
            f"</b>{' (' + html.escape(str(run.get('reason'))) + ')' if run.get('reason') else ''}; "
            f"{s['fabric']['gpus']} GPUs, {s['fabric']['switches']} switches, {m.get('datapath')} datapath, "
            f"dilation {m.get('dilation')} (1 us of the real fabric = {units.Dilation.of(m.get('dilation')).duration_ns(1000) / 1e6:g} ms "
            f"here).</p>"]
    if not run.get("complete", True):
        body.append(f"<p class='verdict bad'>INCOMPLETE: {html.escape(run.get('incomplete_because', ''))}. "
                    f"Everything collected until then is shown.</p>")
    body += ["<h2>What happened</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in summary.narrative(s))
             + "</ul>", "<h2>Can these numbers be trusted? (fidelity guard)</h2>", _fidelity_html(s.get("fidelity", {})),
             "<h2>KPIs</h2>", "<p class='how'>Measured values beside their analytical references, in real-fabric "
             "units.</p>", _table(summary.kpi_rows(s), ["KPI", "measured", "reference"])]
    for key, heading, how, make in _order(r.run_dir):
        fig = (counters_fig(r, s) if key == "counters" else collectives_fig(s) if key == "collectives"
               else make(r))
        body.append(f"<h2>{html.escape(heading)}</h2><p class='how'>{html.escape(how)}</p>")
        body.append(_fig_html(fig, f"plot-{key}") if fig is not None else "<p><i>nothing to plot in this run</i></p>")
    body.append("<h2>Files</h2><p class='how'>Everything here comes from the run folder: "
                "<code>python3 -m testbed report RUN_DIR</code> rebuilds this page, "
                "<code>testbed.analysis.results.load(RUN_DIR)</code> gives the same data as pandas frames.</p>")
    return _page(title, body)


def write(r, s: dict, path: Path) -> Path:
    path.write_text(render(r, s))
    return path


# -- compare -------------------------------------------------------------------------------------
def compare_rows(summaries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """A KPI x run table: one column per run (by run id)."""
    header = ["KPI"] + [s["run"]["run_id"] for s in summaries]
    names: list[str] = []
    per_run = []
    for s in summaries:
        rows = {"scenario": s["run"].get("scenario", ""), "dilation": f"{s['run'].get('dilation')}",
                "fidelity": s.get("fidelity", {}).get("verdict", "")}
        m = s.get("ecmp") or {}
        if m:
            rows["routing, load balancing"] = (f"{m.get('routing', 'ecmp')}, {m.get('load_balancing', 'flow')}, "
                                               f"{m.get('qps_per_connection', 1)} QP/connection")
        rows.update({k: v for k, v, _ in summary.kpi_rows(s)})
        per_run.append(rows)
        for k in rows:
            if k not in names:
                names.append(k)
    return header, [[k] + [rows.get(k, "") for rows in per_run] for k in names]


def compare_html(summaries: list[dict]) -> str:
    header, rows = compare_rows(summaries)
    body = ["<h1>testbed compare</h1>", _table(rows, header)]
    ids = [s["run"]["run_id"] for s in summaries]
    metrics = (("JCT ratio (measured / ideal)", lambda s: s.get("jct", {}).get("mean_ratio")),
               ("ECN marking ratio", lambda s: s.get("ecn", {}).get("marking_ratio")),
               ("drops (ppm)", lambda s: s.get("drops", {}).get("ppm")),
               ("PFC pause frames", lambda s: s.get("pfc", {}).get("pause_frames", 0)),
               ("queue depth max (bytes)", lambda s: s.get("queues", {}).get("max_depth_bytes")),
               ("retransmitted packets", lambda s: s.get("transport", {}).get("retransmitted")),
               ("retransmitted bytes", lambda s: s.get("transport", {}).get("retransmitted_bytes")),
               ("uplink load MMR (max / mean)", lambda s: s.get("ecmp", {}).get("imbalance")),
               ("out-of-order arrival ratio", lambda s: s.get("transport", {}).get("out_of_order_ratio")))
    for i, (name, get) in enumerate(metrics):
        fig = go.Figure(go.Bar(x=ids, y=[get(s) for s in summaries]))
        fig.update_layout(title=name, height=300)
        body.append(_fig_html(fig, f"compare-{i}"))
    return _page("testbed compare", body)


def build(run_dir: Path) -> tuple[dict, Path]:
    """(Re)build a run folder's ``summary.json`` and ``report.html`` from what it holds."""
    r = results.load(run_dir)
    s = kpis.summary(r)
    kpis.write(s, run_dir / "summary.json")
    return s, write(r, s, run_dir / "report.html")


def compare(run_dirs: list[Path], html_path: Path | None = None) -> str:
    """The KPI table of ``run_dirs`` side by side (returned as text) and the same as an
    HTML page with bar charts (written to ``html_path``)."""
    summaries = [load_summary(Path(d)) for d in run_dirs]
    if html_path is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        html_path = Path(run_dirs[0]).resolve().parent / f"compare-{stamp}.html"
    html_path.write_text(compare_html(summaries))
    header, rows = compare_rows(summaries)
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
    return "\n".join(lines + [f"page: {html_path}"])


def load_summary(run_dir: Path) -> dict:
    """A run's summary (built first if the folder has none yet)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return build(run_dir)[0]
    return json.loads(path.read_text())
