"""Fixtures and the collection rule (integration tests need root, OVS and Mininet);
shared helpers are in tests/helpers, imported as ``helpers``."""

import os
import shutil

import pytest

from helpers.runs import snapshot
from testbed.paths import ROOT


@pytest.fixture
def in_repo(monkeypatch):
    """Messages name files relative to the working directory: run from the repo root."""
    monkeypatch.chdir(ROOT)
    return ROOT


def pytest_collection_modifyitems(config, items):
    reasons = []
    if os.geteuid() != 0:
        reasons.append("needs root")
    if shutil.which("ovs-vsctl") is None or shutil.which("mnexec") is None:
        reasons.append("needs Open vSwitch and Mininet (./lab test installs them)")
    if not reasons:
        return
    skip = pytest.mark.skip(reason="; ".join(reasons))
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def clean_slate():
    """Fails the test if anything it created in the root namespace or OVS is still there."""
    before = snapshot()
    yield before
    assert snapshot() == before
