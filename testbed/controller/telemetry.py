"""Telemetry decisions and record formats, pure. Every ``interval`` the controller writes,
into the run folder as JSON lines:

- ``ports.jsonl``: every switch's OpenFlow port counters, one record per port, with
  ``duration_ns``: the switch's own clock when it read them (OpenFlow's port-stats
  duration, the time since the port was added; OVS counts it in milliseconds). Rates are
  counter deltas over these times, not over when the reply reached the controller (a reply
  handled late made a 400G port look like 424G);
- ``ecn.jsonl``: per-link ECN codepoint counters (the table-0 counting flows of
  ``routing``), one record per (switch port the packets arrived on, codepoint);
- ``queues.jsonl``: every switch port's egress queue: the marker's counters (packets,
  ECT, marked, drops, control packets), the shadow depth now and its maximum since the
  previous poll (bursts shorter than the interval are not lost), the data class TBF's
  own counters (backlog, sent, drops) and the port's PFC counters (frames sent and
  received, paused time, headroom high-water: the PFC process keeps them in the run's
  ``testbed_pfc`` map);
- ``polls.jsonl``: one line per poll (when, how long the reads took, polls skipped
  because the collector fell behind, the host's CPU busy fraction and ovs-vswitchd's
  CPU in cores since the previous poll): the fidelity guard's input.

The interval is set in real-fabric time and dilated (10 us of the real fabric at the
default dilation of 50000 is a poll every 0.5 s of the emulation), so a report shows the
same number of samples per real microsecond whatever the dilation.
"""

from __future__ import annotations

from testbed.wire import bpfmaps
from testbed.controller.routing import COUNT_TABLE, ECN_CODEPOINTS

DEFAULT_INTERVAL_REAL_NS = 10_000
COUNTERS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors",
            "tx_errors")
LOCAL_PORT = 0xFFFFFFFE  # OFPP_LOCAL: the bridge's own interface, not a fabric port
UNAVAILABLE = 2 ** 64 - 1  # what OVS reports for a counter it cannot read (a port being removed)


class Poller:
    """When the next poll is due (monotonic ns); polls that fall behind are skipped, not
    bunched (a late controller must not flood the switches)."""

    def __init__(self, interval_ns: int, now_ns: int):
        self.interval_ns = interval_ns
        self.next_ns = now_ns
        self.skipped = 0

    def due(self, now_ns: int) -> bool:
        if now_ns < self.next_ns:
            return False
        behind = (now_ns - self.next_ns) // self.interval_ns
        self.skipped += behind
        self.next_ns += (behind + 1) * self.interval_ns
        return True

    def wait_s(self, now_ns: int) -> float:
        return max(0.0, (self.next_ns - now_ns) / 1e9)


def port_records(now_ns: int, switch: str, stats) -> list:
    """One record per fabric port from an OpenFlow port-stats reply body (objects with
    ``port_no``, ``duration_sec``/``duration_nsec`` and the counters, as os-ken parses them)."""
    out = []
    for s in stats:
        if s.port_no >= LOCAL_PORT or s.tx_bytes == UNAVAILABLE or s.rx_bytes == UNAVAILABLE:
            continue
        rec = {"t_ns": now_ns, "switch": switch, "port": s.port_no, "intf": f"{switch}-eth{s.port_no}",
               "duration_ns": s.duration_sec * 1_000_000_000 + s.duration_nsec}
        rec.update({c: getattr(s, c) for c in COUNTERS})
        out.append(rec)
    return out


def ecn_records(now_ns: int, switch: str, stats) -> list:
    """Per-link ECN codepoint counters from a table-0 flow-stats reply body (objects with
    ``table_id``, ``match`` and ``stats`` mappings, as os-ken parses OpenFlow 1.5): one
    record per counting flow, named by the switch port the packets arrived on."""
    out = []
    for s in stats:
        if s.table_id != COUNT_TABLE or "ip_ecn" not in s.match or "in_port" not in s.match:
            continue
        port = s.match["in_port"]
        out.append({"t_ns": now_ns, "switch": switch, "port": port, "intf": f"{switch}-eth{port}",
                    "ecn": ECN_CODEPOINTS[s.match["ip_ecn"]],
                    "packets": s.stats["packet_count"] if "packet_count" in s.stats else 0,
                    "bytes": s.stats["byte_count"] if "byte_count" in s.stats else 0})
    return out


def queue_record(now_ns: int, pq, state: dict | None, tbf: dict | None, pfc: dict | None = None,
                 rate_bps: float | None = None) -> dict:
    """One switch port's egress queue at ``now_ns``: ``pq`` is the plan's ``PortQueue``,
    ``rate_bps`` the emulated rate in force (the marker's config: a link event may have
    slowed the port; the plan's when not given),
    ``state`` the marker's counters (``marker.Counters.read``; None before the first
    packet), ``tbf`` the data class TBF's counters (``qdiscstat``), ``pfc`` the PFC
    process's counters for the port (``bpfmaps.pfc_counters``; None before its first
    event): frames sent and received, paused time up to ``now_ns``, headroom high-water."""
    rate = pq.emulated_rate_bps if rate_bps is None else rate_bps
    rec = {"t_ns": now_ns, "switch": pq.switch, "port": pq.port, "intf": pq.intf,
           "emulated_rate_now_bps": rate}
    if state is None:
        rec.update({k: 0 for k in ("depth_bytes", "max_depth_bytes", "packets", "bytes", "ect", "marked", "drops",
                                   "control_packets", "trimmed")})
    else:
        rec["depth_bytes"] = int(bpfmaps.shadow_depth_now(state, rate, now_ns))
        rec.update({k: state[k] for k in ("max_depth_bytes", "packets", "bytes", "ect", "marked", "drops",
                                          "control_packets", "trimmed")})
    if tbf is not None:
        rec.update(tbf_backlog_bytes=tbf.get("backlog_bytes", 0), tbf_sent_bytes=tbf.get("sent_bytes", 0),
                   tbf_drops=tbf.get("drops", 0))
    p = pfc or {}
    since = p.get("paused_since_ns", 0)
    rec.update(pfc_frames_sent=p.get("frames_sent", 0), pfc_xoff_sent=p.get("xoff_sent", 0),
               pfc_frames_received=p.get("frames_received", 0),
               pfc_paused_ns=p.get("paused_ns", 0) + (max(0, now_ns - since) if since else 0),
               pfc_headroom_high_water_bytes=p.get("headroom_high_water_bytes", 0))
    return rec


def host_cpu_ticks(proc_stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat (idle and iowait are not busy)."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


def process_cpu_ticks(pid_stat: str) -> int:
    """utime + stime clock ticks of a process (all its threads) from /proc/PID/stat."""
    after_comm = pid_stat[pid_stat.rindex(")") + 2:].split()
    return int(after_comm[11]) + int(after_comm[12])


class CpuMeter:
    """CPU use between two calls: the host's busy fraction (0-1 over every core) and a
    process's use in cores (1.0 = one core all the time)."""

    def __init__(self, ticks_per_s: float):
        self.hz = ticks_per_s
        self.last = None

    def sample(self, now_ns: int, host: tuple[int, int], proc_ticks: int | None) -> dict:
        prev, self.last = self.last, (now_ns, host, proc_ticks)
        if prev is None:
            return {}
        t0, (busy0, total0), p0 = prev
        out = {}
        if host[1] > total0:
            out["host_busy"] = round((host[0] - busy0) / (host[1] - total0), 4)
        if proc_ticks is not None and p0 is not None and now_ns > t0:
            out["ovs_cpu_cores"] = round((proc_ticks - p0) / self.hz / ((now_ns - t0) / 1e9), 4)
        return out
