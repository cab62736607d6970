"""``testbed show chakra:PREFIX``: what a Chakra trace holds, before anything runs (no root)."""

from __future__ import annotations

from testbed.config import traces
from testbed.units import format_duration, format_size


def render(prefix: str, groups_file: str | None = None) -> str:
    trace = traces.load(prefix, groups_file)
    traces.check(trace)
    s = traces.summary(trace)
    out = [f"chakra trace {prefix}: {s['ranks']} ranks (files {trace.ranks[0].file} .. {trace.ranks[-1].file}), "
           f"schema version {', '.join(v or '(none)' for v in s['versions'])}"]
    out.append("  nodes: " + ", ".join(f"{n} {kind}" for kind, n in sorted(s["nodes"].items())))
    for name, c in sorted(s["collectives"].items()):
        out.append(f"  {name:14} {c['count']:5} nodes, {format_size(c['bytes'])} in all (buffer sizes summed over "
                   f"the ranks)")
    if s["send_bytes"]:
        out.append(f"  point to point: {format_size(s['send_bytes'])} sent in all")
    if s["groups"]:
        out.append(f"  process groups ({s['groups_file']}): " + "; ".join(
            f"{name}: {' '.join(map(str, members))}" for name, members in sorted(s["groups"].items())[:8])
            + (f"; ... {len(s['groups'])} in all" if len(s["groups"]) > 8 else ""))
    out.append(f"  critical path: {format_duration(s['critical_path_compute_ns'])} of compute (rank "
               f"{s['critical_path_rank']}'s longest dependency chain; communication not counted)")
    return "\n".join(out)
