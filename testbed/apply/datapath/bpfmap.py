"""Pinned BPF maps and programs from Python, through the bpf(2) system call (no
shelling out per read): open a pinned object, look up, update, delete, iterate, and
run a program on a test packet (BPF_PROG_TEST_RUN).

Value layouts are declared as ``struct`` formats next to the C source they mirror
(``bpf/marker.c``); ``queues.MarkerCfg``/``MarkerState`` use them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET = 7
BPF_PROG_TEST_RUN = 10
BPF_ANY = 0
BPF_F_LOCK = 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    pass


def _bpf(cmd: int, attr: bytes | ctypes.Array) -> int:
    nr = _SYSCALL_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"bpf(2) syscall number unknown for {platform.machine()}")
    buf = attr if isinstance(attr, ctypes.Array) else ctypes.create_string_buffer(attr, len(attr))
    ret = _libc.syscall(nr, cmd, buf, len(buf))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"bpf(cmd={cmd}): {os.strerror(err)}")
    return ret


def obj_get(path: str) -> int:
    """File descriptor of a pinned map or program."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    attr = struct.pack("=QII", ctypes.addressof(p), 0, 0) + bytes(112)
    try:
        return _bpf(BPF_OBJ_GET, attr)
    except BpfError as exc:
        raise BpfError(exc.errno, f"cannot open pinned BPF object {path}: {os.strerror(exc.errno)}") from None


class Map:
    """A pinned hash map with ``u32`` keys (or a struct key given as bytes) and fixed-size
    values (bytes in, bytes out)."""

    def __init__(self, path: str, value_size: int):
        self.path, self.value_size = path, value_size
        self.fd = obj_get(path)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _elem(self, cmd: int, key: int | bytes, value: ctypes.Array | None, flags: int = 0) -> int:
        raw = struct.pack("=I", key) if isinstance(key, int) else key
        k = ctypes.create_string_buffer(raw, len(raw))
        attr = struct.pack("=IIQQQ", self.fd, 0, ctypes.addressof(k),
                           ctypes.addressof(value) if value is not None else 0, flags) + bytes(96)
        return _bpf(cmd, attr)

    def lookup(self, key: int | bytes, lock: bool = False) -> bytes | None:
        v = ctypes.create_string_buffer(self.value_size)
        try:
            self._elem(BPF_MAP_LOOKUP_ELEM, key, v, BPF_F_LOCK if lock else 0)
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return v.raw

    def update(self, key: int | bytes, value: bytes):
        if len(value) != self.value_size:
            raise ValueError(f"value is {len(value)} bytes, map {self.path} holds {self.value_size}")
        self._elem(BPF_MAP_UPDATE_ELEM, key, ctypes.create_string_buffer(value, len(value)), BPF_ANY)

    def delete(self, key: int | bytes) -> bool:
        try:
            self._elem(BPF_MAP_DELETE_ELEM, key, None)
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def keys(self) -> list[int]:
        out, prev = [], None
        while True:
            nxt = ctypes.create_string_buffer(4)
            k = ctypes.create_string_buffer(struct.pack("=I", prev), 4) if prev is not None else None
            attr = struct.pack("=IIQQQ", self.fd, 0, ctypes.addressof(k) if k is not None else 0,
                               ctypes.addressof(nxt), 0) + bytes(96)
            try:
                _bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except BpfError as exc:
                if exc.errno == errno.ENOENT:
                    return out
                raise
            prev = struct.unpack("=I", nxt.raw)[0]
            out.append(prev)


def prog_test_run(prog_fd: int, packet: bytes, ctx: bytes | None = None, repeat: int = 1) -> tuple[int, bytes, int]:
    """Run a program on ``packet`` (optionally with a ``struct __sk_buff`` context):
    (return value, packet after the run, average duration in ns)."""
    data_in = ctypes.create_string_buffer(packet, len(packet))
    data_out = ctypes.create_string_buffer(len(packet) + 256)
    ctx_in = ctypes.create_string_buffer(ctx, len(ctx)) if ctx else None
    # union bpf_attr.test: prog_fd, retval, data_size_in, data_size_out, data_in, data_out,
    # repeat, duration, ctx_size_in, ctx_size_out, ctx_in, ctx_out, flags, cpu, batch_size
    attr = ctypes.create_string_buffer(struct.pack(
        "=IIIIQQIIIIQQIII", prog_fd, 0, len(packet), len(data_out), ctypes.addressof(data_in),
        ctypes.addressof(data_out), repeat, 0, len(ctx) if ctx else 0, 0,
        ctypes.addressof(ctx_in) if ctx_in is not None else 0, 0, 0, 0, 0) + bytes(40))
    _bpf(BPF_PROG_TEST_RUN, attr)
    fields = struct.unpack_from("=IIIIQQII", attr.raw)
    retval, size_out, duration = fields[1], fields[3], fields[7]
    return retval, data_out.raw[:size_out], duration
