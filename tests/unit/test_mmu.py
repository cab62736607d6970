"""The shared-buffer model (``model.mmu``) against sequences worked by hand: reserve, then
shared bytes up to a static or dynamic threshold, a lossless PG's XOFF, headroom and XON
with its offset, lossy drops where they happen, and the dynamic threshold's fixed point."""

import pytest

from testbed.model.mmu import Event, Mmu, Pool, Profile

KB = 1000
PKT = 1000
ANY = Profile("ingress_lossy_profile", "ingress_lossy_pool", dynamic_th=7)  # never limits
TO_ANY = Profile("egress_lossless_profile", "egress_lossless_pool", dynamic_th=7)


def mmu(pgs=None, queues=None, **pool_sizes):
    sizes = {"ingress_lossy_pool": 10**9, "egress_lossless_pool": 10**9, **pool_sizes}
    return Mmu.build([Pool(n, s) for n, s in sizes.items()], pgs or {}, queues or {})


def fill(m, ingress, egress, n, t0=0):
    """``n`` packets, one per ns from ``t0``: (admitted count, events)."""
    admitted, events = 0, []
    for i in range(n):
        ok, ev = m.admit(t0 + i, ingress, egress, PKT)
        admitted += ok
        events += ev
    return admitted, events


@pytest.mark.parametrize("dynamic_th, peak", [(0, 50 * KB), (1, 67 * KB), (-1, 33 * KB)])
def test_a_lossy_queue_alone_settles_at_alpha_over_one_plus_alpha_of_its_pool(dynamic_th, peak):
    """Admitted while its shared bytes after the packet stay within alpha x (pool - in use):
    a 100 KB pool, 1 KB packets. alpha 1: q + 1 <= 100 - q up to q = 49, so 50 KB (1/2);
    alpha 2: q + 1 <= 2 (100 - q) up to q = 66, so 67 KB (2/3 is 66.7); alpha 1/2:
    q + 1 <= (100 - q) / 2 up to q = 32, so 33 KB (1/3 is 33.3). The next packet is dropped
    at the queue."""
    q = Profile("egress_lossy_profile", "egress_lossy_pool", dynamic_th=dynamic_th)
    m = mmu({("Ethernet0", 0): ANY}, {("Ethernet8", 0): q}, egress_lossy_pool=100 * KB)
    admitted, events = fill(m, ("Ethernet0", 0), ("Ethernet8", 0), 200)
    usage = m.queues[("Ethernet8", 0)]
    assert admitted * PKT == peak == usage.used == usage.shared_watermark == m.pool_watermark["egress_lossy_pool"]
    assert usage.drops == 200 - admitted and m.pgs[("Ethernet0", 0)].drops == 0
    assert events[0] == Event(admitted, "drop", "Ethernet8", 0, where="egress", nbytes=PKT)


def test_two_queues_share_a_pool_by_the_same_rule():
    """alpha 1, two queues filled in turn: each stops where q + 1 <= 120 - 2q, at 40 KB (1/3)."""
    q = Profile("egress_lossy_profile", "egress_lossy_pool", dynamic_th=0)
    m = mmu({("Ethernet0", 0): ANY}, {("Ethernet8", 0): q, ("Ethernet16", 0): q}, egress_lossy_pool=120 * KB)
    for i in range(100):
        for port in ("Ethernet8", "Ethernet16"):
            m.admit(i, ("Ethernet0", 0), (port, 0), PKT)
    assert m.queues[("Ethernet8", 0)].used == m.queues[("Ethernet16", 0)].used == 40 * KB
    assert m.shared_used["egress_lossy_pool"] == 80 * KB


def test_a_static_threshold_caps_the_shared_bytes_beyond_the_reserve():
    q = Profile("egress_lossy_profile", "egress_lossy_pool", size_bytes=2 * KB, static_th_bytes=3 * KB)
    m = mmu({("Ethernet0", 0): ANY}, {("Ethernet8", 0): q}, egress_lossy_pool=100 * KB)
    assert fill(m, ("Ethernet0", 0), ("Ethernet8", 0), 10)[0] == 5  # 2 KB reserve + 3 KB shared
    assert m.shared_used["egress_lossy_pool"] == 3 * KB  # the reserve is not the pool's


def test_a_lossless_pg_pauses_at_its_threshold_fills_its_headroom_and_resumes_an_offset_below():
    """Reserve 2 KB, alpha 1 of a 10 KB pool, 3 KB of headroom, xon_offset 1 KB; 1 KB packets.
    Packets 1-2 fill the reserve; 3-7 take shared bytes while s + 1 <= 10 - s, to 5 KB,
    where the threshold (10 - 5 = 5 KB) is reached: XOFF with packet 7. Packets 8-10 go
    into the headroom, packet 11 finds it full: a lossless drop, at the ingress PG.
    Releases: the headroom first (3 packets: still paused, shared 5 KB + 1 KB offset is
    above the 5 KB threshold), then one shared packet: 4 KB + 1 KB <= 6 KB, XON."""
    pg = Profile("pg_lossless_400000_300m_profile", "ingress_lossless_pool", size_bytes=2 * KB, dynamic_th=0,
                 xoff_bytes=3 * KB, xon_offset_bytes=1 * KB)
    m = mmu({("Ethernet0", 3): pg}, {("Ethernet8", 3): TO_ANY}, ingress_lossless_pool=10 * KB)
    ingress, egress = ("Ethernet0", 3), ("Ethernet8", 3)
    admitted, events = fill(m, ingress, egress, 11)
    usage = m.pgs[ingress]
    assert admitted == 10 and events == [Event(6, "xoff", "Ethernet0", 3),
                                         Event(10, "drop", "Ethernet0", 3, where="ingress", nbytes=PKT)]
    assert (usage.used, usage.shared, usage.headroom, usage.drops) == (7 * KB, 5 * KB, 3 * KB, 1)
    assert (usage.shared_watermark, usage.headroom_watermark) == (5 * KB, 3 * KB)
    assert m.queues[egress].used == 10 * KB
    assert [m.release(100 + i, ingress, egress, PKT) for i in range(3)] == [[], [], []]
    assert usage.paused and usage.headroom == 0 and usage.shared == 5 * KB
    assert m.release(103, ingress, egress, PKT) == [Event(103, "xon", "Ethernet0", 3)]
    assert not usage.paused and usage.shared == 4 * KB and m.shared_used["ingress_lossless_pool"] == 4 * KB
    # everything out: every counter back at zero, the watermarks kept
    for i in range(6):
        assert m.release(200 + i, ingress, egress, PKT) == []
    assert (usage.used, m.shared_used["ingress_lossless_pool"], m.queues[egress].used) == (0, 0, 0)
    assert usage.shared_watermark == 5 * KB


def test_a_pg_resumes_when_its_shared_bytes_are_gone_whatever_the_offset():
    """An offset larger than the threshold could ever leave room for: XON once the PG holds
    no shared bytes."""
    pg = Profile("lossless", "ingress_lossless_pool", dynamic_th=0, xoff_bytes=2 * KB, xon_offset_bytes=50 * KB)
    m = mmu({("Ethernet0", 3): pg}, {("Ethernet8", 3): TO_ANY}, ingress_lossless_pool=4 * KB)
    admitted, events = fill(m, ("Ethernet0", 3), ("Ethernet8", 3), 4)
    assert admitted == 4 and [e.kind for e in events] == ["xoff"]  # 2 KB shared (2 <= 4 - 2), then 2 in headroom
    out = [m.release(10 + i, ("Ethernet0", 3), ("Ethernet8", 3), PKT) for i in range(4)]
    assert out == [[], [], [], [Event(13, "xon", "Ethernet0", 3)]]


def test_a_packet_the_egress_queue_refuses_charges_nothing_at_ingress():
    pg = Profile("lossless", "ingress_lossless_pool", dynamic_th=0, xoff_bytes=10 * KB)
    q = Profile("egress_lossy_profile", "egress_lossy_pool", static_th_bytes=1 * KB)
    m = mmu({("Ethernet0", 0): pg}, {("Ethernet8", 0): q}, ingress_lossless_pool=100 * KB, egress_lossy_pool=100 * KB)
    assert fill(m, ("Ethernet0", 0), ("Ethernet8", 0), 3)[0] == 1
    assert m.pgs[("Ethernet0", 0)].used == 1 * KB and m.queues[("Ethernet8", 0)].drops == 2


def test_an_exhausted_pool_sends_a_lossless_pg_into_its_headroom_even_below_its_threshold():
    """Two PGs with no limit of their own (dynamic_th 7) in a 3 KB pool: the third shared KB
    takes the pool; the next packet of either goes into its headroom and pauses it."""
    pg = Profile("lossless", "ingress_lossless_pool", dynamic_th=7, xoff_bytes=5 * KB)
    m = mmu({("Ethernet0", 3): pg, ("Ethernet4", 3): pg}, {("Ethernet8", 3): TO_ANY}, ingress_lossless_pool=3 * KB)
    fill(m, ("Ethernet0", 3), ("Ethernet8", 3), 3)
    ok, events = m.admit(9, ("Ethernet4", 3), ("Ethernet8", 3), PKT)
    assert ok and events == [Event(9, "xoff", "Ethernet4", 3)] and m.pgs[("Ethernet4", 3)].headroom == 1 * KB
    assert not m.pgs[("Ethernet0", 3)].paused


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of dynamic_th and static_th, not neither"),
    ({"dynamic_th": 0, "static_th_bytes": 5}, "exactly one of dynamic_th and static_th, not both"),
    ({"dynamic_th": 0, "size_bytes": -1}, "size_bytes is negative"),
])
def test_a_profile_says_what_is_wrong_with_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Profile("p", "pool", **kwargs)


def test_a_profile_names_a_pool_that_exists_and_headroom_stays_at_ingress():
    with pytest.raises(ValueError, match="Ethernet0 3: profile p names pool nowhere, which is not defined"):
        Mmu.build([Pool("ingress_lossless_pool", 10)], {("Ethernet0", 3): Profile("p", "nowhere", dynamic_th=0)}, {})
    with pytest.raises(ValueError, match="Ethernet8 queue 3: profile q has xoff"):
        Mmu.build([Pool("egress", 10)], {}, {("Ethernet8", 3): Profile("q", "egress", dynamic_th=0, xoff_bytes=1)})
