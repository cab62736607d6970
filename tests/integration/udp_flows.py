"""Send ``--packets`` UDP datagrams on each of ``--flows`` source ports to DST:4791.
Run inside a GPU host namespace by the ECMP test; flows differ only in source port."""

import argparse
import socket

BASE_PORT = 49152


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dst")
    ap.add_argument("--flows", type=int, default=24)
    ap.add_argument("--packets", type=int, default=20)
    args = ap.parse_args()
    for i in range(args.flows):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("0.0.0.0", BASE_PORT + i))
            for _ in range(args.packets):
                s.sendto(b"x" * 64, (args.dst, 4791))


if __name__ == "__main__":
    main()
