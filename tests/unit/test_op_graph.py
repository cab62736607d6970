"""Which ops may start (testbed.agent.ops.OpGraph): dependencies counted down, and a
connection's messages started in planned order even when a later one is ready first."""

from testbed.agent.ops import OpGraph


def op(i, kind="compute", deps=(), peer=None):
    return {"id": i, "kind": kind, "deps": list(deps), "peer": peer, "link": "fabric"}


def drain(g):
    out = []
    while (o := g.pop_ready()) is not None:
        out.append(o["id"])
    return out


def test_an_op_starts_once_every_dependency_finished():
    g = OpGraph([op(0), op(1), op(2, deps=[0, 1]), op(3, deps=[2])])
    assert drain(g) == [0, 1]
    g.finished(0)
    assert drain(g) == []
    g.finished(1)
    assert drain(g) == [2]
    g.finished(2)
    assert drain(g) == [3]


def test_a_connections_messages_start_in_planned_order():
    # send 1 then send 2 to h2 are planned in that order; 2 is ready first (its compute is done)
    g = OpGraph([op(0), op(9), op(1, "send", [0], "h2"), op(2, "send", [9], "h2"), op(3, "recv", [9], "h2")])
    assert drain(g) == [0, 9]
    g.finished(9)
    assert drain(g) == [3]  # the receive is another queue; send 2 is held behind send 1
    g.finished(0)
    assert drain(g) == [1, 2]  # send 1 starts and releases send 2 in the same pass
    assert drain(g) == []
