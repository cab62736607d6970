"""Send UDP datagrams of ``--size`` bytes (Ethernet frame size) to DST:PORT at ``--rate-bps``
for ``--seconds``, with IP TOS ``--tos`` (2 = ECT(0)), paced; prints how many were sent.
A full socket buffer (ENOBUFS/EAGAIN) is back-pressure: the datagram is retried, not lost."""

import argparse
import errno
import json
import socket
import time

HEADERS = 14 + 20 + 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dst")
    ap.add_argument("--port", type=int, default=4791)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--rate-bps", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--tos", type=int, default=2)
    args = ap.parse_args()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, args.tos)
    payload = bytes(args.size - HEADERS)
    gap = args.size * 8 / args.rate_bps
    sent = 0
    start = next_send = time.monotonic()
    while next_send < start + args.seconds:
        time.sleep(max(0.0, next_send - time.monotonic()))  # pacing
        try:
            s.sendto(payload, (args.dst, args.port))
        except OSError as exc:
            if exc.errno in (errno.ENOBUFS, errno.EAGAIN):
                continue  # back-pressure: try the same datagram again
            raise
        sent += 1
        next_send += gap
    print(json.dumps({"sent": sent}))


if __name__ == "__main__":
    main()
