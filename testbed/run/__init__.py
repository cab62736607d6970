"""A run, stage by stage: plan, bring up, program, check reachability, train, collect,
report, tear down (``stages``), with its manifest (``manifest``)."""

from testbed.run.stages import RunContext, RunOptions, RunResult, Terminated, run

__all__ = ["RunContext", "RunOptions", "RunResult", "Terminated", "run"]
