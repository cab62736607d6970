"""Cost of the ECN/WRED marker (a benchmark, not a test). As root:

    .venv/bin/python bench/marker.py [--seconds 3] [--repeat 3]

1. ns per packet inside the kernel (BPF_PROG_TEST_RUN, 200000 runs each) for: a minimal
   tc program (r0 = 0; exit) as the baseline, the marker on a port it does not manage,
   on a managed port below Kmin, and on a managed port above Kmax (marking: the CE
   rewrite and checksum fix); then, from 20000 single runs each (a VLAN push changes the
   packet a repeated run reuses), adaptive routing's decision: the GPU NIC's steer_nic
   without and with a 4-port choice, and the marker making the next switch's 2-port choice,
   next to the baseline and the plain marker measured the same way.
2. Forwarding through a veth pair between two namespaces made here, with and without
   the marker on the sender's egress (settings that never mark or drop), alternated:
   TCP throughput and 64-byte UDP packet rate (iperf3), medians and the ratio.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.wire import bpfmaps
from testbed.apply.datapath import bpfmap
from testbed.model import queues
from testbed.apply.datapath.marker import Marker
from testbed.apply.processes.probe import checksum
from testbed.apply.processes.child import wait_for

BPF_PROG_LOAD = 5
BPF_PROG_TYPE_SCHED_CLS = 3
RUNS = 200_000
SINGLE_RUNS = 20_000


def minimal_prog() -> int:
    insns = bytes.fromhex("b700000000000000" "9500000000000000")  # r0 = 0; exit
    buf = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("=IIQQIIQ", BPF_PROG_TYPE_SCHED_CLS, 2, ctypes.addressof(buf), ctypes.addressof(lic),
                       0, 0, 0) + bytes(120)
    return bpfmap._bpf(BPF_PROG_LOAD, attr)


def packet(tos: int, size: int = 1000) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, size - 14, 1, 0, 64, 17, 0, bytes([10, 0, 1, 2]),
                     bytes([10, 0, 1, 1]))
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    return bytes(12) + b"\x08\x00" + ip + bytes(size - 34)


def ctx(ifindex: int) -> bytes:
    return bytes(40) + struct.pack("=I", ifindex) + bytes(148)


def port(rate_bps, buffer, kmin, kmax, pmax=0.5) -> queues.PortQueue:
    return queues.PortQueue(switch="b", port=1, intf="x", peer="y", rate_bps=rate_bps, emulated_rate_bps=rate_bps,
                            buffer_bytes=buffer, ecn=True, kmin_bytes=kmin, kmax_bytes=kmax, pmax=pmax, pfc=False,
                            xoff_bytes=0, xon_bytes=0, headroom_bytes=0, headroom_formula_bytes=0,
                            burst_bytes=1 << 40, fifo_limit_bytes=buffer, delay_ns=0, emulated_delay_ns=0)


def in_kernel(m: Marker):
    base = minimal_prog()
    print(f"in-kernel cost per 1000-byte packet (BPF_PROG_TEST_RUN x {RUNS}):")
    rows = [("minimal tc program (baseline)", base, 1, 0)]
    m.configure(1, port(8e12, 1 << 50, 1 << 49, 1 << 49))  # lo: huge rate, never marks
    rows.append(("marker, port not managed", m.prog_fd, 2, 0))
    rows.append(("marker, managed, below Kmin", m.prog_fd, 1, 2))
    results = {}
    for name, fd, ifindex, tos in rows:
        _, _, ns = bpfmap.prog_test_run(fd, packet(tos), ctx(ifindex), repeat=RUNS)
        results[name] = ns
    m.configure(1, port(8, 1 << 50, 0, 0))  # 8 bit/s: the queue never drains, every ECT packet is marked
    _, out, ns = bpfmap.prog_test_run(m.prog_fd, packet(2), ctx(1), repeat=RUNS)
    assert out[15] & 3 == 3
    results["marker, managed, marking CE"] = ns
    for name, ns in results.items():
        print(f"  {name:50} {ns:6d} ns   ({ns - results['minimal tc program (baseline)']:+d} ns vs baseline)")
    single = adaptive_routing(m)
    for name, ns in single.items():
        print(f"  {name:50} {ns:6d} ns   ({ns - single['single runs: minimal tc program']:+d} ns vs baseline)")


def single_runs_ns(fd: int, pkt: bytes, context: bytes, n: int = SINGLE_RUNS) -> int:
    """Median in-kernel time of ``n`` separate runs of one packet: a program that pushes a
    VLAN tag changes the packet it is given, and BPF_PROG_TEST_RUN's repeat reuses it."""
    return int(statistics.median(bpfmap.prog_test_run(fd, pkt, context)[2] for _ in range(n)))


def adaptive_routing(m: Marker) -> dict:
    """Adaptive routing's decision (fabric.routing: adaptive), each row from single runs
    (``single_runs_ns``) next to the baseline and the plain marker measured the same way:
    the GPU NIC's program without and with an entry of 4 candidate ports (4 shadow-queue
    reads, a VLAN push), and the marker when it also makes the next switch's choice of 2."""
    out = {}
    steer = bpfmap.obj_get(str(m.dir / "steer_nic"))
    table = bpfmap.Map(str(m.dir / "testbed_steer"), bpfmaps.STEER_SIZE)
    base = minimal_prog()
    try:
        m.configure(1, port(8e12, 1 << 50, 1 << 49, 1 << 49))
        candidates = [(900 + i, 5 + i) for i in range(4)]
        for idx, _ in candidates:
            m.configure(idx, port(8e12, 1 << 50, 1 << 49, 1 << 49))
        out["single runs: minimal tc program"] = single_runs_ns(base, packet(2), ctx(1))
        out["single runs: marker, below Kmin"] = single_runs_ns(m.prog_fd, packet(2), ctx(1))
        out["single runs: steer_nic, no decision entry"] = single_runs_ns(steer, packet(2), ctx(1))
        # packet(): 10.0.1.2 -> 10.0.1.1
        table.update(bpfmaps.steer_key(0, "10.0.1.2", "10.0.1.0/24"), bpfmaps.steer_choice(candidates))
        out["single runs: steer_nic, choice of 4 + VLAN push"] = single_runs_ns(steer, packet(2), ctx(1))
        table.update(bpfmaps.steer_key(1, None, "10.0.1.0/24"), bpfmaps.steer_choice(candidates[:2]))
        out["single runs: marker + next switch's choice of 2"] = single_runs_ns(m.prog_fd, packet(2), ctx(1))
        tagged = bpfmaps.steer_counters(table.lookup(bpfmaps.steer_key(0, "10.0.1.2", "10.0.1.0/24")))
        assert tagged["decisions"] == SINGLE_RUNS, tagged  # every run really chose and pushed
    finally:
        table.close()
        os.close(steer)
        os.close(base)
    return out


def sh(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120, **kw)


@contextmanager
def veth_pair():
    a, b = f"tbA{uuid.uuid4().hex[:6]}", f"tbB{uuid.uuid4().hex[:6]}"
    sh(["ip", "netns", "add", a])
    try:
        sh(["ip", "netns", "add", b])
        try:
            sh(["ip", "-n", a, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb", "netns", b])
            sh(["ip", "-n", a, "addr", "add", "192.168.77.1/24", "dev", "va"])
            sh(["ip", "-n", b, "addr", "add", "192.168.77.2/24", "dev", "vb"])
            sh(["ip", "-n", a, "link", "set", "va", "up"])
            sh(["ip", "-n", b, "link", "set", "vb", "up"])
            yield a, b
        finally:
            sh(["ip", "netns", "del", b])
    finally:
        sh(["ip", "netns", "del", a])


def iperf(a, b, seconds, udp):
    server = subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: "LISTEN" in subprocess.run(["ip", "netns", "exec", b, "ss", "-ltn", "sport", "= :5201"],
                                                    capture_output=True, text=True, timeout=10).stdout,
                 10, "iperf3 to listen")
        argv = ["ip", "netns", "exec", a, "iperf3", "-c", "192.168.77.2", "-t", str(seconds), "-J"]
        if udp:
            argv += ["-u", "-b", "0", "-l", "22"]  # 22-byte payload: 64-byte frames
        res = json.loads(sh(argv).stdout)
    finally:
        server.wait(timeout=30)
    if udp:
        s = res["end"]["sum"]
        return (s["packets"] - s["lost_packets"]) / s["seconds"]
    return res["end"]["sum_received"]["bits_per_second"]


def forwarding(m: Marker, seconds: float, repeat: int):
    with veth_pair() as (a, b):
        ifindex = int(sh(["ip", "-n", a, "-j", "link", "show", "va"]).stdout and
                      json.loads(sh(["ip", "-n", a, "-j", "link", "show", "va"]).stdout)[0]["ifindex"])
        m.configure(ifindex, port(8e12, 1 << 50, 1 << 49, 1 << 49))
        results = {"without": {"tcp": [], "udp": []}, "with": {"tcp": [], "udp": []}}
        for _ in range(repeat):
            for mode in ("without", "with"):
                if mode == "with":
                    # `tc -n` remounts /sys (hiding bpffs): attach from a child that only joins the netns
                    sh([sys.executable, __file__, "--attach", a, "va", str(m.dir / "marker")])
                results[mode]["tcp"].append(iperf(a, b, seconds, udp=False))
                results[mode]["udp"].append(iperf(a, b, seconds, udp=True))
                if mode == "with":
                    sh(["tc", "-n", a, "qdisc", "del", "dev", "va", "clsact"])
        counted = bpfmaps.marker_state(m.state.lookup(ifindex, lock=True))["packets"]
    print(f"forwarding over a veth pair, medians of {repeat} alternated runs of {seconds}s "
          f"(marker saw {counted} packets):")
    for kind, unit, scale in (("tcp", "Gbit/s", 1e9), ("udp", "kpps (64 B)", 1e3)):
        wo, wi = statistics.median(results["without"][kind]), statistics.median(results["with"][kind])
        print(f"  {kind}: without {wo / scale:8.2f} {unit}   with {wi / scale:8.2f} {unit}   ratio {wi / wo:.3f}")


def attach(netns: str, intf: str, pinned: str):
    """In a child process: join ``netns`` (network namespace only) and attach the pinned marker."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{netns}") as f:
        if libc.setns(f.fileno(), 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
    from testbed.apply.datapath.tc import PortTc

    with PortTc() as tc:
        tc.attach_marker(intf, bpfmap.obj_get(pinned))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--attach", nargs=3, metavar=("NETNS", "INTF", "PINNED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attach:
        attach(*args.attach)
        return
    with Marker(f"bench-{uuid.uuid4().hex[:8]}") as m:
        in_kernel(m)
        forwarding(m, args.seconds, args.repeat)


if __name__ == "__main__":
    main()
