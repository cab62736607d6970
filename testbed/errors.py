"""Errors a user can fix, reported without a traceback.

A ``ConfigError`` carries one line per problem, each naming the file (or the
``--set`` option) and the YAML path, for example
``topologies/x.yaml: leaves[2].uplinks.count: expected an integer >= 1, got 'two'``.
The CLI prints them and exits with status 2.
"""

from __future__ import annotations


class TestbedError(Exception):
    """A failure the user should see as one clear message, not a traceback."""

    exit_code = 1


class ConfigError(TestbedError):
    """Invalid scenario, topology or command-line input (exit status 2)."""

    exit_code = 2

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class RunError(TestbedError):
    """A run could not be completed (bring-up failed, a GPU unreachable, the controller died)."""

    exit_code = 1
