"""Port-counter polling decisions and records (pure)."""

from types import SimpleNamespace

from testbed.config import scenario
from testbed.controller import telemetry
from testbed.model import queues
from testbed.units import Dilation


def test_poller_is_due_on_schedule_and_skips_missed_polls():
    p = telemetry.Poller(interval_ns=100, now_ns=1000)
    assert p.due(1000) and not p.due(1050) and p.due(1100)
    assert p.due(1450)  # 3 polls late: one poll now, the missed ones are skipped
    assert p.next_ns == 1500 and p.wait_s(1400) == 100 / 1e9
    assert p.skipped == 2  # 1200 and 1300 were never polled: dropped samples the fidelity guard counts


def test_port_records_skip_the_bridge_port_and_unreadable_counters():
    def stats(port, value):
        return SimpleNamespace(port_no=port, duration_sec=3, duration_nsec=250_000_000,
                               **{c: value for c in telemetry.COUNTERS})

    recs = telemetry.port_records(7, "leaf1", [stats(1, 10), stats(telemetry.LOCAL_PORT, 5),
                                              stats(2, telemetry.UNAVAILABLE)])
    assert recs == [{"t_ns": 7, "switch": "leaf1", "port": 1, "intf": "leaf1-eth1", "duration_ns": 3_250_000_000,
                     **{c: 10 for c in telemetry.COUNTERS}}]


def test_ecn_records_one_per_counting_flow():
    def flow(table, match, packets):
        return SimpleNamespace(table_id=table, match=match, stats={"packet_count": packets, "byte_count": 10 * packets})

    recs = telemetry.ecn_records(5, "spine1", [flow(0, {"in_port": 3, "eth_type": 0x800, "ip_ecn": 3}, 7),
                                              flow(0, {"eth_type": 0x8808}, 9),  # the pause drop: not counted
                                              flow(1, {"ipv4_dst": "10.0.1.1"}, 9)])
    assert recs == [{"t_ns": 5, "switch": "spine1", "port": 3, "intf": "spine1-eth3", "ecn": "ce", "packets": 7,
                     "bytes": 70}]


def leaf_uplink():
    """leaf1's port 2 toward spine1 with the default scenario's queues: 400G at D = 50000 is
    8 Mbit/s here, one byte per microsecond."""
    return queues.port_queue(scenario.load("default").queues, "leaf1", 2, "spine1", rate_bps=400_000_000_000,
                             delay_ns=500, dilation=Dilation(50_000))


def test_queue_record_drains_the_shadow_to_now_and_keeps_the_interval_max():
    pq = leaf_uplink()  # 1 byte per us
    state = {"depth_bytes": 5000, "last_ns": 1_000_000, "max_depth_bytes": 9000, "packets": 4, "bytes": 6000,
             "ect": 4, "marked": 1, "drops": 0, "control_packets": 2, "trimmed": 0}
    rec = telemetry.queue_record(3_000_000, pq, state, {"backlog_bytes": 3100, "sent_bytes": 99, "drops": 0})
    assert rec["depth_bytes"] == 3000 and rec["max_depth_bytes"] == 9000 and rec["tbf_backlog_bytes"] == 3100
    assert rec["marked"] == 1 and rec["tbf_sent_bytes"] == 99
    # PFC: 2 ms of finished pauses plus a pause running since 2.5 ms
    pfc = {"frames_sent": 4, "xoff_sent": 2, "frames_received": 3, "paused_ns": 2_000_000,
           "paused_since_ns": 2_500_000, "headroom_high_water_bytes": 700}
    rec = telemetry.queue_record(3_000_000, pq, state, None, pfc)
    assert rec["pfc_paused_ns"] == 2_500_000 and rec["pfc_xoff_sent"] == 2 and rec["pfc_frames_received"] == 3
    idle = telemetry.queue_record(1, pq, None, None)
    assert idle["pfc_frames_sent"] == 0 and idle["pfc_paused_ns"] == 0
    assert idle["packets"] == 0 and idle["depth_bytes"] == 0 and "tbf_backlog_bytes" not in idle


def test_cpu_meter_host_busy_fraction_and_process_cores():
    busy, total = telemetry.host_cpu_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    assert (busy, total) == (150, 1000)
    assert telemetry.process_cpu_ticks("42 (ovs-vswitchd) S 1 2 3 4 5 6 7 8 9 10 300 200 0 0") == 500
    m = telemetry.CpuMeter(ticks_per_s=100)
    assert m.sample(0, (150, 1000), 500) == {}
    # 1 s later: 180 of 200 ticks busy; the process used 150 ticks = 1.5 cores
    assert m.sample(1_000_000_000, (330, 1200), 650) == {"host_busy": 0.9, "ovs_cpu_cores": 1.5}


def test_queue_record_drains_at_the_rate_in_force():
    """A link event slowed the port to a quarter: the shadow drains at that, and the record
    says which rate it was (the dequeue check compares the TBF's sending with it)."""
    pq = leaf_uplink()
    state = {"depth_bytes": 5000, "last_ns": 1_000_000, "max_depth_bytes": 9000, "packets": 4, "bytes": 6000,
             "ect": 4, "marked": 1, "drops": 0, "control_packets": 2, "trimmed": 0}
    rec = telemetry.queue_record(3_000_000, pq, state, None, None, rate_bps=2e6)
    assert rec["depth_bytes"] == 4500 and rec["emulated_rate_now_bps"] == 2e6
    assert telemetry.queue_record(3_000_000, pq, state, None)["emulated_rate_now_bps"] == 8e6
