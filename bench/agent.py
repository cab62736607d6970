"""GPU agent send rate on one core: the agent's hot path (a template built once, patched
per packet: PSN, opcode, ICRC) vs Scapy building and sending every packet (``sendp``)
vs a bare raw-socket loop resending one prebuilt frame, measured side by side in one run
(a benchmark, not a test).

    .venv/bin/python bench/agent.py [--seconds 3]   (as root)

Runs in a network namespace of its own with a veth pair (removed at the end): frames
go out of one end and are dropped by the other. Prints packets/s of 4154-byte RoCE
frames (4096-byte payload) and the ratio to the bare loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(seconds: float) -> dict:
    """In the namespace: each sender for ``seconds``; returns packets/s."""
    import socket

    from testbed.wire import roce

    a, b = roce.Endpoint("02:00:00:00:00:01", "10.9.0.1"), roce.Endpoint("02:00:00:00:00:02", "10.9.0.2")
    payload = bytes(4096)
    tmpl = roce.FrameTemplate(a, b, 0xC001, roce.qpn(1, 2), len(payload), roce.DSCP_DATA, roce.ECT0)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind(("bn0", 0))
    out = {}

    def loop(send_one, duration):
        n, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            for _ in range(64):
                send_one(n)
                n += 1
        return n / duration

    def safe_send(frame):
        try:
            sock.send(frame)
        except BlockingIOError:
            pass

    frame = tmpl.frame(roce.OP_SEND_MIDDLE, 0, False, payload)
    out["bare raw socket"] = loop(lambda n: safe_send(frame), seconds)
    out["agent hot path"] = loop(lambda n: safe_send(tmpl.frame(roce.OP_SEND_MIDDLE, n & roce.PSN_MASK,
                                                                n % 8 == 7, payload)), seconds)
    # the agent's Channel.data_frame (template lookup by entropy and payload, then the patch
    # above), one QP keeping its port (flow) and one spraying a new port per packet
    from types import SimpleNamespace

    from testbed.agent.channel import Channel
    from testbed.agent.transport import Packet

    nic = SimpleNamespace(link="fabric", me=a, line_bps=400e9)
    peer = {"index": 2, "mac": b.mac, "ip": b.ip}
    for mode in ("flow", "spray"):
        from testbed.agent.dcqcn import Params
        from testbed.units import Dilation

        agent = SimpleNamespace(index=1, mtu=4096, params=Params(), cfg={"dcqcn": False}, balance=mode,
                                spray_packets=1, flowlet_gap_ns=0, kind="roce", d=Dilation(1))
        ch = Channel(agent, "h2", peer, nic)
        pkts = [Packet(psn, roce.OP_SEND_MIDDLE, 4096, psn % 8 == 7, 0, False) for psn in range(1024)]
        out[f"agent Channel.data_frame, {mode}"] = loop(
            lambda n: safe_send(ch.data_frame(pkts[n & 1023], payload, n)), seconds)
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.sendrecv import sendp

    def scapy_one(n):
        sendp(Ether(src=a.mac, dst=b.mac) / IP(src=a.ip, dst=b.ip, tos=0x6A) / UDP(sport=0xC001, dport=4791, chksum=0)
              / BTH(opcode=roce.OP_SEND_MIDDLE, dqpn=roce.qpn(1, 2), psn=n & roce.PSN_MASK) / Raw(payload),
              iface="bn0", verbose=False)

    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        scapy_one(n)
        n += 1
    out["Scapy sendp per packet"] = n / seconds
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        print(json.dumps(measure(args.seconds)))
        return 0
    if os.geteuid() != 0:
        print("bench/agent.py needs root (a network namespace)", file=sys.stderr)
        return 1
    ns = f"tbbench-{uuid.uuid4().hex[:8]}"
    run = lambda *a: subprocess.run(list(a), check=True, timeout=30, capture_output=True)  # noqa: E731
    run("ip", "netns", "add", ns)
    try:
        run("ip", "-n", ns, "link", "add", "bn0", "mtu", "4200", "type", "veth", "peer", "name", "bn1", "mtu", "4200")
        run("ip", "-n", ns, "link", "set", "bn0", "up")
        run("ip", "-n", ns, "link", "set", "bn1", "up")
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside", "--seconds",
                              str(args.seconds)], check=True, timeout=300, capture_output=True, text=True)
        rates = json.loads(res.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=30)
    bare = rates["bare raw socket"]
    print(f"{'sender (4154-byte RoCE frames, one core)':42} {'packets/s':>10} {'vs bare':>8} {'Gbit/s':>7}")
    for name, pps in rates.items():
        print(f"{name:42} {pps:>10.0f} {pps / bare:>8.3f} {pps * 4154 * 8 / 1e9:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
