"""What this machine can do: root, kernel qdiscs and BPF, netem, OVS datapaths, tools,
Python packages. ``testbed doctor`` prints it; ``run`` uses it to choose the datapath.

Kernel features are tested for real where that is the only reliable way: qdiscs
are tried on a veth pair inside a throw-away network namespace that is removed
again on any exit.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CMD_TIMEOUT_S = 20
QDISCS = ("mq", "tbf", "bfifo", "clsact", "netem", "red", "prio")  # a run uses mq, tbf, bfifo, clsact, netem
INSTALL_FIX = "bash scripts/install.sh (./lab runs it)"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None = could not be determined
    detail: str
    fix: str = ""
    required: bool = True


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, **kw)


def is_root() -> bool:
    return os.geteuid() == 0


def ovs_kernel_datapath() -> bool:
    """The openvswitch kernel module is loaded (or can be loaded now)."""
    if Path("/sys/module/openvswitch").exists():
        return True
    if Path("/proc/modules").exists() and shutil.which("modprobe") and is_root():
        _run(["modprobe", "openvswitch"])
        return Path("/sys/module/openvswitch").exists()
    return False


def choose_datapath(requested: str) -> str:
    """``auto`` -> ``kernel`` where openvswitch.ko exists, else ``user`` (netdev)."""
    if requested == "auto":
        return "kernel" if ovs_kernel_datapath() else "user"
    return requested


@contextmanager
def scratch_namespace():
    """A veth pair in a temporary namespace, removed on exit."""
    ns = f"tbdoctor-{uuid.uuid4().hex[:8]}"
    _run(["ip", "netns", "add", ns], check=True)
    try:
        # two TX queues, as the fabric's links have (mq needs a multi-queue device)
        _run(["ip", "-n", ns, "link", "add", "d0", "numtxqueues", "2", "numrxqueues", "2", "type", "veth", "peer",
              "name", "d1", "numtxqueues", "2", "numrxqueues", "2"], check=True)
        yield ns
    finally:
        _run(["ip", "netns", "del", ns])


def qdisc_support() -> dict[str, bool]:
    args = {"mq": [], "tbf": ["rate", "1mbit", "burst", "10k", "latency", "10ms"],
            "bfifo": ["limit", "10000"], "clsact": [], "netem": ["delay", "1ms"],
            "red": ["limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000", "burst", "55",
                    "probability", "0.1", "bandwidth", "10mbit", "ecn"],
            "prio": []}
    out = {}
    with scratch_namespace() as ns:
        for q in QDISCS:
            where = ["clsact"] if q == "clsact" else ["root", q]
            res = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "d0", *where, *args[q]])
            out[q] = res.returncode == 0
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "d0", where[0]])
    return out


TUNNELS = {"gretap": ["type", "gretap", "local", "192.0.2.1", "remote", "192.0.2.2"],
           "vxlan": ["type", "vxlan", "id", "1", "local", "192.0.2.1", "remote", "192.0.2.2", "dstport", "4789"]}


def tunnel_support() -> dict[str, bool]:
    """Which kernel tunnel devices (with the two TX queues a switch port has) can be made:
    a cross-server link is one, a switch port on each side (docs/cluster.md)."""
    out = {}
    with scratch_namespace() as ns:
        for kind, args in TUNNELS.items():
            out[kind] = _run(["ip", "-n", ns, "link", "add", f"t{kind}", "numtxqueues", "2", "numrxqueues", "2",
                              *args]).returncode == 0
    return out


def tool_version(argv) -> str | None:
    """First line a tool prints about its version; None if it is not installed."""
    if not shutil.which(argv[0]):
        return None
    res = _run(argv)
    text = (res.stdout or res.stderr).strip().splitlines()
    return text[0] if text else "present"


def _sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return "?"


def vswitchd_packet_sndbuf() -> int | None:
    """Send buffer of ovs-vswitchd's AF_PACKET socket: with the userspace datapath every
    packet waiting in any switch port's qdisc is charged to it, and OVS drops what does
    not fit. None if OVS has not opened it (or ``ss`` cannot tell)."""
    if not shutil.which("ss"):
        return None
    res = _run(["ss", "-0", "-m", "-p"])
    lines = res.stdout.splitlines()
    for i, line in enumerate(lines):
        if '"ovs-vswitchd"' in line:
            for text in (line, lines[i + 1] if i + 1 < len(lines) else ""):
                for token in text.replace("(", ",").replace(")", ",").split(","):
                    if token.startswith("tb") and token[2:].isdigit():
                        return int(token[2:])
    return None


def checks() -> list[Check]:
    root = is_root()
    items = [Check("root", root, "running as root" if root else f"uid {os.geteuid()}",
                   "run as root (sudo python3 -m testbed ...)")]
    items.append(Check("kernel", True, f"Linux {platform.release()}"))
    if root:
        q = qdisc_support()
        for name in ("mq", "tbf", "bfifo", "clsact"):
            items.append(Check(f"qdisc {name}", q[name], "available" if q[name] else "missing",
                               "a kernel with CONFIG_NET_SCH_" + name.upper()))
        items.append(Check("qdisc netem", q["netem"],
                           "available: link delay is emulated" if q["netem"] else
                           "missing: runs continue without link delay and say so",
                           "a kernel with sch_netem (the lab VM has it)", required=False))
        items.append(Check("qdisc red", q["red"], "available (not used: marking is done in BPF)"
                           if q["red"] else "missing (not needed: marking is done in BPF)", fix="", required=False))
        t = tunnel_support()
        items.append(Check("tunnels", any(t.values()), ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in t.items())
                           + " (cross-server links, docs/cluster.md)", "a kernel with ip_gre or vxlan",
                           required=False))
    else:
        items.append(Check("qdiscs", None, "not tested (needs root)", "run doctor as root"))
    from testbed.apply.datapath.marker import OBJECT

    items.append(Check("marker object", OBJECT.exists(), str(OBJECT) if OBJECT.exists() else "not built",
                       INSTALL_FIX))
    btf = Path("/sys/kernel/btf/vmlinux").exists()
    items.append(Check("BTF", btf, "/sys/kernel/btf/vmlinux" if btf else "missing",
                       "a kernel with CONFIG_DEBUG_INFO_BTF", required=False))
    for tool, argv, pkg in (("clang", ["clang", "--version"], "clang"),
                            ("bpftool", ["bpftool", "version"], "bpftool"),
                            ("ovs-vsctl", ["ovs-vsctl", "--version"], "openvswitch-switch"),
                            ("mnexec", ["mnexec", "-v"], "mininet"),
                            ("ethtool", ["ethtool", "--version"], "ethtool"),
                            ("tcpdump", ["tcpdump", "--version"], "tcpdump"),
                            ("tshark", ["tshark", "--version"], "tshark")):
        v = tool_version(argv)
        items.append(Check(tool, v is not None, v or "not found", f"apt-get install {pkg} ({INSTALL_FIX})",
                           required=tool not in ("clang", "tshark", "tcpdump")))
    ovs_up = shutil.which("ovs-vsctl") is not None and _run(["ovs-vsctl", "--timeout=5", "show"]).returncode == 0
    items.append(Check("OVS running", ovs_up, "ovsdb-server and ovs-vswitchd answer" if ovs_up else "not answering",
                       "/usr/share/openvswitch/scripts/ovs-ctl start (scripts/install.sh does it)"))
    sndbuf = vswitchd_packet_sndbuf()
    need = 16 * 1024 * 1024
    items.append(Check("OVS packet socket", None if sndbuf is None else sndbuf >= need,
                       "not opened yet (sized from net.core.wmem_default "
                       f"= {_sysctl('net.core.wmem_default')} when OVS first sends)" if sndbuf is None else
                       f"send buffer {sndbuf} bytes: room for about {sndbuf // 2} bytes queued fabric-wide "
                       "(userspace datapath)",
                       "scripts/install.sh (raises net.core.wmem_default and restarts OVS while no bridge exists)",
                       required=False))
    from testbed.apply import speed

    probe = speed.measure()
    items.append(Check("machine speed", True, f"{probe.us_per_packet:.1f} us per packet of the GPU agents' work, "
                       f"x{probe.ratio:.2f} the {probe.reference_us_per_packet} us of the machine kind the automatic "
                       f"dilation is calibrated on: a run multiplies it by {probe.slowdown:g}", required=False))
    kdp = ovs_kernel_datapath()
    items.append(Check("OVS kernel datapath", kdp, "openvswitch.ko loaded" if kdp else
                       "no openvswitch.ko: the userspace (netdev) datapath is used",
                       "a kernel with the openvswitch module (the lab VM)", required=False))
    for mod, pkg in (("mininet", "mininet (Debian package)"), ("os_ken", "os-ken"), ("pyroute2", "pyroute2"),
                     ("scapy", "scapy"), ("yaml", "PyYAML"), ("pandas", "pandas"), ("plotly", "plotly")):
        found = importlib.util.find_spec(mod) is not None
        items.append(Check(f"python: {mod}", found, "importable" if found else "missing",
                           f"{INSTALL_FIX} ({pkg})"))
    return items


def summary(items: list[Check]) -> list[str]:
    """What a run will use, from the checks."""
    by = {c.name: c for c in items}
    datapath = "kernel" if by["OVS kernel datapath"].ok else "userspace (netdev)"
    netem = by.get("qdisc netem")
    lines = [f"datapath: OVS {datapath}"]
    if netem is not None:
        lines.append("link delay: " + ("emulated with netem" if netem.ok else "NOT emulated (no netem)"))
    missing = [c.name for c in items if c.required and c.ok is False]
    lines.append("ready to run" if not missing else f"cannot run yet: missing {', '.join(missing)}")
    return lines
