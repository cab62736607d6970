import json
import subprocess

import pytest


def snapshot() -> dict:
    """What a run could leave behind: root-namespace links, OVS bridges, named namespaces."""
    links = {link["ifname"] for link in json.loads(
        subprocess.run(["ip", "-json", "link", "show"], capture_output=True, text=True, check=True,
                       timeout=30).stdout)}
    bridges = set(subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True,
                                 timeout=30).stdout.split())
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True,
                               timeout=30).stdout.split())
    return {"links": links, "bridges": bridges, "netns": netns}


@pytest.fixture
def clean_slate():
    """Fails the test if anything it created in the root namespace or OVS is still there."""
    before = snapshot()
    yield before
    assert snapshot() == before
