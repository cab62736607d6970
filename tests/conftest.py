import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


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
