"""Per-port queue settings: defaults from link rate and cable, marker map layout."""

import struct

import pytest

from testbed.wire import bpfmaps
from testbed.model import plan, queues
from testbed.config import scenario


def ports(ref="default", *overrides):
    return plan.build(scenario.load(ref, list(overrides)), "user").queues


def test_every_switch_port_gets_a_queue():
    p = plan.build(scenario.load("default"), "user")
    got = {(pq.switch, pq.port) for pq in p.queues}
    want = set()
    for link in p.fabric_links:
        want.add((link.b, link.b_port))
        if link.kind == "uplink":
            want.add((link.a, link.a_port))
    assert got == want and len(got) == 8 + 16  # 8 host-facing ports, 8 uplinks seen from both ends


def test_defaults_follow_dcqcn_scaled_to_rate_and_the_headroom_formula():
    (pq,) = [q for q in ports("topologies/leaf-spine.yaml") if q.intf == "spine1-eth1"]
    # 400G = 10 x the DCQCN paper's 40G: Kmin 50 KB, Kmax 2 MB, Pmax 1 %
    assert (pq.kmin_bytes, pq.kmax_bytes, pq.pmax) == (50_000, 2_000_000, 0.01)
    # 100 m of cable = 500 ns; 2 x MTU (4214-byte frames) + (2 x 500 ns + 1 us) x 50 B/ns
    assert pq.headroom_bytes == pq.headroom_formula_bytes == 2 * 4214 + 100_000
    assert pq.buffer_bytes == 2 * 2_000_000 + 8428 + 100_000
    assert pq.xoff_bytes == pq.buffer_bytes - pq.headroom_bytes
    assert pq.xon_bytes == pq.xoff_bytes - 8428
    assert pq.fifo_limit_bytes == pq.buffer_bytes + 8428  # a little above the marker's buffer
    assert pq.burst_bytes == 3 * 4214
    assert pq.emulated_rate_bps == 400e9 / 50000


def test_scenario_values_win_and_off_switches():
    (pq,) = [q for q in ports("default", "queues.ecn.kmin=10KB", "queues.ecn.kmax=10KB", "queues.pfc=off")
             if q.intf == "leaf1-eth1"]
    assert (pq.kmin_bytes, pq.kmax_bytes, pq.pfc, pq.buffer_bytes) == (10_000, 10_000, False, 4_000_000)
    (off,) = [q for q in ports("default", "queues.ecn=off") if q.intf == "leaf1-eth1"]
    assert not off.ecn
    assert struct.unpack(bpfmaps.CFG_FORMAT, bpfmaps.marker_cfg(off))[3:6] == (bpfmaps.ECN_OFF, bpfmaps.ECN_OFF, 0)


def test_marker_cfg_layout_matches_bpf_struct():
    (pq,) = [q for q in ports() if q.intf == "leaf1-eth1"]
    raw = bpfmaps.marker_cfg(pq)
    assert len(raw) == 64 == bpfmaps.CFG_SIZE
    assert struct.unpack("=8Q", raw) == (8_000_000, 3 * 4214, 4_000_000, 100_000, 400_000, round(0.2 * 2 ** 32), 0, 0)
    assert struct.unpack("=8Q", bpfmaps.marker_cfg(pq, paused=True))[bpfmaps.CFG_PAUSED] == 1
    (trimming,) = [q for q in ports("default", "queues.trim=on") if q.intf == "leaf1-eth1"]
    assert struct.unpack("=8Q", bpfmaps.marker_cfg(trimming))[7] == 1
    assert bpfmaps.STATE_SIZE == 112  # 13 counters + the spin lock, padded (bpftool: value 112B)
    state = bpfmaps.marker_state(struct.pack("=13Q8x", *range(13)))
    assert state["marked"] == 6 and state["prev_max_depth_bytes"] == 10 and state["control_packets"] == 11
    assert state["trimmed"] == 12


@pytest.mark.parametrize("rate,delay_ns,want", [(400e9, 15, 8428 + 51_500), (100e9, 500, 8428 + 25_000)])
def test_headroom_formula(rate, delay_ns, want):
    assert queues.headroom_formula_bytes(rate, delay_ns) == want


def test_steer_table_layout_golden():
    """struct steer_key / steer_choice of bpf/marker.c (bpftool btf: 12 and 152 bytes)."""
    assert bpfmaps.steer_key(7, "10.0.1.2", "10.0.2.0/24") == bytes.fromhex("07000000" "0a000102" "0a000200")
    assert bpfmaps.steer_key(0, None, "10.0.3.0/24") == bytes.fromhex("00000000" "00000000" "0a000300")
    raw = bpfmaps.steer_choice([(11, 5), (12, 6)])
    assert len(raw) == bpfmaps.STEER_SIZE == 152
    assert raw[:16] == struct.pack("=IIII", 2, 0, 11, 12) and raw[72:80] == struct.pack("=II", 5, 6)
    assert bpfmaps.steer_counters(raw[:136] + struct.pack("=QQ", 9, 4)) == {"decisions": 9, "moved": 4}
    with pytest.raises(ValueError):
        bpfmaps.steer_choice([(i, i) for i in range(17)])
