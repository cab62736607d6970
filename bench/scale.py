"""Where a run's CPU goes, by process group and by stage, and whether the fidelity guard
trusts the run (issue 16: find the cost before removing it). A benchmark, not a test.

    .venv/bin/python bench/scale.py [--scenario FILE] [--dilation D ...] [--set PATH=VALUE ...]
                                    [--profile DIR]   (as root)

(The default, rail-32, trains a 32-rank ring; docs/measurements.md's first scale rows used a
scenario file with ``topology: rail-4x8`` and ``traffic: dp-ring``, what rail-32 now is.)

For each dilation, one whole run in this process (``testbed.run.stages.Run``). A sampler
thread reads /proc every ``--interval`` seconds: the host's busy ticks (/proc/stat), each
thread of ovs-vswitchd (the userspace datapath forwards every non-PMD port's packets on its
main thread, so that thread is named apart from the handlers and revalidators), and every
process descended from this one, grouped by what it runs (GPU agents, reachability probes,
the os-ken controller with its collector, the PFC process, Mininet's host shells and the
commands it runs, this process). The stages are marked by the run itself (bring-up, program, reachability, training,
teardown, report). Printed per stage: its wall time and the cores each group used on average;
"kernel+gone" is the host's busy time no live process accounted for (softirq forwarding on
veths, processes that ended between samples). Then per run the fidelity verdict and each
check's value, and the p95 of ovs-vswitchd's cores over the training stage (what the guard's
``ovs_cpu`` check reads). Reading /proc costs this process a few percent of a core; it is in
the "runner" column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import run as runs  # noqa: E402
from testbed.analysis import results as run_results  # noqa: E402
from testbed.config import scenario  # noqa: E402
from testbed.controller import telemetry  # noqa: E402
from testbed.controller.collector import OVS_PIDFILE  # noqa: E402
from testbed.run import stages  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
GROUPS = ("ovs-fwd", "ovs-other", "agents", "probes", "controller", "pfc", "mininet", "runner", "kernel+gone")


def _stat(path: Path) -> tuple[str, int, int] | None:
    """(comm, ppid, utime + stime ticks) of /proc/PID/stat or /proc/PID/task/TID/stat."""
    try:
        text = path.read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    rest = text[text.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[11]) + int(rest[12])


def _group(pid: int, me: int) -> str:
    if pid == me:
        return "runner"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "mininet"
    text = b" ".join(argv)
    if b"testbed.agent" in text:
        return "agents"
    if b"testbed.controller" in text or b"osken" in text:
        return "controller"
    if b"testbed.apply.processes.pfcd" in text:
        return "pfc"
    if b"testbed.apply.processes.probe" in text:
        return "probes"
    return "mininet"


class Sampler(threading.Thread):
    """Ticks per group between samples, added to the stage in force."""

    def __init__(self, interval_s: float):
        super().__init__(daemon=True)
        self.interval_s, self.me = interval_s, os.getpid()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.stage, self.stage_t = "start", time.monotonic()
        self.ticks = defaultdict(lambda: defaultdict(int))  # stage -> group -> ticks
        self.wall = defaultdict(float)  # stage -> seconds
        self.order: list[str] = []
        self.ovs_fwd_cores: dict[str, list] = defaultdict(list)  # stage -> per-sample cores of ovs' main thread
        self.last: dict = {}  # (kind, id) -> ticks
        self.last_host = None
        self.last_t = None
        self.ovs_pid = int(OVS_PIDFILE.read_text().strip())

    def _descendants(self) -> dict[int, int]:
        """pid -> ticks of every process under this one (and this one)."""
        parent, ticks = {}, {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            s = _stat(Path(entry.path) / "stat")
            if s is not None:
                parent[int(entry.name)] = s[1]
                ticks[int(entry.name)] = s[2]
        out = {}
        for pid in ticks:
            p, hops = pid, 0
            while p and p != self.me and hops < 64:
                p, hops = parent.get(p, 0), hops + 1
            if p == self.me:
                out[pid] = ticks[pid]
        return out

    def sample(self):
        with self.lock:
            now = time.monotonic()
            host_busy, _ = telemetry.host_cpu_ticks(Path("/proc/stat").read_text())
            seen = {}
            fwd = 0
            for task in os.scandir(f"/proc/{self.ovs_pid}/task"):
                s = _stat(Path(task.path) / "stat")
                if s is not None:
                    kind = "ovs-fwd" if s[0] == "ovs-vswitchd" else "ovs-other"
                    seen[("ovs", int(task.name), kind)] = s[2]
            for pid, t in self._descendants().items():
                seen[("proc", pid, None)] = t
            stage = self.stage
            total = 0
            for key, t in seen.items():
                d = t - self.last.get(key, t)  # a new process counts from its first sample
                if d <= 0:
                    continue
                total += d
                group = key[2] if key[0] == "ovs" else _group(key[1], self.me)
                self.ticks[stage][group] += d
                if group == "ovs-fwd":
                    fwd += d
            if self.last_host is not None:
                self.ticks[stage]["kernel+gone"] += max(0, host_busy - self.last_host - total)
                if now > self.last_t:
                    self.ovs_fwd_cores[stage].append(fwd / HZ / (now - self.last_t))
            self.last, self.last_host, self.last_t = seen, host_busy, now

    def mark(self, stage: str):
        self.sample()
        with self.lock:
            now = time.monotonic()
            self.wall[self.stage] += now - self.stage_t
            self.stage, self.stage_t = stage, now
            if stage not in self.order:
                self.order.append(stage)

    def run(self):
        while not self.stop_event.wait(self.interval_s):
            self.sample()


class ProfiledRun(stages.Run):
    """A run that tells the sampler which stage it is in."""

    def __init__(self, sc, options, sampler: Sampler):
        super().__init__(sc, options)
        self.sampler = sampler

    def bring_up(self, stack):
        self.sampler.mark("bring-up")
        super().bring_up(stack)
        stack.callback(self.sampler.mark, "teardown")  # runs first when the stack unwinds

    def program(self):
        self.sampler.mark("program")
        super().program()

    def check_reachability(self):
        self.sampler.mark("reachability")
        super().check_reachability()

    def train(self, stack):
        self.sampler.mark("training")
        super().train(stack)
        self.sampler.mark("after training")

    def report(self):
        self.sampler.mark("report")
        super().report()
        self.sampler.mark("end")


def p95(values: list) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]


def profile(name: str, sets: list, interval_s: float, results: Path) -> dict:
    sampler = Sampler(interval_s)
    sampler.start()
    try:
        result = ProfiledRun(scenario.load(name, sets), runs.RunOptions(results_dir=results), sampler).execute()
    finally:
        sampler.stop_event.set()
        sampler.join()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    r = run_results.load(result.run_dir)
    # packets through OVS (every switch port's transmissions, the whole run: the training's
    # dwarf the all-pairs check's) and packets the GPUs sent on the fabric
    last = r.ports.sort_values("t_ns").groupby("intf").tail(1) if not r.ports.empty else r.ports
    hops = int(last.tx_packets.sum()) if not last.empty else 0
    sent = int(r.qps.packets_sent.sum()) if not r.qps.empty else 0  # fabric and NVLink
    return {"sampler": sampler, "summary": summary, "manifest": result.manifest, "status": result.status,
            "packet_hops": hops, "packets_sent": sent}


def show(label: str, p: dict):
    s = p["sampler"]
    print(f"\n== {label}: {p['status']}, {p['manifest'].get('dilation_reason', '')}")
    print(f"{'stage':<15}{'wall s':>8}" + "".join(f"{g:>12}" for g in GROUPS) + f"{'busy cores':>12}")
    for stage in s.order:
        if stage == "end":
            continue
        wall = s.wall[stage]
        if wall < 0.1:  # (program, after training: too short to divide by)
            continue
        cores = {g: s.ticks[stage][g] / HZ / wall for g in GROUPS}
        print(f"{stage:<15}{wall:>8.1f}" + "".join(f"{cores[g]:>12.2f}" for g in GROUPS)
              + f"{sum(cores.values()):>12.2f}")
    fwd = s.ovs_fwd_cores.get("training", [])
    print(f"ovs-vswitchd forwarding thread in training: p95 {p95(fwd):.2f} cores over {len(fwd)} samples")
    t = s.ticks["training"]
    if p["packet_hops"] and p["packets_sent"]:
        print(f"training: {p['packets_sent']} packets sent (fabric and NVLink), {p['packet_hops']} packet-hops "
              f"through OVS (whole run): {t['ovs-fwd'] / HZ / p['packet_hops'] * 1e6:.1f} us of ovs-vswitchd's "
              f"forwarding thread per packet-hop; per packet sent {t['agents'] / HZ / p['packets_sent'] * 1e6:.1f} us "
              f"of agent CPU, {t['kernel+gone'] / HZ / p['packets_sent'] * 1e6:.1f} us of kernel")
    fid = p["summary"].get("fidelity", {})
    print(f"fidelity: {fid.get('text', '?')}")
    for c in fid.get("checks", []):
        print(f"  {c['name']:<16} {'ok' if c['ok'] else 'FAILED':<7} {c['value']}  {c.get('detail', '')}")
    jct = p["summary"].get("jct", {})
    if jct:
        print(f"mean step {jct.get('mean_step_ns', 0) / 1000:.1f} us emulated, JCT ratio {jct.get('mean_ratio')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="rail-32")
    ap.add_argument("--dilation", action="append", default=[], help="one run per value (default: the scenario's)")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="PATH=VALUE")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between /proc samples")
    ap.add_argument("--keep", metavar="DIR", help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--profile", metavar="DIR", help="run the agents under cProfile, one agents-GPU.prof per "
                    "server process in DIR (read with python -m pstats); profiling slows them, so the run's "
                    "timings and verdict are not the unprofiled run's")
    args = ap.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        os.environ["TESTBED_AGENT_PROFILE"] = str(Path(args.profile).resolve())
    dilations = args.dilation or [None]
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(args.keep or tmp)
        for d in dilations:
            sets = list(args.sets) + ([f"dilation={d}"] if d else [])
            show(f"{args.scenario} {' '.join(sets)}", profile(args.scenario, sets, args.interval, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
