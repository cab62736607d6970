"""A switch's shared buffer as its memory management unit (MMU) accounts it, as pure data
and pure decisions: the reference model of issue 33's switch, which the datapath will
implement and be checked against (no root, no clock of its own: every decision takes
``now_ns`` and returns what happened).

The vocabulary is SONiC's config_db (BUFFER_POOL, BUFFER_PROFILE, BUFFER_PG, BUFFER_QUEUE),
the accounting that of ns-3 HPCC's ``SwitchMmu`` and of Broadcom-style shared-buffer
switches:

- A **pool** is shared memory, its ``size`` what is left of the switch's buffer after the
  reserved parts (every PG's and queue's ``size``, and every lossless PG's headroom) are
  carved out, as SONiC sizes ``ingress_lossless_pool`` and ``egress_lossy_pool``.
- Every packet is charged twice, as real switches do: to its **ingress priority group**
  (ingress port, PG) and to its **egress queue** (egress port, queue), each against its
  profile's pool. A packet enters only if both admit it.
- A PG or queue first fills its own reserve (the profile's ``size``), then takes shared
  bytes from its pool up to a **threshold**: static (``static_th``, bytes) or dynamic
  (``dynamic_th``: alpha = 2^dynamic_th times the pool's free bytes, Choudhury & Hahne; a
  queue alone in a pool settles at alpha / (1 + alpha) of it). dynamic_th -8 is alpha 0,
  7 and above no limit, as SAI reads them.
- A **lossless** PG (``xoff`` > 0) does not drop at its threshold: past it, XOFF goes out of
  its ingress port for its priority, and what arrives meanwhile (the cable's round trip,
  the peer's response, frames in flight) goes into the PG's **headroom** of ``xoff``
  bytes. A lossless packet dropped is one that found the headroom full. XON when the
  headroom is empty again and the shared bytes are ``xon_offset`` below the threshold
  (or zero).
- A **lossy** PG or queue drops what its threshold does not admit; drops are counted
  where they happened.

Releases follow HPCC's order (headroom first, then shared, then the reserve), so the
accounting needs only byte counters per PG, queue and pool, not a record per packet,
which is what a datapath can afford. Watermarks (highest shared, headroom and queue
bytes; a pool's highest use) are what SONiC's ``show priority-group watermark`` and
``show buffer_pool watermark`` print.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA_ZERO_TH = -8  # dynamic_th at or below: alpha 0 (no shared bytes)
ALPHA_INFINITE_TH = 7  # at or above: no limit


@dataclass(frozen=True)
class Pool:
    """A BUFFER_POOL: ``size_bytes`` of shared memory."""

    name: str
    size_bytes: int

    def __post_init__(self):
        if self.size_bytes < 0:
            raise ValueError(f"pool {self.name}: size {self.size_bytes} bytes is negative")


@dataclass(frozen=True)
class Profile:
    """A BUFFER_PROFILE: its pool, reserve (``size_bytes``), threshold (exactly one of
    ``dynamic_th`` and ``static_th_bytes``), and for a lossless PG its headroom
    (``xoff_bytes``) and resume offset (``xon_offset_bytes``). ``static_th_bytes`` caps
    the shared bytes, beyond the reserve."""

    name: str
    pool: str
    size_bytes: int = 0
    dynamic_th: int | None = None
    static_th_bytes: int | None = None
    xoff_bytes: int = 0
    xon_offset_bytes: int = 0

    def __post_init__(self):
        if (self.dynamic_th is None) == (self.static_th_bytes is None):
            raise ValueError(f"profile {self.name}: exactly one of dynamic_th and static_th, not "
                             f"{'both' if self.dynamic_th is not None else 'neither'}")
        for what in ("size_bytes", "xoff_bytes", "xon_offset_bytes"):
            if getattr(self, what) < 0:
                raise ValueError(f"profile {self.name}: {what} is negative")
        if self.static_th_bytes is not None and self.static_th_bytes < 0:
            raise ValueError(f"profile {self.name}: static_th is negative")

    @property
    def lossless(self) -> bool:
        return self.xoff_bytes > 0

    def threshold_bytes(self, pool_free_bytes: int) -> int | None:
        """How many shared bytes this PG or queue may hold now; None: no limit. Integer
        shifts, as a datapath computes alpha x free."""
        if self.static_th_bytes is not None:
            return self.static_th_bytes
        th = self.dynamic_th
        if th >= ALPHA_INFINITE_TH:
            return None
        if th <= ALPHA_ZERO_TH:
            return 0
        free = max(0, pool_free_bytes)
        return free << th if th >= 0 else free >> -th


@dataclass
class Usage:
    """One PG's or queue's bytes: ``used`` (reserve + shared), ``headroom``, their
    watermarks, drops."""

    profile: Profile
    used: int = 0
    headroom: int = 0
    shared_watermark: int = 0
    headroom_watermark: int = 0
    drops: int = 0
    dropped_bytes: int = 0
    paused: bool = False

    @property
    def shared(self) -> int:
        return max(0, self.used - self.profile.size_bytes)


@dataclass(frozen=True)
class Event:
    """What a decision caused: ``xoff`` / ``xon`` out of ``port`` for its priority group
    ``index``, or a ``drop`` (``where``: at the ``ingress`` PG or the ``egress`` queue
    ``index`` of ``port``)."""

    t_ns: int
    kind: str
    port: str
    index: int
    where: str = ""
    nbytes: int = 0


@dataclass
class Mmu:
    """One switch's buffer: pools, the profile of each ingress (port, PG) and of each
    egress (port, queue). ``admit`` and ``release`` are the only changes."""

    pools: dict
    pgs: dict  # (port, pg) -> Usage
    queues: dict  # (port, queue) -> Usage
    shared_used: dict = field(default_factory=dict)  # pool name -> shared bytes in use
    pool_watermark: dict = field(default_factory=dict)

    @classmethod
    def build(cls, pools, pg_profiles: dict, queue_profiles: dict) -> "Mmu":
        """From ``Pool``s and the BUFFER_PG / BUFFER_QUEUE maps: (port, index) -> Profile."""
        by_name = {p.name: p for p in pools}
        for (port, i), prof in [*pg_profiles.items(), *queue_profiles.items()]:
            if prof.pool not in by_name:
                raise ValueError(f"{port} {i}: profile {prof.name} names pool {prof.pool}, which is not defined "
                                 f"(pools: {', '.join(sorted(by_name)) or 'none'})")
        for (port, q), prof in queue_profiles.items():
            if prof.lossless:
                raise ValueError(f"{port} queue {q}: profile {prof.name} has xoff: headroom belongs to an ingress PG")
        return cls(pools=by_name, pgs={k: Usage(p) for k, p in pg_profiles.items()},
                   queues={k: Usage(p) for k, p in queue_profiles.items()},
                   shared_used={n: 0 for n in by_name}, pool_watermark={n: 0 for n in by_name})

    def threshold_bytes(self, usage: Usage) -> int | None:
        pool = usage.profile.pool
        return usage.profile.threshold_bytes(self.pools[pool].size_bytes - self.shared_used[pool])

    # -- decisions ---------------------------------------------------------------------
    def admit(self, now_ns: int, ingress: tuple, egress: tuple, nbytes: int) -> tuple[bool, list]:
        """A packet of ``nbytes`` arriving on ``ingress`` (port, PG) for ``egress`` (port,
        queue): (admitted, events). A lossless PG past its threshold takes the packet into
        its headroom and sends XOFF (once); a full headroom, or a lossy PG or queue past
        its threshold, drops it, counted where it dropped."""
        pg, q = self.pgs[ingress], self.queues[egress]
        into_headroom, pg_ok = self._fits(pg, nbytes)
        _, q_ok = self._fits(q, nbytes)
        events = []
        if not pg_ok or not q_ok:
            where, usage = ("ingress", pg) if not pg_ok else ("egress", q)
            usage.drops += 1
            usage.dropped_bytes += nbytes
            events.append(Event(now_ns, "drop", *(ingress if not pg_ok else egress), where=where, nbytes=nbytes))
            return False, events
        if into_headroom:
            pg.headroom += nbytes
            pg.headroom_watermark = max(pg.headroom_watermark, pg.headroom)
        else:
            self._charge(pg, nbytes)
        self._charge(q, nbytes)
        if pg.profile.lossless and not pg.paused:
            th = self.threshold_bytes(pg)
            if pg.headroom > 0 or (th is not None and pg.shared >= th):
                pg.paused = True
                events.append(Event(now_ns, "xoff", *ingress))
        return True, events

    def release(self, now_ns: int, ingress: tuple, egress: tuple, nbytes: int) -> list:
        """The packet left through ``egress``: its bytes come off the PG (headroom first,
        then shared, then reserve, as HPCC's SwitchMmu) and the queue; XON for a paused
        PG whose headroom is empty and whose shared bytes are ``xon_offset`` below its
        threshold (or zero)."""
        pg, q = self.pgs[ingress], self.queues[egress]
        from_headroom = min(pg.headroom, nbytes)
        pg.headroom -= from_headroom
        self._discharge(pg, nbytes - from_headroom)
        self._discharge(q, nbytes)
        if pg.paused and pg.headroom == 0:
            th = self.threshold_bytes(pg)
            if pg.shared == 0 or th is None or pg.shared + pg.profile.xon_offset_bytes <= th:
                pg.paused = False
                return [Event(now_ns, "xon", *ingress)]
        return []

    # -- accounting --------------------------------------------------------------------
    def _fits(self, usage: Usage, nbytes: int) -> tuple[bool, bool]:
        """(into headroom, admitted) for ``nbytes`` more."""
        new = usage.used + nbytes
        if new <= usage.profile.size_bytes:
            return False, True
        th = self.threshold_bytes(usage)
        shared_after = new - usage.profile.size_bytes
        pool = usage.profile.pool
        grows = min(nbytes, shared_after)
        if (th is None or shared_after <= th) and self.shared_used[pool] + grows <= self.pools[pool].size_bytes:
            return False, True
        if usage.profile.lossless:
            return True, usage.headroom + nbytes <= usage.profile.xoff_bytes
        return False, False

    def _charge(self, usage: Usage, nbytes: int):
        before = usage.shared
        usage.used += nbytes
        grew = usage.shared - before
        pool = usage.profile.pool
        self.shared_used[pool] += grew
        self.pool_watermark[pool] = max(self.pool_watermark[pool], self.shared_used[pool])
        usage.shared_watermark = max(usage.shared_watermark, usage.shared)

    def _discharge(self, usage: Usage, nbytes: int):
        if nbytes > usage.used:
            raise ValueError(f"{usage.profile.name}: {nbytes} bytes released, {usage.used} held")
        before = usage.shared
        usage.used -= nbytes
        self.shared_used[usage.profile.pool] -= before - usage.shared
