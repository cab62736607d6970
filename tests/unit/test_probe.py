import pytest
import struct

from testbed.apply.processes import probe


def test_echo_request_golden_bytes():
    # type 8, code 0, checksum 0xf288 (worked out by hand: the one's complement of the
    # one's complement sum of the 16-bit words, checksum field 0, the odd last byte padded),
    # id 0x1234, seq 1, payload "testbed-probe"
    golden = bytes.fromhex("0800" "f288" "1234" "0001") + b"testbed-probe"
    assert probe.echo_request(0x1234, 1) == golden
    assert probe.checksum(golden) == 0  # a valid ICMP checksum sums to zero


def test_checksum_rfc1071_example():
    # RFC 1071 section 3 example words: 0001 f203 f4f5 f6f7 -> sum ddf2, checksum 220d
    assert probe.checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D


def test_parse_reply_reads_ttl_and_source():
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 41, 0, 0, 61, 1, 0, bytes([10, 0, 2, 1]), bytes([10, 0, 1, 1]))
    icmp = struct.pack("!BBHHH", 0, 0, 0, 0x1234, 1) + b"testbed-probe"
    assert probe.parse_reply(ip + icmp, 0x1234) == ("10.0.2.1", 61)
    assert probe.parse_reply(ip + icmp, 0x9999) is None  # someone else's echo
    request = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 1)
    assert probe.parse_reply(ip + request, 0x1234) is None  # not a reply


def test_the_all_pairs_check_waits_for_a_round_of_probes_to_cross_the_busiest_port():
    """Every GPU pings every other at once: at 128 GPUs (rail 16 x 8 under 8 spines, dilation
    500000) each leaf uplink carries 16 GPUs x 112 off-leaf peers / 8 uplinks = 224 requests
    and as many replies per round, 448 x 64 B at 800 kbit/s = 0.29 s: resend after 3 rounds'
    worth, not every 200 ms (which piled rounds up until 3111 of 16256 pairs went unanswered)."""
    from testbed.apply import reachability
    from testbed.config import scenario
    from testbed.model import plan as planning

    def timing(*sets):
        p = planning.build(scenario.load("rail-32", list(sets)), "user")
        return reachability.probe_timing(p, p.ecmp_shares()[0])

    assert timing() == (0.2, 10.0)  # 32 GPUs at 100000: a round takes 8 ms, the defaults hold
    resend_s, timeout_s = timing("fabric.servers=16", "fabric.spines=8", "fabric.uplinks.count=8", "dilation=500000")
    assert resend_s == pytest.approx(3 * 448 * 64 * 8 / 800e3)
    assert timeout_s == 10.0
    resend_s, timeout_s = timing("fabric.servers=16", "fabric.spines=8", "fabric.uplinks.count=8", "dilation=2e6")
    assert resend_s == pytest.approx(3 * 448 * 64 * 8 / 200e3) and timeout_s == pytest.approx(8 * resend_s)



@pytest.mark.parametrize("ref, sets", [("leaf-spine", ()), ("rail-32", ()), ("default", ()),
                                       ("leaf-spine", ("fabric.leaves=3", "fabric.spines=3", "fabric.uplinks.count=3"))])
def test_ecmp_shares_match_every_enumerated_path(ref, sets):
    """The per-port shares without enumerating paths equal the enumeration's (each of a
    pair's equal-cost paths an equal share: these fabrics split evenly at every hop), and
    the switches crossed per pair are a shortest path's."""
    from collections import defaultdict

    from testbed.config import scenario
    from testbed.model import plan as planning

    p = planning.build(scenario.load(ref, list(sets)), "user")
    table = p.route_table()
    expected, hops = defaultdict(float), {}
    for a in p.hosts:
        for b in p.hosts:
            if a is not b:
                ps = p.ecmp_paths(a.name, b.name, table=table)
                hops[(a.name, b.name)] = len(ps[0]) - 2
                for path in ps:
                    for _node, intf in path[1:-1]:
                        expected[intf] += 1 / len(ps)
    load, switches = p.ecmp_shares(table)
    assert switches == hops
    assert load.keys() == expected.keys()
    assert all(load[k] == pytest.approx(expected[k]) for k in load)


def test_judging_the_all_pairs_check_needs_every_gpus_results_and_the_planned_hops():
    """A cluster run gathers each server's GPUs' probe results: a GPU whose results are
    missing fails the check by name, as does a reply that crossed the wrong number of switches."""
    from testbed.apply import reachability
    from testbed.config import scenario
    from testbed.errors import RunError
    from testbed.model import plan as planning

    p = planning.build(scenario.load("leaf-spine"), "user")
    _load, switches = p.ecmp_shares()
    ttl = {(a.name, b.name): reachability.DEFAULT_TTL - switches[(a.name, b.name)]
           for a in p.hosts for b in p.hosts if a is not b}
    results = {a.name: {b.addr: ttl[(a.name, b.name)] for b in p.hosts if b is not a} for a in p.hosts}
    assert reachability.judge(p, results, switches, 10.0) == {"pairs": 56, "failures": []}
    with pytest.raises(RunError, match="reachability: no probe results from h5, h6"):
        reachability.judge(p, {k: v for k, v in results.items() if k not in ("h5", "h6")}, switches, 10.0)
    h8 = p.host("h8").addr
    bad = {**results, "h1": {**results["h1"], h8: None}, "h2": {**results["h2"], h8: ttl[("h2", "h8")] + 1}}
    with pytest.raises(RunError, match=r"2 of 56 GPU pairs failed: h1 -> h8 \(.*\): no reply in 10s; "
                                       r"h2 -> h8: reply crossed 2 switches, planned 3"):
        reachability.judge(p, bad, switches, 10.0)
