"""Pure pieces of the emulated GPUs: the ring schedule, the RC transport, DCQCN."""

import random
from collections import defaultdict

import pytest

from testbed.model import collectives, plan as planning, schedule
from testbed.wire import roce
from testbed.config import scenario
from testbed.agent.dcqcn import Params, ReactionPoint
from testbed.agent.transport import RecvQP, SendQP, unwrap
from testbed.errors import ConfigError


def default_plan(*sets):
    return planning.build(scenario.load("default", list(sets)))


def test_rail_mapping_walks_each_rail_across_servers():
    p = default_plan()
    assert schedule.ranks(p.scenario.workload, p.hosts) == ["h1", "h5", "h2", "h6", "h3", "h7", "h4", "h8"]
    p = default_plan("workload.mapping=sequential")
    assert schedule.ranks(p.scenario.workload, p.hosts) == [f"h{i}" for i in range(1, 9)]


def test_chunks_cover_the_message_in_4_byte_units():
    sizes = collectives.chunk_sizes(1_000_003, 8)
    assert sum(sizes) >= 1_000_003 and sum(sizes) - 1_000_003 < 4 and all(s % 4 == 0 for s in sizes)


def test_ring_schedule_is_consistent_and_every_rank_sees_every_chunk():
    """Replay the plan: every send is matched by the neighbour's recv of the same size in the
    same step; sends after step 0 wait for the previous step's recv; each rank's 2(n-1)
    receives cover every chunk but its own twice over (reduce-scatter + all-gather)."""
    p = default_plan("workload.iterations=2", "workload.collective.bytes=1000KB")
    wl = p.scenario.workload
    ops = schedule.build(wl, p.hosts)
    order = schedule.ranks(wl, p.hosts)
    n = len(order)
    sends, recvs = defaultdict(list), defaultdict(list)
    for name, lst in ops.items():
        by_id = {o.id: o for o in lst}
        assert [o.id for o in lst] == list(range(len(lst)))
        for o in lst:
            assert all(d < o.id for d in o.deps)
            if o.kind == "send":
                sends[(name, o.peer)].append((o.iteration, o.step, o.bytes))
                if o.step > 0:
                    (dep,) = o.deps
                    assert by_id[dep].kind == "recv" and by_id[dep].step == o.step - 1
            elif o.kind == "recv":
                recvs[(o.peer, name)].append((o.iteration, o.step, o.bytes))
        assert sum(o.kind == "compute" for o in lst) == 2 * 2  # forward and backward, 2 iterations
        assert sum(o.kind == "recv" for o in lst) == 2 * 2 * (n - 1)
    assert sends == recvs  # matched in order, pair by pair
    chunks = collectives.chunk_sizes(1_000_000, n)
    chunks = collectives.chunk_sizes(1_000_000, 3)  # unequal chunks, so a wrong index shows
    p = default_plan("workload.collective.bytes=1000000B", "fabric.servers=1", "fabric.gpus_per_server=3")
    ops = schedule.build(p.scenario.workload, p.hosts)
    order = schedule.ranks(p.scenario.workload, p.hosts)
    for i, name in enumerate(order):
        got = [o.bytes for o in ops[name] if o.kind == "recv" and o.iteration == 0]
        # reduce-scatter: every chunk but its own (i); all-gather: every chunk but the one it
        # finished reducing ((i + 1) mod n)
        assert got[:2] == [chunks[(i - 1) % 3], chunks[(i - 2) % 3]]
        assert got[2:] == [chunks[i], chunks[(i - 1) % 3]]


def test_ring_ideal_and_bus_bandwidth():
    # 8 ranks, 2 MB at 400G with 4096-byte payloads: 2 x 7/8 x 2 MB / (400G x 4096/4154)
    t = collectives.ring_ideal_ns(2_000_000, 8, 400e9, 4096)
    assert t == pytest.approx(1.75 * 2e6 * 8 / (400e9 * 4096 / 4154) * 1e9)
    assert collectives.ring_ideal_ns(2_000_000, 8, 400e9, 4096, step_latency_ns=500) == pytest.approx(t + 14 * 500)
    assert collectives.bus_bandwidth_bps(2_000_000, 8, t) == pytest.approx(400e9 * 4096 / 4154)


def test_a_rings_cable_delay_is_its_chain_of_hops_not_the_longest_hop_times_the_steps():
    """With cable delay emulated, the default rail ring h1 h5 h2 h6 h3 h7 h4 h8 alternates
    hops inside a rail leaf (3 m + 3 m: 30 ns) and across the spines (3 + 100 + 100 + 3 m:
    1030 ns). GPU j's last step waits for the 14 hops before it around the ring, 7 of each:
    7420 ns, 530 ns per step; 14 x 1030 ns would make the ideal 7 us slower than the physics
    (the lab VM, where netem delays packets, measured the ring x0.93 of that ideal)."""
    from testbed.model import training

    p = planning.build(scenario.load("default"), "kernel", link_delay=True)
    order = schedule.layout(p.scenario.workload, p.hosts).dp_groups[(0, 0)]
    table = p.route_table()
    assert training.hop_propagation_ns(p, order, table) == [30, 1030] * 4
    assert training.ring_step_propagation_ns(p, order, table) == 7420 / 14
    assert training.max_ring_propagation_ns(p, order, table) == 1030
    assert p.training.ideal["step_latency_ns"] == 530
    assert p.training.ideal["data_parallel_ns"] == pytest.approx(
        collectives.ring_ideal_ns(2_000_000, 8, 400e9, 4096) + 7420)
    # an algorithm that is not the ring keeps the longest hop per step (a bound)
    hd = planning.build(scenario.load("default", ["workload.collective.algorithm=halving-doubling"]), "kernel",
                        link_delay=True)
    assert hd.training.ideal["step_latency_ns"] == 1030
    # without cable delay emulated, the ideal has no propagation term at all
    assert planning.build(scenario.load("default"), "user").training.ideal["step_latency_ns"] == 0


@pytest.mark.parametrize("algorithm,busbw_bps", [("ring", 700e9), ("reduce-scatter", 350e9), ("all-gather", 350e9),
                                                 ("all-to-all", 350e9), ("broadcast", 400e9)])
def test_bus_bandwidth_per_algorithm(algorithm, busbw_bps):
    # nccl-tests' factors, by hand: 1 MB among 8 ranks in 20 us is an algbw of 400 Gb/s; an AllReduce
    # moves 2 x 7/8 of it per rank, reduce-scatter, all-gather and all-to-all 7/8, a broadcast all of it
    assert collectives.bus_bandwidth_bps(1_000_000, 8, 20_000, algorithm) == pytest.approx(busbw_bps)


def test_model_front_end_buckets_gradients():
    p = default_plan("workload.model.parameters=125M", "workload.model.precision=bf16", "workload.collective.bytes=null",
                     "workload.collective.bucket=100MB")
    wl = p.scenario.workload
    assert wl.gradient_bytes == 250_000_000 and wl.gradient_source == "model"
    assert wl.allreduce_bytes == (100_000_000, 100_000_000, 50_000_000)


def test_psn_unwrap_across_24_bits():
    assert unwrap(5, 2 ** 24 - 3) == 2 ** 24 + 5
    assert unwrap(2 ** 24 - 2, 2 ** 24 + 5) == 2 ** 24 - 2
    assert unwrap(7, 7) == 7


def _transfer(messages, drop, mtu=1024, rto=50):
    """Drive a SendQP and a RecvQP over a lossy in-order channel until every message is
    acknowledged; returns (received sizes, sender, receiver)."""
    tx, rx = SendQP(mtu), RecvQP()
    for size in messages:
        tx.post(size)
    now, acked = 0, []
    while len(acked) < len(messages):
        now += 1
        assert now < 100_000, "transfer did not converge"
        pkt = tx.peek()
        if pkt is not None:
            tx.sent(pkt, now)
            if not drop(pkt):
                reply, _ = rx.on_data(pkt.psn & roce.PSN_MASK, pkt.opcode, pkt.payload, pkt.ackreq)
                if reply and reply[0] == "ack":
                    acked += tx.on_ack(reply[1], now)
                elif reply:
                    acked += tx.on_nak(reply[1], now)
        tx.check_timeout(now, rto)
    return rx.messages, tx, rx


def test_transport_delivers_in_order_without_loss():
    got, tx, rx = _transfer([5000, 1024, 1, 0, 3000], drop=lambda p: False)
    assert got == [5000, 1024, 1, 0, 3000]
    assert tx.retransmitted == 0 and rx.naks_sent == 0 and not tx.unacked


def test_transport_go_back_n_recovers_every_loss_pattern():
    rng = random.Random(7)
    got, tx, rx = _transfer([20_000] * 20, drop=lambda p: rng.random() < 0.1)
    assert got == [20_000] * 20
    assert tx.retransmitted > 0 and rx.naks_sent > 0 and rx.out_of_order > 0


def test_transport_tail_loss_needs_the_timeout():
    dropped = set()

    def drop_last_once(p):
        if p.last and p.psn not in dropped:
            dropped.add(p.psn)
            return True
        return False

    got, tx, rx = _transfer([4096], drop=drop_last_once)
    assert got == [4096] and tx.timeouts == 1 and rx.naks_sent == 0


def test_dcqcn_cuts_on_cnp_and_recovers():
    rp = ReactionPoint(400e9, 0, Params())
    rp.on_cnp(10)
    assert rp.rate_bps == 200e9  # alpha starts at 1: cut by half (the 50 % floor)
    rp.on_cnp(1000)  # within rate_reduce_monitor_period (4 us): no second cut
    assert rp.rate_bps == 200e9 and rp.cuts == 1
    rp.on_cnp(5000)
    assert rp.rate_bps < 200e9 and rp.cuts == 2
    low = rp.rate_bps
    for t in range(5000, 50_000_000, 100_000):  # no more CNPs: timers and bytes bring it back
        rp.tick(t)
        rp.on_sent(200_000, t)
    assert rp.rate_bps == 400e9 and rp.alpha < 0.1
    assert low < rp.rate_bps


def test_dcqcn_first_cnp_uses_the_initial_alpha_however_long_the_flow_ran():
    rp = ReactionPoint(400e9, 0, Params())
    for t in range(0, 100_000, 1000):  # 100 us at line rate before any congestion
        rp.tick(t)
    rp.on_cnp(100_000)
    assert rp.rate_bps == 200e9 and rp.alpha == pytest.approx(1.0, abs=0.01)


def test_dcqcn_parameters_from_the_workload():
    sc = scenario.load("default", ["workload.transport.dcqcn={byte_reset: 10MB, time_reset: 55us, ai_rate: 40M}"])
    assert dict(sc.workload.dcqcn_params) == {"time_reset_ns": 55_000, "byte_reset": 10_000_000, "ai_bps": 40e6}
    assert sc.workload.dcqcn
    p = Params(**dict(sc.workload.dcqcn_params))
    assert p.byte_reset == 10_000_000 and p.reduce_period_ns == Params().reduce_period_ns
    with pytest.raises(ConfigError) as err:
        scenario.load("default", ["workload.transport.dcqcn={byte_reset: lots, speed: 2}"])
    opt = "--set workload.transport.dcqcn={byte_reset: lots, speed: 2}"
    assert err.value.problems == [
        f"{opt}: speed: unknown field (expected one of: time_reset, byte_reset, ai_rate, hai_rate, reduce_period, "
        "cnp_interval, min_dec_factor)",
        f"{opt}: byte_reset: expected a size like 32MB, 100KB, 9000B, got 'lots'"]


def test_dcqcn_off_ignores_cnps():
    rp = ReactionPoint(400e9, 0, Params(), enabled=False)
    rp.on_cnp(10)
    assert rp.rate_bps == 400e9 and rp.cnps == 1


def test_layout_megatron_order_and_tensor_groups_stay_in_a_server():
    p = default_plan("workload.parallelism.tensor=2", "workload.parallelism.pipeline=2")
    lay = schedule.layout(p.scenario.workload, p.hosts)
    assert lay.tp_groups[(0, 0)] == ["h1", "h2"] and lay.tp_groups[(1, 1)] == ["h7", "h8"]
    assert lay.chains[(0, 0)] == ["h1", "h5"]  # stage 0 on server 1, stage 1 on server 2
    assert lay.dp_groups[(0, 0)] == ["h1", "h3"]
    with pytest.raises(Exception, match="spans servers"):
        schedule.layout(default_plan("workload.parallelism.tensor=2",
                                     "workload.mapping=[h1, h5, h2, h6, h3, h7, h4, h8]").scenario.workload, p.hosts)


@pytest.mark.parametrize("kind,stage,want", [
    ("gpipe", 0, [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]),
    ("1f1b", 0, [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]),  # 2 warm-up forwards
    ("1f1b", 1, [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]),
    ("1f1b", 2, [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]),
])
def test_pipeline_orders(kind, stage, want):
    assert schedule.pipeline_order(kind, 3, stage, 3) == want


@pytest.mark.parametrize("algorithm", ["halving-doubling", "all-to-all", "hierarchical", "reduce-scatter",
                                       "all-gather", "ring"])
def test_every_collective_pairs_its_messages(algorithm):
    """Replayed per connection: each send has the peer's receive of the same size in the
    same order, and the collective moves the bytes its definition says."""
    p = default_plan(f"workload.collective.algorithm={algorithm}", "workload.iterations=1",
                     "workload.collective.bytes=800KB")
    ops = schedule.build(p.scenario.workload, p.hosts)
    sends, recvs = defaultdict(list), defaultdict(list)
    for name, lst in ops.items():
        for o in lst:
            if o.kind == "send":
                sends[(name, o.peer, o.link)].append(o.bytes)
            elif o.kind == "recv":
                recvs[(o.peer, name, o.link)].append(o.bytes)
    assert sends == recvs
    fabric = sum(b for (_, _, link), lst in sends.items() if link == "fabric" for b in lst)
    nvlink = sum(b for (_, _, link), lst in sends.items() if link == "nvlink" for b in lst)
    n, s = 8, 800_000
    expected = {"ring": 2 * (n - 1) * s, "reduce-scatter": (n - 1) * s, "all-gather": (n - 1) * s,
                "all-to-all": (n - 1) * s, "halving-doubling": 2 * (n - 1) * s,
                "hierarchical": 2 * (2 - 1) * s}  # 4 rails x ring of S/4 over 2 servers
    assert fabric == pytest.approx(expected[algorithm], rel=0.01)
    assert (nvlink > 0) == (algorithm == "hierarchical")


def test_tensor_parallel_traffic_stays_on_nvlink():
    p = default_plan("workload.parallelism.tensor=4", "workload.iterations=1")
    ops = schedule.build(p.scenario.workload, p.hosts)
    tp = [o for lst in ops.values() for o in lst if o.phase == "tp"]
    assert tp and all(o.link == "nvlink" for o in tp)
    servers = {h.name: h.server for h in p.hosts}
    assert all(servers[o.peer] == servers[name] for name, lst in ops.items() for o in lst if o.phase == "tp")


def test_dcqcn_byte_counter_counts_64_byte_units():
    """rpg_byte_reset 32767 counts 64-byte units: one rate-increase event per ~2 MB sent."""
    rp = ReactionPoint(400e9, 0, Params())
    rp.on_cnp(0)
    assert rp.rate_bps == 200e9 and rp.target_bps == 400e9
    rp.on_sent(32767 * 64 - 1, 10)
    assert rp.rate_bps == 200e9
    rp.on_sent(1, 20)  # the first event after a cut: fast recovery, halfway back to the target
    assert rp.rate_bps == 300e9 and rp.target_bps == 400e9
    rp.on_sent(32767 * 64, 30)  # then additive increase: the target grows by rpg_ai_rate
    assert rp.target_bps == 400e9 and rp.rate_bps == 350e9  # (target capped at the line rate)


def test_dcqcn_back_to_back_cuts_keep_the_target_until_the_rate_rises():
    rp = ReactionPoint(400e9, 0, Params())
    rp.on_cnp(0)
    rp.on_cnp(5_000)  # no increase between the cuts: the target stays at the pre-congestion rate
    assert rp.cuts == 2 and rp.target_bps == 400e9 and rp.rate_bps < 200e9
    cut = rp.rate_bps
    rp.on_sent(32767 * 64, 6_000)
    risen = rp.rate_bps
    assert risen == (cut + 400e9) / 2
    rp.on_cnp(10_000)  # an increase happened since the last cut: the target clamps to the rate
    assert rp.target_bps == risen and rp.rate_bps < risen


def test_dcqcn_alpha_rises_in_periods_with_a_cnp_and_decays_in_the_others():
    p = Params()
    rp = ReactionPoint(400e9, 0, p)
    rp.on_cnp(0)  # first CNP: alpha = initial_alpha (1.0)
    rp.tick(500)
    assert rp.alpha == 1.0
    rp.tick(1_000)  # the period held a CNP: (1 - g) 1 + g
    assert rp.alpha == pytest.approx(1.0)
    rp.tick(2_000)  # no CNP in this one: decays
    assert rp.alpha == pytest.approx(1 - p.g)
    rp.on_cnp(2_500)
    rp.tick(3_000)
    assert rp.alpha == pytest.approx((1 - p.g) ** 2 + p.g)


@pytest.mark.parametrize("sets", [
    [], ["workload.collective.bytes=1000003"], ["workload.parallelism.tensor=4"],
    ["workload.parallelism.pipeline=2", "workload.parallelism.tensor=2", "workload.pipeline_schedule=gpipe"],
    ["workload.parallelism.pipeline=4", "workload.micro_batches=3"],
    ["workload.collective.algorithm=halving-doubling", "workload.collective.bytes=999999"],
    ["workload.collective.algorithm=hierarchical"], ["workload.collective.algorithm=all-to-all"],
    ["workload.collective.algorithm=reduce-scatter"], ["workload.collective.algorithm=all-gather"],
    ["workload.collective.bucket=700KB"],
], ids=["ring", "ring-odd", "tp4", "pp2-tp2", "pp4", "hd", "hierarchical", "a2a", "rs", "ag", "buckets"])
def test_closed_form_bytes_equal_the_built_schedule(sets):
    """What `show` says an iteration sends (closed forms, no ops built) is what the ops the
    agents run send, per link."""
    from testbed.views.show import iteration_bytes

    p = planning.build(scenario.load("default", sets), "user")
    sent = {"fabric": 0, "nvlink": 0}
    for ops in p.training.ops.values():
        for op in ops:
            if op.kind == "send" and op.iteration == 0:
                sent[op.link] += op.bytes
    assert iteration_bytes(p.training, p.scenario.workload) == (sent["fabric"], sent["nvlink"])
    assert sent["fabric"] + sent["nvlink"] > 0


def test_collectives_are_listed_without_building_ops():
    """The plan lists every collective from a build with no members, identical to the full
    build's, and builds the ops only when asked."""
    p = planning.build(scenario.load("default", ["workload.parallelism.tensor=2"]), "user")
    assert "ops" not in p.training.__dict__
    full = schedule.build_plan(p.scenario.workload, p.hosts, 400e9, 3.6e12)[1]
    assert [{k: v for k, v in c.items() if k != "ideal_ns"} for c in p.training.collectives] == \
        [{k: v for k, v in c.items() if k != "ideal_ns"} for c in full]
    some = p.training.ops_of(["h1"])
    assert some["h1"] == p.training.ops["h1"] and some["h2"] == ()
