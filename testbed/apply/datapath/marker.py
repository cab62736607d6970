"""The run's ECN/WRED marker: the compiled ``bpf/marker.c`` loaded once and pinned, with
its maps and its second program (``steer_nic``, adaptive routing at the GPU NICs), under the run's own bpffs folder ``/sys/fs/bpf/testbed/<run id>/``, and
removed again at teardown (``clean`` removes the folders of dead runs).

The object is built by the install step (``scripts/install.sh``) into ``build/``.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
from pathlib import Path

from testbed.wire import bpfmaps
from testbed.apply.datapath import bpfmap
from testbed.model import queues
from testbed.errors import RunError
from testbed.paths import MARKER_OBJECT

LOG = logging.getLogger(__name__)
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "testbed"
OBJECT = MARKER_OBJECT
CMD_TIMEOUT_S = 30
EPOCH_SIZE = 8  # testbed_epoch: one u64


def ensure_bpffs():
    """Mount bpffs at /sys/fs/bpf if nothing is mounted there (it stays mounted)."""
    with open("/proc/mounts") as f:
        if any(line.split()[1] == str(BPFFS) and line.split()[2] == "bpf" for line in f):
            return
    subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True, capture_output=True,
                   timeout=CMD_TIMEOUT_S)


class Marker:
    """Context manager: load and pin the marker for one run; per-port configuration and reads."""

    def __init__(self, run_id: str):
        self.dir = PIN_ROOT / run_id
        self.prog_fd = -1
        self.cfg: bpfmap.Map | None = None
        self.state: bpfmap.Map | None = None
        self.counters: Counters | None = None

    def __enter__(self):
        if not OBJECT.exists():
            raise RunError(f"{OBJECT} is missing: build it with scripts/install.sh (needs clang and libbpf-dev)")
        ensure_bpffs()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            # every program of the object (the marker; steer_nic for adaptive routing) and
            # every map, pinned in the run's folder
            subprocess.run(["bpftool", "prog", "loadall", str(OBJECT), str(self.dir), "type", "classifier",
                            "pinmaps", str(self.dir)], check=True, capture_output=True, text=True,
                           timeout=CMD_TIMEOUT_S)
            self.prog_fd = bpfmap.obj_get(str(self.dir / "marker"))
            self.cfg = bpfmap.Map(str(self.dir / "testbed_cfg"), bpfmaps.CFG_SIZE)
            self.counters = Counters(self.dir)
            self.state = self.counters.state
        except subprocess.CalledProcessError as exc:
            self.__exit__(None, None, None)
            raise RunError(f"loading {OBJECT} failed: {exc.stderr.strip()[-500:]}") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for m in (self.cfg, self.counters):
            if m is not None:
                m.close()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
        remove_pins(self.dir)
        return False

    def configure(self, ifindex: int, pq: queues.PortQueue):
        """(Re)configure a port: its counters start from zero."""
        self.state.delete(ifindex)
        self.cfg.update(ifindex, bpfmaps.marker_cfg(pq))

    def read(self, ports) -> dict[int, dict]:
        return self.counters.read(ports)


class Counters:
    """The counters of a run's ports from its pinned maps: what the collector reads every
    interval. The reader that owns the epoch map (one per run: the controller) gets
    ``max_depth_bytes`` as the maximum since its previous read."""

    def __init__(self, pins: Path):
        self.state = bpfmap.Map(str(pins / "testbed_state"), bpfmaps.STATE_SIZE)
        try:
            self.epoch_map = bpfmap.Map(str(pins / "testbed_epoch"), EPOCH_SIZE)
        except BaseException:
            self.state.close()
            raise
        raw = self.epoch_map.lookup(0)
        self.epoch = struct.unpack("=Q", raw)[0] if raw else 0

    def close(self):
        self.state.close()
        self.epoch_map.close()

    def read(self, ifindexes) -> dict[int, dict]:
        """Counters of every port. The epoch is bumped first: the first packet of the new
        epoch moves the finished epoch's maximum aside, so no burst between two reads is
        lost. Ports that have seen no packet yet read as None."""
        self.epoch += 1
        self.epoch_map.update(0, struct.pack("=Q", self.epoch))
        out = {}
        for ifindex in ifindexes:
            raw = self.state.lookup(ifindex, lock=True)
            if raw is None:
                out[ifindex] = None
                continue
            s = bpfmaps.marker_state(raw)
            # if a packet already opened the new epoch, the finished epoch's max is prev_max
            s["max_depth_bytes"] = (s["prev_max_depth_bytes"] if s["epoch"] == self.epoch
                                    else max(s["max_depth_bytes"], s["depth_bytes"]))
            out[ifindex] = s
        return out


def remove_pins(path: Path):
    """Unpin a run's program and maps (the kernel frees them once nothing uses them)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
