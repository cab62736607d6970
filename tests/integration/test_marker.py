"""The ECN/WRED marker program in the kernel, on packets run through it with
BPF_PROG_TEST_RUN: the shadow queue does not drain (port rate 8 bit/s), so each test
sets the depth exactly by the bytes it sends."""

import os
import struct
import uuid

import pytest

from testbed.wire import bpfmaps
from testbed.apply.datapath import bpfmap
from testbed.model import queues
from testbed.apply.datapath.marker import Marker
from testbed.apply.processes.probe import checksum

pytestmark = pytest.mark.integration
TC_ACT_OK, TC_ACT_SHOT = 0, 2
LO_IFINDEX = 1  # the port the test configures; test runs never touch the real lo
SKB_IFINDEX_OFFSET = 40  # struct __sk_buff.ifindex


def packet(size: int, tos: int) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, size - 14, 1, 0, 64, 17, 0, bytes([10, 0, 1, 2]),
                     bytes([10, 0, 1, 1]))
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    return bytes.fromhex("020100000101" "020100000102" "0800") + ip + bytes(size - 34)


CTX = bytes(SKB_IFINDEX_OFFSET) + struct.pack("=I", LO_IFINDEX) + bytes(192 - SKB_IFINDEX_OFFSET - 4)


@pytest.fixture
def marker():
    with Marker(f"test-{uuid.uuid4().hex[:8]}") as m:
        yield m


def configure(m, buffer, kmin, kmax, pmax, ecn=True):
    pq = queues.PortQueue(switch="t", port=1, intf="lo", peer="x", rate_bps=8, emulated_rate_bps=8,
                          buffer_bytes=buffer, ecn=ecn, kmin_bytes=kmin, kmax_bytes=kmax, pmax=pmax, pfc=False,
                          xoff_bytes=0, xon_bytes=0, headroom_bytes=0, headroom_formula_bytes=0, burst_bytes=0,
                          fifo_limit_bytes=buffer, delay_ns=0, emulated_delay_ns=0)
    m.configure(LO_IFINDEX, pq)
    return pq


def run(m, size, tos, repeat=1):
    return bpfmap.prog_test_run(m.prog_fd, packet(size, tos), CTX, repeat=repeat)


def state(m):
    return bpfmaps.marker_state(m.state.lookup(LO_IFINDEX, lock=True))


def fill(m, depth):
    """Non-ECT 1000-byte packets: never marked, each adds 1000 bytes of depth."""
    assert depth % 1000 == 0
    if depth:
        run(m, 1000, 0, repeat=depth // 1000)
    assert state(m)["depth_bytes"] == depth


def test_step_marking_is_exact(marker):
    configure(marker, buffer=10_000_000, kmin=50_000, kmax=50_000, pmax=1.0)
    fill(marker, 49_000)
    rv, out, _ = run(marker, 100, 0b10)  # depth 49000 < K: not marked
    assert rv == TC_ACT_OK and out[15] & 3 == 0b10
    fill_to = state(marker)["depth_bytes"]
    run(marker, 1000, 0, repeat=(50_000 - fill_to) // 1000 + 1)  # now depth >= K
    before = state(marker)["marked"]
    rv, out, _ = run(marker, 100, 0b10, repeat=500)
    s = state(marker)
    assert s["marked"] - before == 500 and s["ect"] == 501
    assert out[15] & 3 == 0b11  # CE
    assert checksum(out[14:34]) == 0  # IP header checksum still valid after marking


@pytest.mark.parametrize("depth", [2_000_000, 5_000_000, 8_000_000])
def test_wred_probability_follows_the_line(marker, depth):
    kmin, kmax, pmax, n, size = 1_000_000, 9_000_000, 0.5, 4000, 42
    configure(marker, buffer=20_000_000, kmin=kmin, kmax=kmax, pmax=pmax)
    fill(marker, depth)
    run(marker, size, 0b01, repeat=n)  # ECT(1) probes; the depth creeps up by n x 42 bytes
    s = state(marker)
    mid_depth = depth + n * size / 2
    expected = pmax * (mid_depth - kmin) / (kmax - kmin)
    sigma = (expected * (1 - expected) / n) ** 0.5
    assert abs(s["marked"] / n - expected) < 5 * sigma, (s["marked"] / n, expected)


def test_no_marks_below_kmin_all_at_kmax_and_none_when_ecn_off(marker):
    configure(marker, buffer=20_000_000, kmin=100_000, kmax=200_000, pmax=0.1)
    fill(marker, 100_000)
    run(marker, 42, 0b10, repeat=1)  # depth == kmin: not above it
    assert state(marker)["marked"] == 0
    run(marker, 1000, 0, repeat=100)  # depth 200042 >= kmax
    run(marker, 42, 0b10, repeat=300)
    assert state(marker)["marked"] == 300
    configure(marker, buffer=20_000_000, kmin=0, kmax=0, pmax=0, ecn=False)
    fill(marker, 1_000_000)
    run(marker, 42, 0b10, repeat=300)
    assert state(marker)["marked"] == 0 and state(marker)["ect"] == 300


def test_drops_happen_at_the_buffer_and_only_there(marker):
    configure(marker, buffer=100_000, kmin=10_000, kmax=50_000, pmax=0.2)
    verdicts = [run(marker, 1500, 0b10)[0] for _ in range(80)]
    # 66 x 1500 = 99000 fits; the 67th would make 100500 > 100000
    assert verdicts[:66] == [TC_ACT_OK] * 66
    assert verdicts[66:] == [TC_ACT_SHOT] * 14
    assert run(marker, 1000, 0)[0] == TC_ACT_OK  # 99000 + 1000 still fits exactly
    s = state(marker)
    assert s["drops"] == 14 and s["depth_bytes"] == 100_000 and s["max_depth_bytes"] <= 100_000


def test_max_depth_since_last_read_is_not_lost(marker):
    pq = configure(marker, buffer=10_000_000, kmin=10**6, kmax=10**6, pmax=0.1)
    ports = {LO_IFINDEX: pq}
    fill(marker, 30_000)
    first = marker.read(ports)[LO_IFINDEX]
    assert first["max_depth_bytes"] == 30_000
    run(marker, 1000, 0, repeat=5)  # a burst after the read...
    second = marker.read(ports)[LO_IFINDEX]
    assert second["max_depth_bytes"] == 35_000  # ...is seen at the next read
    run(marker, 1000, 0)  # the first packet of the new epoch must not erase the finished one
    assert marker.read(ports)[LO_IFINDEX]["max_depth_bytes"] == 36_000


def udp_packet(sport: int) -> bytes:
    """A data packet from 10.0.1.2 to 10.0.1.1 with UDP source port ``sport`` (the flow hash)."""
    raw = bytearray(packet(1000, 2))
    raw[34:36] = struct.pack("!H", sport)
    raw[36:38] = struct.pack("!H", 4791)
    return bytes(raw)


def test_adaptive_routing_picks_the_least_occupied_port_ties_keep_the_hash(marker):
    """The GPU NIC's program (steer_nic) against a decision entry with two candidate ports
    whose shadow depth the test sets (paused: it does not drain). Both empty or equally deep:
    every packet keeps its flow-hash port (nothing moved). One deep: every packet goes to the
    other, so exactly the packets whose hash chose the deep one are moved; swapping which is
    deep moves exactly the others: the two counts add up to the packets sent."""
    prog = bpfmap.obj_get(str(marker.dir / "steer_nic"))
    table = bpfmap.Map(str(marker.dir / "testbed_steer"), bpfmaps.STEER_SIZE)
    key = bpfmaps.steer_key(0, "10.0.1.2", "10.0.1.0/24")
    a, b = 901, 902  # candidate ports' state keys (never real interfaces: only read here)
    pq = configure(marker, 10**9, 10**9, 10**9, 0.0)
    for idx in (a, b):
        marker.cfg.update(idx, bpfmaps.marker_cfg(pq, paused=True))

    def depths(da, db, n=200):
        for idx, d in ((a, da), (b, db)):
            marker.state.update(idx, struct.pack(bpfmaps.STATE_FORMAT, d, 0, 1, *([0] * 10)))
        table.update(key, bpfmaps.steer_choice([(a, 5), (b, 6)]))
        for sport in range(49152, 49152 + n):
            verdict, _, _ = bpfmap.prog_test_run(prog, udp_packet(sport), CTX)
            assert verdict == TC_ACT_OK
        return bpfmaps.steer_counters(table.lookup(key))

    try:
        assert depths(0, 0) == {"decisions": 200, "moved": 0}
        assert depths(50_000, 50_000) == {"decisions": 200, "moved": 0}
        first = depths(50_000, 0)["moved"]
        second = depths(0, 50_000)["moved"]
        assert 0 < first < 200 and first + second == 200, (first, second)
        # no entry (an ECMP run, or a destination with one path): untouched, not counted
        table.delete(key)
        assert bpfmap.prog_test_run(prog, udp_packet(1), CTX)[0] == TC_ACT_OK
        assert table.lookup(key) is None
    finally:
        table.close()
        os.close(prog)
