"""A child that ends without its answer says how it ended and its last words; a training's
hang guard moves on while ops end. Real (unprivileged) child processes, a fake clock."""

import sys
import time

import pytest

from testbed.apply.processes.agents import StallGuard
from testbed.apply.processes.child import Child, exit_status, last_lines, wait_for
from testbed.errors import RunError


def test_exit_status_in_words():
    assert exit_status(0) == "exit status 0"
    assert exit_status(4) == "exit status 4"
    assert exit_status(-9) == "killed by SIGKILL"
    assert exit_status(-15) == "killed by SIGTERM"
    assert exit_status(143) == "exit status 143 (SIGTERM)"
    assert exit_status(None) == "still running"


def test_last_lines_skip_blank_lines_and_keep_the_end():
    assert last_lines("a\n\nb\n  \nc\nd\ne\nf\n\n", 3) == "d | e | f"
    assert last_lines("") == ""


def python(code: str) -> list:
    return [sys.executable, "-c", code]


def test_a_child_that_exits_without_its_answer_is_named_with_status_and_stderr(tmp_path):
    log = tmp_path / "child.log"
    child = Child("the test child", python("import sys; print('one', file=sys.stderr); "
                                           "print('two: gave up', file=sys.stderr); sys.exit(4)"), log=log).start()
    with pytest.raises(RunError) as err:
        child.expect("done", time.monotonic() + 30, "the test child to finish")
    text = str(err.value)
    assert "the test child" in text and "exit status 4" in text, text
    assert "one | two: gave up" in text and str(log) in text, text
    assert log.read_text() == "one\ntwo: gave up\n"  # all of it kept in the file


def test_a_killed_child_is_named_with_its_signal(tmp_path):
    log = tmp_path / "s.log"
    # it waits for a line on its stdin, which never comes: it runs until killed
    child = Child("the sleeper", python("import sys; print('started', file=sys.stderr, flush=True); "
                                        "sys.stdin.readline()"), log=log).start()
    try:
        wait_for(lambda: log.read_text(), 30, "the sleeper's first stderr line")
        child.proc.kill()
        with pytest.raises(RunError, match=r"the sleeper .*killed by SIGKILL; last stderr: started"):
            child.expect("done", time.monotonic() + 30, "the sleeper to answer")
    finally:
        child.end(5)


def test_an_unexpected_answer_is_named_with_the_last_words(tmp_path):
    child = Child("the talker", python("print('nope', flush=True)"), log=tmp_path / "t.log").start()
    try:
        with pytest.raises(RunError, match=r"the talker said 'nope' instead of 'done'"):
            child.expect("done", time.monotonic() + 30, "the talker")
    finally:
        child.end(5)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Ops:
    def __init__(self, total):
        self.done, self.total = 0, total

    def tick(self):
        pass


def test_the_hang_deadline_moves_while_ops_end_and_holds_when_they_stop():
    clock, ops = Clock(), Ops(10)
    guard = StallGuard(30, ops, clock)
    guard.tick()
    assert guard.deadline() == 130
    clock.t, ops.done = 125, 3  # slow, but moving: 30 s from the last op
    guard.tick()
    assert guard.deadline() == 155
    clock.t = 150  # nothing ended since: the deadline stays
    guard.tick()
    assert guard.deadline() == 155
    assert guard.explain() == "no op ended for 30s; 3 of 10 ops done"


def test_without_progress_the_hang_deadline_is_fixed():
    clock = Clock()
    guard = StallGuard(30, None, clock)
    clock.t = 500
    guard.tick()
    assert guard.deadline() == 130
