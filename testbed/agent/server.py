"""The agents of one server's GPUs in one process: one event loop steps each agent when its
next event is due or one of its sockets is readable.

Why one process per server and not per GPU (docs/measurements.md, "Scale"): with one
Python process per GPU, each wake-up of an agent found its process cache-cold, and the
agents' CPU per packet grew with the number of processes (217 us at 32 GPUs, ~950 at 128
on 2 cores). Each agent keeps its own sockets (opened in its GPU's namespace), records and
clocks; only the waiting is shared.
"""

from __future__ import annotations

import select
import time

CONTROL_CHECK_NS = 10_000_000  # how often a busy loop looks whether the run closed our stdin
MAX_WAIT_S = 0.05


def wait_readable(socks, timeout_s: float) -> list:
    return select.select(socks, [], [], timeout_s)[0]


def serve(agents: list, start_ns: int, deadline_ns: int, control=None, clock=time.monotonic_ns,
          wait=wait_readable) -> int:
    """Runs every agent's ops from ``start_ns`` (CLOCK_MONOTONIC ns): 0 once all are done,
    3 if the run closed ``control`` (our stdin) first, 4 past ``deadline_ns``."""
    for a in agents:
        a.prepare(start_ns)
    while clock() < start_ns:
        time.sleep(max(0.0, (start_ns - clock()) / 1e9))
    owner = {s: a for a in agents for s in (a.rx, a.pause)}
    due = {a: start_ns for a in agents}
    woken: set = set()
    next_control_check = 0
    while True:
        live = [a for a in agents if a.remaining]
        if not live:
            return 0
        now = clock()
        if now > deadline_ns:
            for a in live:
                a.abort("deadline", now)
            return 4
        if control is not None and now >= next_control_check:
            next_control_check = now + CONTROL_CHECK_NS
            if select.select([control], [], [], 0)[0] and not control.readline():
                for a in live:
                    a.abort("stopped by the run", now)
                return 3
        for a in agents:
            if a.remaining:
                if a in woken or now >= due[a]:
                    due[a] = a.step(clock())
            elif a in woken:
                # done while the server's other GPUs are not: keep answering peers that still
                # send to it (a retransmission after a lost ACK), as ``linger`` does, or a
                # peer's send, and what depends on it in the other GPUs, would wait for us
                t = clock()
                a.receive(t)
                a.receive_pause(t)
        pending = [due[a] for a in live if a.remaining]
        woken = set()
        if pending:
            timeout = (min(pending) - clock()) / 1e9
            if timeout > 0:
                woken = {owner[s] for s in wait(list(owner), min(timeout, MAX_WAIT_S))}


def linger(agents: list, control, clock=time.monotonic_ns):
    """Every op is done; peers may still retransmit into us (a lost ACK): keep answering
    until the run closes our stdin, which it does once every agent is done."""
    owner = {a.rx: a for a in agents}
    while True:
        readable, _, _ = select.select([*owner, control], [], [], 1.0)
        for s in readable:
            if s in owner:
                owner[s].receive(clock())
        if control in readable and not control.readline():
            return
