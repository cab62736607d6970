"""Reachability probe, run inside a GPU host's namespace.

``python -m testbed.apply.processes.probe --timeout 5 10.0.1.2 10.0.2.1 ...`` sends ICMP echo
requests to every target (repeating every ``--resend`` seconds, 200 ms unless the run
says otherwise, until each has answered or the timeout passes) and prints one JSON object: target -> TTL of its reply (or null).
The switches decrement TTL at every hop, so 64 - TTL is the number of switches
the reply crossed: the run compares it with the planned path length.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time

RESEND_S = 0.2


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes = b"testbed-probe") -> bytes:
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    return struct.pack("!BBHHH", 8, 0, checksum(header + payload), ident, seq) + payload


def parse_reply(packet: bytes, ident: int):
    """(source address, TTL) of an echo reply to us, or None. ``packet`` starts at the IP header."""
    ihl = (packet[0] & 0x0F) * 4
    if len(packet) < ihl + 8:
        return None
    icmp_type, _, _, rid, _ = struct.unpack("!BBHHH", packet[ihl:ihl + 8])
    if icmp_type != 0 or rid != ident:
        return None
    return socket.inet_ntoa(packet[12:16]), packet[8]


def probe(targets: list[str], timeout_s: float, resend_s: float = RESEND_S) -> dict:
    ident = os.getpid() & 0xFFFF
    answers: dict[str, int | None] = {t: None for t in targets}
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        deadline = time.monotonic() + timeout_s
        seq = 0
        while time.monotonic() < deadline and any(v is None for v in answers.values()):
            seq += 1
            for t in targets:
                if answers[t] is None:
                    sock.sendto(echo_request(ident, seq), (t, 0))
            resend_at = min(deadline, time.monotonic() + resend_s)
            while (wait := resend_at - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], wait)
                if not ready:
                    break
                reply = parse_reply(sock.recv(65535), ident)
                if reply and reply[0] in answers and answers[reply[0]] is None:
                    answers[reply[0]] = reply[1]
    return answers


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m testbed.apply.processes.probe")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to keep trying")
    parser.add_argument("--resend", type=float, default=RESEND_S, help="seconds between rounds")
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    json.dump(probe(args.targets, args.timeout, args.resend), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
