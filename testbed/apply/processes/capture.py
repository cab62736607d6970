"""``run --pcap PORTS``: bounded packet captures of chosen ports into the run folder.

A port is a switch port (``leaf1-eth1``, captured in the root namespace where switch
ports live) or a GPU's NIC (``h1-eth0`` fabric, ``h1-eth1`` NVLink, captured in the
GPU's namespace). Each capture keeps whole frames (Wireshark's RoCE dissector checks
the length the headers announce, so cut frames show as malformed) and at most
``MAX_PACKETS`` of them (~100 MB at 4 KB), so a long run cannot fill the disk. ``Captures`` is a context manager: tcpdump processes are started on entry,
confirmed to be writing, and stopped (SIGINT, then by PID) on exit.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from testbed.errors import ConfigError, RunError
from testbed.apply.processes.child import wait_for

MAX_PACKETS = 25_000
START_TIMEOUT_S = 10
STOP_TIMEOUT_S = 10
HOST_PORT = re.compile(r"(h\d+)-eth([01])")


def parse_ports(text: str, plan) -> list:
    """``"leaf1-eth1,h1-eth0"`` -> the ports, checked against the plan (bad names: exit 2)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    switch_ports = {f"{lk.a}-eth{lk.a_port}" for lk in plan.fabric_links} | \
                   {f"{lk.b}-eth{lk.b_port}" for lk in plan.fabric_links}
    hosts = {h.name: h for h in plan.hosts}
    bad = []
    for name in names:
        m = HOST_PORT.fullmatch(name)
        if name in switch_ports and not m:
            continue
        if m and m.group(1) in hosts and (m.group(2) == "0" or hosts[m.group(1)].nvlink_ip):
            continue
        bad.append(name)
    if bad or not names:
        raise ConfigError(f"--pcap: {', '.join(bad) or text!r}: expected switch ports (leaf1-eth1) or GPU NICs "
                          f"(h1-eth0, h1-eth1), comma-separated; `testbed show` lists them")
    return names


class Captures:
    def __init__(self, fabric, ports: list, out_dir: Path, record):
        self.fabric, self.ports, self.out_dir, self.record = fabric, ports, out_dir, record
        self.procs = {}

    def __enter__(self):
        self.out_dir.mkdir(exist_ok=True)
        try:
            for port in self.ports:
                path = self.out_dir / f"{port}.pcap"
                argv = ["tcpdump", "-n", "-i", port, "-s", "0", "-c", str(MAX_PACKETS), "-U", "-w", str(path)]
                m = HOST_PORT.fullmatch(port)
                if m:
                    proc = self.fabric.host(m.group(1)).popen(argv, stdout=subprocess.DEVNULL,
                                                              stderr=subprocess.PIPE)
                else:
                    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                self.procs[port] = proc
                self.record.add(processes=[proc.pid])

                def started(path=path, proc=proc, port=port):
                    if proc.poll() is not None:
                        raise RunError(f"tcpdump on {port} exited: {proc.stderr.read().decode().strip()}")
                    return path.exists()

                wait_for(started, START_TIMEOUT_S, f"tcpdump on {port} to open {path.name}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for port, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for port, proc in self.procs.items():
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        return False
