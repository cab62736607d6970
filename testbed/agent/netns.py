"""Entering a GPU's network namespace for a moment (``setns(2)``), so one process can open
the sockets of every GPU of a server: a socket stays in the namespace it was created in."""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(pid: int):
    """The calling thread in the network namespace of process ``pid`` (a Mininet host's
    shell), back in its own on exit, whatever happens inside."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
