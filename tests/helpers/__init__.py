"""What the tests share beside their fixtures (tests/conftest.py): the golden folder, the
leftover snapshot, the rerun-once rule for timing-bound runs, a second "server" on this
machine (cluster_server) and the traffic scripts the integration tests start inside a
host's namespace (udp_blast, udp_flows, ce_count: run as scripts, never imported)."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden"
