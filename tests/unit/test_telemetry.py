"""Port-counter polling decisions and records (pure)."""

from types import SimpleNamespace

from testbed import telemetry


def test_poller_is_due_on_schedule_and_skips_missed_polls():
    p = telemetry.Poller(interval_ns=100, now_ns=1000)
    assert p.due(1000) and not p.due(1050) and p.due(1100)
    assert p.due(1450)  # 3 polls late: one poll now, the missed ones are skipped
    assert p.next_ns == 1500 and p.wait_s(1400) == 100 / 1e9


def test_port_records_skip_the_bridge_port_and_unreadable_counters():
    def stats(port, value):
        return SimpleNamespace(port_no=port, **{c: value for c in telemetry.COUNTERS})

    recs = telemetry.port_records(7, "leaf1", [stats(1, 10), stats(telemetry.LOCAL_PORT, 5),
                                              stats(2, telemetry.UNAVAILABLE)])
    assert recs == [{"t_ns": 7, "switch": "leaf1", "port": 1, "intf": "leaf1-eth1",
                     **{c: 10 for c in telemetry.COUNTERS}}]
