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

MAX_WAIT_S = 1.0  # the deadline is checked at least this often (every other event wakes the loop)


def wait_readable(socks, timeout_s: float) -> list:
    """The sockets of ``socks`` readable within ``timeout_s``: select(2), whose timeout has
    microsecond resolution (epoll's and poll's are whole milliseconds: a wake up to 1 ms late
    is 0.06 packet gaps of 400G at D = 200000; a 32-GPU run waiting with epoll had its agents'
    pacing lateness at 0.045 gaps, where select's runs read 0.017-0.025)."""
    return select.select(socks, [], [], timeout_s)[0]


def serve(agents: list, start_ns: int, deadline_ns: int, control=None, clock=time.monotonic_ns,
          wait=wait_readable) -> int:
    """Runs every agent's ops from ``start_ns`` (CLOCK_MONOTONIC ns): 0 once all are done,
    3 if the run closed ``control`` (our stdin) first, 4 past ``deadline_ns``.

    Each pass steps the agents whose next event is due or whose sockets are readable, then
    waits until the earliest next event or a readable socket (a wait of 0 when one is due
    already: every pass learns which sockets have data, so a step reads only those)."""
    for a in agents:
        a.prepare(start_ns)
    while clock() < start_ns:
        time.sleep(max(0.0, (start_ns - clock()) / 1e9))
    # the run's stdin is waited on with the sockets: its end (the run stopping us) wakes the loop
    socks = [s for a in agents for s in (a.rx, a.pause)] + ([control] if control is not None else [])
    due = {a: start_ns for a in agents}
    live = [a for a in agents if a.remaining]
    ready: set = set()
    while live:
        now = clock()
        if now > deadline_ns:
            for a in live:
                a.abort("deadline", now)
            return 4
        if control is not None and control in ready and not control.readline():
            for a in live:
                a.abort("stopped by the run", now)
            return 3
        for a in agents:
            rx, pause = a.rx in ready, a.pause in ready
            if a.remaining:
                if rx or pause or now >= due[a]:
                    due[a] = a.step(clock(), rx, pause)
            elif rx or pause:
                # done while the server's other GPUs are not: keep answering peers that still
                # send to it (a retransmission after a lost ACK), as ``linger`` does, or a
                # peer's send, and what depends on it in the other GPUs, would wait for us
                t = clock()
                a.receive(t)
                a.receive_pause(t)
        live = [a for a in live if a.remaining]
        if live:
            timeout = (min(due[a] for a in live) - clock()) / 1e9
            ready = set(wait(socks, min(max(timeout, 0.0), MAX_WAIT_S)))
    return 0


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
