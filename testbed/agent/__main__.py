"""``python -m testbed.agent PLAN_JSON GPU RECORDS``: one emulated GPU, started by the run
in the GPU's namespace. Prints ``ready`` once its sockets are open, reads the shared start
time and deadline from stdin, runs its ops, prints ``done``, and answers its peers until
the run closes stdin (closed earlier, during the ops: it stops)."""

import json
import os
import sys

from testbed.agent.config import from_plan
from testbed.agent.runner import Agent


def main(argv=None) -> int:
    plan_path, gpu, records = sys.argv[1:] if argv is None else argv
    with open(plan_path) as f:
        cfg = from_plan(json.load(f), gpu, records)
    # One CPU per agent (GPUs spread over the CPUs): a sender that hops between CPUs leaves
    # its packets in two CPUs' receive backlogs of the veth, which can deliver them out of
    # order, and a NIC never reorders one flow. Seen as go-back-N retransmissions on a
    # non-blocking fabric in CI.
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cfg["index"] % len(os.sched_getaffinity(0))]})
    agent = Agent(cfg, control=sys.stdin)
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 3  # the run went away before starting us
    start_ns, deadline_ns = (int(x) for x in line.split())
    try:
        rc = agent.run(start_ns, deadline_ns)
        if rc == 0:
            print("done", flush=True)
            agent.linger(sys.stdin)
        return rc
    finally:
        agent.report()
        agent.out.close()


sys.exit(main())
