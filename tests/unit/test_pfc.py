"""PFC frames (golden bytes, decoded by tshark) and the pure PFC decisions."""

import json
import shutil
import struct
import subprocess

import pytest

from testbed.model import pfc as decisions, plan
from testbed.wire import pfc
from testbed.config import scenario
from testbed.units import Dilation

# dst 01:80:c2:00:00:01 | src | 0x8808 | opcode 0x0101 | vector 0x0008 (priority 3) |
# quanta: p3 = 0xffff, others 0 | zero padding to 60 bytes
GOLDEN_XOFF_P3 = bytes.fromhex(
    "0180c2000001" "020100000101" "8808" "0101" "0008"
    "0000" "0000" "0000" "ffff" "0000" "0000" "0000" "0000") + bytes(26)


def test_frame_golden_bytes_and_round_trip():
    f = pfc.frame("02:01:00:00:01:01", {3: 0xFFFF})
    assert f == GOLDEN_XOFF_P3 and len(f) == 60
    assert pfc.parse(f) == ("02:01:00:00:01:01", {3: 0xFFFF})
    assert pfc.parse(pfc.frame("02:01:00:00:01:01", {3: 0})) == ("02:01:00:00:01:01", {3: 0})  # XON
    assert pfc.parse(bytes.fromhex("ffffffffffff020100000101080600010800060400010201")) is None  # ARP


def test_restart_frame_enables_no_priority_so_every_receiver_ignores_it():
    f = pfc.restart_frame("02:01:00:00:01:01")
    assert f == bytes.fromhex("0180c2000001" "020100000101" "8808" "0101" "0000") + bytes(16) + bytes(26)
    assert pfc.parse(f) == ("02:01:00:00:01:01", {})  # no priority: nothing paused or resumed


@pytest.mark.parametrize("prio,quanta", [(-1, 1), (8, 1), (3, 0x10000)])
def test_frame_rejects_out_of_range(prio, quanta):
    with pytest.raises(ValueError):
        pfc.frame("02:00:00:00:00:01", {prio: quanta})


@pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")
def test_tshark_decodes_priority_flow_control(tmp_path):
    f = pfc.frame("02:01:00:00:01:01", {3: 0xFFFF, 6: 0})
    pcap = tmp_path / "pfc.pcap"
    pcap.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)  # Ethernet
                     + struct.pack("<IIII", 0, 0, len(f), len(f)) + f)
    out = subprocess.run(["tshark", "-r", str(pcap), "-V"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert "Type: MAC Control (0x8808)" in out
    assert "Opcode: Class Based Flow Control [CBFC] Pause (0x0101)" in out
    assert "CBFC Class Enable Vector: 0x0048, C3, C6" in out
    assert "C3: 65535" in out and "C6: 0" in out


def test_pause_time_is_512_bit_times_per_quantum():
    assert pfc.pause_ns(1, 400e9) == pytest.approx(1.28)  # 512 bits at 400 Gbit/s
    assert pfc.pause_ns(0xFFFF, 400e9) == pytest.approx(83_884.8)


def test_feeders_follow_the_routes():
    p = plan.build(scenario.load("leaf-spine"), "user")
    feeders = {pq.intf: pq.feeders for pq in p.queues}
    # to h1: other hosts and every uplink
    assert feeders["leaf1-eth1"] == ("leaf1-eth2", "leaf1-eth3", "leaf1-eth4", "leaf1-eth5", "leaf1-eth6",
                                     "leaf1-eth7", "leaf1-eth8")
    assert feeders["leaf1-eth5"] == ("leaf1-eth1", "leaf1-eth2", "leaf1-eth3", "leaf1-eth4")  # never another uplink
    assert feeders["spine1-eth1"] == ("spine1-eth3", "spine1-eth4")  # toward leaf1: the links from leaf2 only
    # without PFC nothing is paused
    assert all(pq.feeders == () for pq in plan.build(scenario.load("leaf-spine", ["queues.pfc=off"]), "user").queues)


def test_hysteresis_pauses_refreshes_and_resumes():
    h = decisions.Hysteresis(xoff_bytes=100_000, xon_bytes=97_000, pause_emulated_ns=1_000)
    assert h.update(50_000, now_ns=0) is None
    assert h.update(100_001, now_ns=10) == "xoff"
    assert h.update(120_000, now_ns=200) is None  # still paused
    assert h.update(120_000, now_ns=600) == "xoff"  # refreshed before it expires
    assert h.update(98_000, now_ns=700) is None  # between XON and XOFF: stay paused
    assert h.update(96_000, now_ns=800) == "xon"
    assert h.update(96_000, now_ns=900) is None


def test_the_pfc_process_polls_in_fabric_time_within_the_guards_reaction_budget():
    from testbed.analysis.fidelity import LIMITS
    from testbed.model.queues import PFC_RESPONSE_NS
    assert decisions.poll_period_ns(Dilation(200_000)) == 10_000_000  # 50 ns of fabric time, dilated
    assert decisions.poll_period_ns(Dilation(50_000)) == 2_500_000
    assert decisions.poll_period_ns(Dilation(1_000)) == decisions.MIN_POLL_NS  # never faster than 1 ms
    for d in (20_000, 50_000, 200_000, 1_000_000):
        # a poll may run several periods late before the guard's pfc_reaction check fails
        assert Dilation(d).real_duration_ns(decisions.poll_period_ns(Dilation(d))) <= PFC_RESPONSE_NS * LIMITS["pfc_reaction"] / 4


def test_queues_view_counts_pfc_events(tmp_path):
    from testbed.apply.live import pfc_counts

    events = tmp_path / "pfc.jsonl"
    lines = [{"event": "xoff_sent", "port": "leaf2-eth5"}, {"event": "paused", "port": "spine1-eth2"},
             {"event": "xon_sent", "port": "leaf2-eth5"}, {"event": "resumed", "port": "spine1-eth2"},
             {"event": "paused", "port": "spine1-eth2"}]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"event": "xoff_se')  # a line being written
    assert pfc_counts(events) == {"leaf2-eth5": {"pfc_sent": 2, "pauses": 0, "paused": False},
                                  "spine1-eth2": {"pfc_sent": 0, "pauses": 2, "paused": True}}
    assert pfc_counts(tmp_path / "none.jsonl") == {}


def test_drain_yields_waiting_pfc_frames_and_skips_the_rest():
    import socket

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        b.setblocking(False)
        a.send(pfc.frame("02:01:00:00:01:01", {3: 0xFFFF}))
        a.send(bytes.fromhex("ffffffffffff020100000101080600010800060400010201"))  # ARP
        a.send(pfc.frame("02:01:00:00:01:02", {3: 0}))
        assert list(pfc.drain(b)) == [("02:01:00:00:01:01", {3: 0xFFFF}), ("02:01:00:00:01:02", {3: 0})]
        assert list(pfc.drain(b)) == []


def test_drain_reads_nothing_from_a_link_that_is_down_and_raises_other_errors():
    """A link event takes the interface down under the PFC daemon's packet socket: recv
    fails with ENETDOWN, which is "no frame" (none crosses a dead cable), not a crash."""
    import errno

    class Socket:
        def __init__(self, code):
            self.code = code

        def recv(self, size):
            raise OSError(self.code, "as the kernel says")

    assert list(pfc.drain(Socket(errno.ENETDOWN))) == []
    with pytest.raises(OSError):
        list(pfc.drain(Socket(errno.EBADF)))


def test_the_pfc_process_takes_a_link_events_rate_as_one_checked_line():
    from testbed.apply.processes.pfcd import parse_rate_command

    ports = {"leaf1-eth5": None, "spine1-eth1": None}
    assert parse_rate_command("rate 100000000000 leaf1-eth5 spine1-eth1\n", ports) == (
        100e9, ["leaf1-eth5", "spine1-eth1"])
    for bad, why in (("rate 1e9 leaf1-eth5", "expected 'rate BPS INTF"), ("rate 0 leaf1-eth5", "expected"),
                     ("rate 100", "expected"), ("pause leaf1-eth5", "expected"),
                     ("rate 100 leaf9-eth1", "not a switch port of this run: leaf9-eth1")):
        with pytest.raises(ValueError, match=why):
            parse_rate_command(bad, ports)


def test_pfc_totals_combine_every_servers_process(tmp_path):
    """A cluster run's pfc.jsonl holds each server's PFC process's records: ports summed,
    XOFF decisions summed, the worst reaction times kept."""
    from testbed.apply.processes.pfc_daemon import totals

    def port(name, sent, received, hw):
        return {"event": "port", "port": name, "frames_sent": sent, "xoff_sent": sent // 2, "frames_received": received,
                "paused_ns": 10 * received, "drops": 0, "headroom_high_water_bytes": hw}

    lines = [port("leaf1-eth5", 4, 0, 100), {"event": "reaction", "xoff_polls": 2, "xoff_detect_max_ns": 50,
                                             "pause_apply_max_ns": 7},
             port("spine2-eth1", 0, 4, 0), {"event": "reaction", "xoff_polls": 0, "xoff_detect_max_ns": 0,
                                            "pause_apply_max_ns": 90}]
    events = tmp_path / "pfc.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert totals(events) == {"frames_sent": 4, "xoff_sent": 2, "frames_received": 4, "paused_ns": 40, "drops": 0,
                              "paused_ports": ["spine2-eth1"], "headroom_high_water_bytes": 100, "xoff_polls": 2,
                              "xoff_detect_max_ns": 50, "pause_apply_max_ns": 90}


def test_a_queue_far_below_xoff_is_quiet_until_its_feeders_could_fill_it():
    # 3 feeders at 8 Mbit/s (400G at D = 50000) fill at most 3 MB/s: 1 MB of room below XOFF
    # after 100 KB of slack is 0.3 s away
    assert decisions.quiet_until_ns(0, 1_100_000, 24e6, 100_000, 7) == 7 + 333_333_333
    # deeper now: less room, sooner
    assert decisions.quiet_until_ns(500_000, 1_100_000, 24e6, 100_000, 7) == 7 + 166_666_666


def test_a_queue_whose_slack_reaches_xoff_is_read_every_poll():
    assert decisions.quiet_until_ns(0, 300_000, 24e6, 300_000, 7) == 7
    assert decisions.quiet_until_ns(290_000, 300_000, 24e6, 0, 7) == 7 + 3_333_333
    assert decisions.quiet_until_ns(310_000, 300_000, 24e6, 0, 7) == 7  # above XOFF already
    assert decisions.quiet_until_ns(0, 300_000, 0, 0, 7) == 7  # no feeders known: never skip it
