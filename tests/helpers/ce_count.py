"""Count IPv4/UDP frames to ``--port`` arriving on ``--intf`` (AF_PACKET) until standard input
closes (or ``--seconds`` pass): total, CE-marked, ECT, frames whose IP header checksum is
wrong, and the socket's own drops. Prints JSON."""

import argparse
import json
import select
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from testbed.apply.processes.probe import checksum

ETH_P_IP = 0x0800
SOL_PACKET, PACKET_STATISTICS = 263, 6
SO_RCVBUFFORCE = 33


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--intf", required=True)
    ap.add_argument("--port", type=int, default=4791)
    ap.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args()
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)  # root: beyond rmem_max
    s.bind((args.intf, 0))
    print("ready", flush=True)
    counts = {"udp": 0, "ce": 0, "ect": 0, "bad_ip_checksum": 0}
    end = time.monotonic() + args.seconds
    closing = False
    while (left := end - time.monotonic()) > 0:
        # once the test closed our input, read what is already queued on the socket, then stop
        ready = select.select([s] if closing else [s, sys.stdin], [], [], 0.2 if closing else left)[0]
        if not closing and sys.stdin in ready and not sys.stdin.readline():
            closing = True
            continue
        if s not in ready:
            if closing:
                break
            continue
        frame, addr = s.recvfrom(65535)
        if addr[2] == socket.PACKET_OUTGOING or len(frame) < 42:
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0xF) * 4
        if ip[9] != 17 or struct.unpack("!H", ip[ihl + 2:ihl + 4])[0] != args.port:
            continue
        counts["udp"] += 1
        counts["ce"] += (ip[1] & 3) == 3
        counts["ect"] += (ip[1] & 3) in (1, 2)
        counts["bad_ip_checksum"] += checksum(ip[:ihl]) != 0
    counts["socket_drops"] = struct.unpack("=II", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
