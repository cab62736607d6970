"""The speed probe behind the automatic dilation (apply/speed.py): the agents' per-packet
path measured for real, and the slowdown it hands the plan."""

from testbed.apply import speed
from testbed.wire import roce


def test_the_probe_sends_real_roce_frames_and_reads_a_time_per_packet(monkeypatch):
    sent = []
    real_frame = roce.FrameTemplate.frame

    def frame(self, *args):
        sent.append(real_frame(self, *args))
        return sent[-1]

    monkeypatch.setattr(roce.FrameTemplate, "frame", frame)
    result = speed.measure(packets=50, trials=2)
    assert len(sent) == 100
    # every frame is the 4 KB data frame the agents send: Ethernet, IPv4, UDP 4791, BTH, payload, ICRC
    assert {len(f) for f in sent} == {roce.wire_bytes(4096)}
    assert roce.parse(sent[7][roce.OFF_BTH:]).psn == 7
    assert 0 < result.us_per_packet < 1e5


def test_the_reference_kind_and_faster_machines_keep_the_budgets():
    assert speed.Speed(speed.REFERENCE_US_PER_PACKET).slowdown == 1.0
    assert speed.Speed(speed.REFERENCE_US_PER_PACKET / 3).slowdown == 1.0  # not measured there: never lowered
    # a busy shared machine read up to x1.8 of the reference: still the reference kind
    assert speed.Speed(speed.REFERENCE_US_PER_PACKET * 1.8).slowdown == 1.0


def test_a_machine_twice_as_slow_or_more_multiplies_the_dilation_by_what_it_measured():
    assert speed.Speed(speed.REFERENCE_US_PER_PACKET * 2).slowdown == 2.0
    slow = speed.Speed(speed.REFERENCE_US_PER_PACKET * 14.26)
    assert slow.slowdown == 14.3
    assert slow.to_dict() == {"us_per_packet": round(speed.REFERENCE_US_PER_PACKET * 14.26, 2),
                              "reference_us_per_packet": speed.REFERENCE_US_PER_PACKET, "ratio": 14.26,
                              "slowdown": 14.3}
