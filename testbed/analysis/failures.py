"""What each link event cost (pure, from the run's files): when it happened, how long the
controller took to reroute (real time here, and what that is on the real fabric), which
iteration it fell in, and how much longer that iteration took than the others. A slowed
link is not rerouted (nothing goes down): its row has the rate and the stretch.

Every time is CLOCK_MONOTONIC on this machine: the event file's ``t_ns`` (apply.events),
the controller's ``t_mono`` (seconds) and the agents' op records (``ready_ns``/``end_ns``).
"""

from __future__ import annotations

from pathlib import Path

from testbed import units
from testbed.jsonlines import read_events


def summarise(run_dir: Path, records: list, iterations: list, dilation: units.Dilation) -> list:
    """One row per link event, in order; [] when the run had none."""
    lines = read_events(run_dir / "link-events.jsonl")
    events = [e for e in lines if e.get("event") in ("link_down", "link_up", "link_slow")]
    if not events:
        return []
    # the last event's window closes at the end record (links restored, teardown after it)
    end_ns = next((e["t_ns"] for e in lines if e.get("event") == "end"), None)
    ctl = read_events(run_dir / "controller-events.jsonl")
    ports = read_events(run_dir / "ports.jsonl")
    spans = _iteration_spans(records)
    hit = {}
    rows = []
    for i, e in enumerate(events):
        t_s = e["t_ns"] / 1e9
        nxt_ns = events[i + 1]["t_ns"] if i + 1 < len(events) else end_ns
        nxt = nxt_ns / 1e9 if nxt_ns is not None else float("inf")
        # a switch down (several links) comes in port by port, each rerouted on its own: the
        # routes have settled at the last reroute before the next event
        dones = [c for c in ctl if c.get("event") == "reroute_done" and t_s <= c["t_mono"] < nxt]
        done = dones[-1] if dones else None
        seen = [c for c in ctl if c.get("event") == "port_status" and t_s <= c["t_mono"] < nxt]
        it = next((k for k, (a, b) in sorted(spans.items()) if a <= e["t_ns"] <= b), None)
        row = {"event": e["event"], "link": e["link"], "intfs": e["intfs"], "at_real_ns": e["at_real_ns"],
               "rate_bps": e.get("rate_bps"),
               "late_emulated_ns": e["late_ns"], "iteration": it,
               "port_status_messages": len(seen),
               "detect_emulated_ns": (seen[0]["t_mono"] - t_s) * 1e9 if seen else None,
               "reroute_emulated_ns": (done["t_mono"] - t_s) * 1e9 if done else None,
               "rerouted_switches": sorted({sw for c in dones for sw in c["switches"]}),
               "reroutes": len(dones),
               "flows_changed": sum(c["flows"] for c in dones), "groups_added": sum(c["groups"] for c in dones),
               "dropped_packets": _dropped(ports, {*e["intfs"], *e.get("peers", ())}, e["t_ns"],
                                           nxt_ns)}
        for key in ("detect", "reroute"):
            v = row[f"{key}_emulated_ns"]
            row[f"{key}_real_ns"] = dilation.real_duration_ns(v) if v is not None else None
        rows.append(row)
        if it is not None:
            hit.setdefault(it, []).append(i)
    steps = {i["iteration"]: i["step_ns"] for i in iterations}
    calm = sorted(v for k, v in steps.items() if k not in hit)
    base = calm[len(calm) // 2] if calm else None
    for row in rows:
        step = steps.get(row["iteration"])
        row["iteration_step_ns"] = step
        row["other_iterations_median_step_ns"] = base
        row["stretch"] = step / base if step and base else None
    return rows


def _dropped(ports: list, intfs: set, start_ns: int, end_ns: int | None) -> int | None:
    """Packets the switches counted dropped (tx + rx) on the event's ports, both ends, from
    the last port-stats poll before the event to the last before the next event (or the
    run's end); None without polls. A lower bound of what the dead link lost: a packet
    already in a veth's queue when it went down is dropped by the kernel, not by OVS."""
    rows = [r for r in ports if r.get("intf") in intfs and "tx_dropped" in r]
    if not rows:
        return None

    def total(until_ns):
        last = {}
        for r in rows:
            if until_ns is None or r["t_ns"] <= until_ns:
                last[r["intf"]] = r
        return sum(r.get("tx_dropped", 0) + r.get("rx_dropped", 0) for r in last.values())

    return total(end_ns) - total(start_ns)


def _iteration_spans(records: list) -> dict:
    """Iteration -> (first op ready, last op end), CLOCK_MONOTONIC ns, over every GPU."""
    spans = {}
    for r in records:
        if r.get("type") != "op":
            continue
        a, b = spans.get(r["iteration"], (r["ready_ns"], r["end_ns"]))
        spans[r["iteration"]] = (min(a, r["ready_ns"]), max(b, r["end_ns"]))
    return spans


def sentence(rows: list, transport: dict, fmt_d) -> str:
    """What the failures cost, for the terminal summary."""
    parts = []
    for r in rows:
        where = f"in iteration {r['iteration'] + 1}" if r["iteration"] is not None else "between iterations"
        if r["event"] == "link_slow":
            took = "the routes kept sending traffic over it (nothing went down, nothing was rerouted)"
            what = f"slowed to {r['rate_bps'] / 1e9:g} Gbit/s"
        elif r.get("rate_bps") and not r["port_status_messages"]:  # up after a slow: it never went down
            took = "nothing to reroute"
            what = f"back at {r['rate_bps'] / 1e9:g} Gbit/s"
        else:
            took = (f"the controller rerouted {len(r['rerouted_switches'])} switches in "
                    f"{fmt_d(r['reroute_real_ns'])} of fabric time" if r["reroute_real_ns"] is not None else
                    "no reroute was recorded")
            what = r["event"].split("_")[1] + (f" (at {r['rate_bps'] / 1e9:g} Gbit/s again)" if r.get("rate_bps")
                                               else "")
        stretch = (f"; that iteration took x{r['stretch']:.2f} the others' median" if r["stretch"] else "")
        dropped = f"; the switches dropped {r['dropped_packets']} packets on it" if r.get("dropped_packets") else ""
        parts.append(f"link {r['link']} {what} {where}: {took}{dropped}{stretch}")
    lost = (f" {transport.get('retransmitted', 0)} packets were retransmitted ({transport.get('timeouts', 0)} "
            f"timeouts)." if transport else "")
    return "Link events: " + "; ".join(parts) + "." + lost
