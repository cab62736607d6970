"""Send ``--packets`` UDP datagrams on each of ``--flows`` source ports to DST:4791, round
robin over the flows, paced at one datagram per ``--gap-us`` so the emulated fabric is
not overrun. Run inside a GPU host namespace by the ECMP test; flows differ only in
UDP source port."""

import argparse
import socket
import time

BASE_PORT = 49152


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dst")
    ap.add_argument("--flows", type=int, default=24)
    ap.add_argument("--packets", type=int, default=20)
    ap.add_argument("--gap-us", type=float, default=500)
    args = ap.parse_args()
    socks = []
    for i in range(args.flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", BASE_PORT + i))
        socks.append(s)
    gap_s = args.gap_us / 1e6
    next_send = time.monotonic()
    for _ in range(args.packets):
        for s in socks:
            next_send += gap_s
            time.sleep(max(0.0, next_send - time.monotonic()))  # pacing
            s.sendto(b"x" * 64, (args.dst, 4791))
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
