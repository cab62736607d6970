"""Which of a GPU's ops may start next (pure): an op is ready once every op it depends on is
done, and a connection's messages start in planned order (a ready send or receive waits
while an earlier one on the same connection has not started), since the receiver matches
a connection's messages to its posted receives in that order."""

from __future__ import annotations

from collections import defaultdict, deque


def peer_link(op: dict) -> tuple:
    """The connection an op's message travels on: (peer GPU, link: fabric or nvlink)."""
    return op["peer"], op.get("link", "fabric")


def connection_key(op: dict) -> tuple:
    """A connection's messages of one kind (sends or receives), which start in planned order."""
    return (*peer_link(op), op["kind"])


class OpGraph:
    """Dependencies counted down as ops finish: a scan of every waiting op per finish was
    quadratic (a 128-GPU ring has ~510 ops per GPU per iteration)."""

    def __init__(self, ops: list):
        self.by_id = {op["id"]: op for op in ops}
        self.deps_left = {op["id"]: len(op["deps"]) for op in ops}
        self.dependents = defaultdict(list)
        self.planned = defaultdict(deque)  # connection key -> its op ids in planned order
        for op in ops:
            for d in op["deps"]:
                self.dependents[d].append(op["id"])
            if op["kind"] != "compute":
                self.planned[connection_key(op)].append(op["id"])
        self.ready = deque(i for i, n in self.deps_left.items() if n == 0)
        self.held = defaultdict(set)  # connection key -> ready ops waiting for an earlier message's turn

    def finished(self, op_id: int):
        for later in self.dependents[op_id]:
            self.deps_left[later] -= 1
            if not self.deps_left[later]:
                self.ready.append(later)

    def pop_ready(self) -> dict | None:
        """The next op that may start now (its connection's turn taken), or None."""
        while self.ready:
            op = self.by_id[self.ready.popleft()]
            if op["kind"] == "compute":
                return op
            key = connection_key(op)
            planned = self.planned[key]
            if planned[0] != op["id"]:
                self.held[key].add(op["id"])
                continue
            planned.popleft()
            if planned and planned[0] in self.held[key]:
                self.held[key].discard(planned[0])
                self.ready.append(planned[0])
            return op
        return None
