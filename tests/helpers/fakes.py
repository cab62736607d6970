"""Stand-ins for an agent's clock and receive sockets, for the unit tests and
bench/agent_loop.py: the agent's loop takes both as parameters."""


class Clock:
    """CLOCK_MONOTONIC ns that moves only when told (``now``)."""

    def __init__(self):
        self.now = 10**9

    def __call__(self):
        return self.now


class Inbox:
    """A non-blocking socket's receive side: what was queued, then BlockingIOError."""

    def __init__(self):
        self.queue = []

    def recvmsg(self, size, ancsize):
        if not self.queue:
            raise BlockingIOError
        return self.queue.pop(0)

    def recv(self, size):
        if not self.queue:
            raise BlockingIOError
        return self.queue.pop(0)
