"""Apply the training schedule: one GPU agent per host, started together, watched to the end.

``Training`` is a context manager: it writes each agent's configuration (its ops from
``schedule``, its peers, rates, dilation), starts the agents in their namespaces, waits
until every one has its sockets open, hands all of them the same start time (a little
in the future on CLOCK_MONOTONIC), and waits for every agent to finish its ops. On exit,
normal or not, it closes their stdin (their signal to stop) and ends any that remain,
by PID. ``summarise`` turns the agents' records into per-iteration and per-collective
results beside the analytical ideal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from testbed.wire import roce
from testbed.model import schedule
from testbed.errors import RunError
from testbed.apply.process import read_events, read_line, stderr_tail, stop_children
from testbed.paths import ROOT

READY_TIMEOUT_S = 120  # 8 agents importing Scapy at once take ~1 min under QEMU software emulation
START_MARGIN_S = 0.5
EXIT_TIMEOUT_S = 10
RTO_REAL_NS = 128_000  # retransmission timeout in real time (x dilation in the emulation)


class Training:
    def __init__(self, fabric, plan, workload, run_dir: Path, record, link_delay: bool = False):
        self.fabric, self.plan, self.workload, self.run_dir = fabric, plan, workload, run_dir
        self.record = record
        self.link_bps = plan.scenario.fabric.host_link.rate_bps
        self.latency_ns = self.max_ring_propagation_ns() if link_delay else 0
        self.ops, self.collectives = schedule.build_plan(workload, plan.hosts, self.link_bps,
                                                         plan.scenario.fabric.nvlink_rate_bps, self.latency_ns)
        self.procs = {}
        self.records_dir = run_dir / "agents"
        self.n = len(self.ops)

    # -- ideal -----------------------------------------------------------------------------
    def ideal(self) -> dict:
        """Real-time ideal of one iteration without overlap: the compute on the critical path
        (for a pipeline, (micro-batches + stages - 1) forward/backward slots: the GPipe/1F1B
        bubble), the tensor-parallel AllReduces of one rank, and one data-parallel group's
        collectives."""
        wl = self.workload
        first = [c for c in self.collectives if c["iteration"] == 0]
        dp = [c["ideal_ns"] for c in first if c["phase"] == "dp" and c.get("stage", 0) == 0
              and c.get("tp_rank", 0) == 0]
        if wl.pipeline > 1:
            compute = (wl.micro_batches + wl.pipeline - 1) * wl.compute_ns
            tp_count = 2 * wl.micro_batches
        else:
            compute, tp_count = wl.compute_ns, 2
        tp = [c["ideal_ns"] for c in first if c["phase"] == "tp"][:1] * tp_count if wl.tensor > 1 else []
        return {"link_bps": self.link_bps, "step_latency_ns": self.latency_ns, "compute_ns": compute,
                "tensor_parallel_ns": sum(tp), "data_parallel_ns": sum(dp),
                "iteration_ns": compute + sum(tp) + sum(dp)}

    def max_ring_propagation_ns(self) -> int:
        """Cable delay along the longest path between neighbours of the first data-parallel ring."""
        order = schedule.ranks(self.workload, self.plan.hosts)
        delay = {frozenset((link.a, link.b)): link.delay_ns for link in self.plan.fabric_links}
        worst = 0
        for i, a in enumerate(order):
            if order[(i + 1) % len(order)] == a:
                continue
            path = self.plan.ecmp_paths(a, order[(i + 1) % len(order)], limit=1)[0]
            names = [hop[0] for hop in path]
            worst = max(worst, sum(delay.get(frozenset(pair), 0) for pair in zip(names, names[1:])))
        return worst

    # -- processes -------------------------------------------------------------------------
    def __enter__(self):
        self.records_dir.mkdir(exist_ok=True)
        work = self.run_dir / "work"
        work.mkdir(exist_ok=True)
        hosts = {h.name: h for h in self.plan.hosts}
        line_bps = self.link_bps
        try:
            for name, ops in schedule.to_json(self.ops).items():
                h = hosts[name]
                peers = {o.name: {"index": o.index, "mac": o.mac, "ip": o.addr,
                                  "nvlink_mac": o.nvlink_mac if o.server == h.server else None,
                                  "nvlink_ip": o.nvlink_ip.split("/")[0] if o.nvlink_ip and o.server == h.server
                                  else None}
                         for o in self.plan.hosts if o.name != name}
                nics = {"fabric": {"intf": f"{name}-eth0", "mac": h.mac, "ip": h.addr, "line_bps": line_bps}}
                if h.nvlink_ip:
                    nics["nvlink"] = {"intf": f"{name}-eth1", "mac": h.nvlink_mac, "ip": h.nvlink_ip.split("/")[0],
                                      "line_bps": self.plan.scenario.fabric.nvlink_rate_bps}
                cfg = {"gpu": name, "index": h.index, "nics": nics,
                       "peers": peers, "dilation": self.plan.dilation.factor,
                       "mtu_bytes": self.workload.mtu_bytes, "dcqcn": self.workload.dcqcn,
                       "dcqcn_params": dict(self.workload.dcqcn_params), "rto_ns": RTO_REAL_NS,
                       "ops": ops, "records": str(self.records_dir / f"{name}.jsonl")}
                path = work / f"agent-{name}.json"
                path.write_text(json.dumps(cfg))
                proc = self.fabric.host(name).popen([sys.executable, "-m", "testbed.agent", str(path)],
                                                    cwd=str(ROOT), text=True, stdin=subprocess.PIPE,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                self.procs[name] = proc
                self.record.add(processes=[proc.pid])
            deadline = time.monotonic() + READY_TIMEOUT_S
            for name, proc in self.procs.items():
                line = read_line(proc, deadline, f"agent {name} to open its sockets")
                if line.strip() != "ready":
                    raise RunError(f"agent {name} did not start: {line.strip()} {stderr_tail(proc)}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def train(self, timeout_s: float, progress=None) -> float:
        """Start every agent on one deadline and wait until all are done; returns the start
        time (CLOCK_MONOTONIC ns). ``progress``: a ``Progress`` to update while waiting."""
        start_ns = time.monotonic_ns() + int(START_MARGIN_S * 1e9)
        deadline_ns = start_ns + int(timeout_s * 1e9)
        for proc in self.procs.values():
            proc.stdin.write(f"{start_ns} {deadline_ns}\n")
            proc.stdin.flush()
        end = time.monotonic() + timeout_s + START_MARGIN_S + 5
        for name, proc in self.procs.items():
            line = read_line(proc, end, f"agent {name} to finish its schedule",
                             tick=progress.tick if progress else None)
            if line.strip() != "done":
                raise RunError(f"agent {name} failed: {line.strip()} {stderr_tail(proc)}")
        if progress:
            progress.tick()
        return start_ns

    def __exit__(self, *exc):
        stop_children({f"agent {name}": proc for name, proc in self.procs.items()}, EXIT_TIMEOUT_S)
        return False


class Progress:
    """Training progress from the agents' records as they are written: ops done of all,
    iterations every GPU has finished, and what the newest op was doing. On a terminal a
    bar redrawn in place; otherwise one plain line per finished iteration."""

    BAR = 30

    def __init__(self, ops: dict, records_dir: Path, iterations: int, out=None):
        self.records_dir, self.iterations = records_dir, iterations
        self.out = out if out is not None else sys.stderr
        self.tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.total = sum(len(v) for v in ops.values())
        self.per_iteration: dict[int, int] = {}
        for lst in ops.values():
            for op in lst:
                self.per_iteration[op.iteration] = self.per_iteration.get(op.iteration, 0) + 1
        self.done_per_iteration: dict[int, int] = {}
        self.offsets: dict[Path, int] = {}
        self.done = 0
        self.now = ""
        self.reported = 0
        self.drawn = False  # a bar is on the terminal without its newline

    def close(self):
        """End a bar left unfinished (training failed or was interrupted)."""
        if self.drawn:
            self.out.write("\n")
            self.out.flush()
            self.drawn = False

    def poll(self):
        for path in sorted(self.records_dir.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # whole lines only
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") == "op":
                    self.done += 1
                    it = rec["iteration"]
                    self.done_per_iteration[it] = self.done_per_iteration.get(it, 0) + 1
                    self.now = rec["phase"] if rec["kind"] == "compute" else f"{rec['phase']} {rec['kind']}s"

    @property
    def iterations_done(self) -> int:
        n = 0
        while n < self.iterations and self.done_per_iteration.get(n, 0) >= self.per_iteration.get(n, 1):
            n += 1
        return n

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.BAR)
        return (f"training [{'#' * filled}{'.' * (self.BAR - filled)}] {frac:4.0%}  iteration "
                f"{min(self.iterations_done + 1, self.iterations)}/{self.iterations}  {self.now}")

    def tick(self):
        self.poll()
        if self.tty:
            self.out.write("\r" + self.line().ljust(90))
            self.drawn = self.done < self.total
            if not self.drawn:
                self.out.write("\n")
            self.out.flush()
            return
        while self.reported < self.iterations_done:
            self.reported += 1
            self.out.write(f"training: iteration {self.reported}/{self.iterations} done on every GPU "
                           f"({self.done}/{self.total} ops)\n")
            self.out.flush()


def load_records(records_dir: Path) -> list:
    """Every agent's records (a line cut short by an interrupted run is skipped)."""
    return [r for path in sorted(records_dir.glob("*.jsonl")) for r in read_events(path)]


def summarise(records: list, workload, collectives: list, ideal: dict, dilation: float) -> dict:
    """Per iteration: step time (real-fabric equivalent) vs ideal; per collective: time from
    the moment every member had entered it to the last member leaving it, vs its ideal,
    and for gradient collectives the bus bandwidth (nccl-tests definition) vs the link."""
    ops = [r for r in records if r.get("type") == "op"]
    qps = [r for r in records if r.get("type") == "qp"]
    gpus = {r["gpu"] for r in ops}
    iterations, out = [], []
    by_collective: dict[int, list] = {}
    for o in ops:
        if o["collective"] >= 0:
            by_collective.setdefault(o["collective"], []).append(o)
    for it in range(workload.iterations):
        mine = [o for o in ops if o["iteration"] == it]
        if not mine:
            break
        t0, t1 = min(o["ready_ns"] for o in mine), max(o["end_ns"] for o in mine)
        iterations.append({"iteration": it, "step_ns": (t1 - t0) / dilation, "ideal_ns": ideal["iteration_ns"],
                           "ratio": (t1 - t0) / dilation / ideal["iteration_ns"],
                           "complete": {o["gpu"] for o in mine} == gpus})
    for c in collectives:
        got = by_collective.get(c["id"], [])
        members = set(c["gpus"])
        if {o["gpu"] for o in got} != members:
            continue  # not every member got to it (an interrupted run)
        entered = max(min(o["ready_ns"] for o in got if o["gpu"] == g) for g in members)
        elapsed = (max(o["end_ns"] for o in got) - entered) / dilation
        row = {k: c[k] for k in ("id", "iteration", "phase", "algorithm", "bytes", "ranks") if k in c}
        row.update({k: c[k] for k in ("bucket", "stage", "tp_rank", "micro_batch", "when") if k in c})
        row["time_ns"] = elapsed
        if c.get("ideal_ns"):
            row.update(ideal_ns=c["ideal_ns"], ratio=elapsed / c["ideal_ns"])
        if c["phase"] == "dp" and elapsed > 0:
            busbw = schedule.bus_bandwidth_bps(c["bytes"], c["ranks"], elapsed, c["algorithm"])
            row.update(busbw_bps=busbw, busbw_of_line=busbw / ideal["link_bps"])
        out.append(row)
    totals = {k: sum(q.get(k, 0) for q in qps) for k in ("packets_sent", "retransmitted", "timeouts", "naks_sent",
                                                          "cnps_sent", "cnps_received", "ce_received", "dcqcn_cuts")}
    totals["nvlink_packets_sent"] = sum(q.get("packets_sent", 0) for q in qps if q.get("link") == "nvlink")
    nics = [r for r in records if r.get("type") == "nic"]
    totals["pause_frames_received"] = sum(n.get("pause_frames_received", 0) for n in nics)
    totals["paused_real_ns"] = sum(n.get("paused_ns", 0) for n in nics) / dilation
    return {"iterations": iterations, "collectives": out, "transport": totals, "ideal": ideal,
            "header_bytes_per_packet": roce.HEADER_BYTES}
