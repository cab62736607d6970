"""Where the project's files are: the repository root and its folders (inputs the user
writes, the compiled marker, results)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = ROOT / "scenarios"
TOPOLOGY_DIR = ROOT / "topologies"
TRAFFIC_DIR = ROOT / "traffic"
RESULTS_DIR = ROOT / "results"
MARKER_OBJECT = ROOT / "build" / "marker.o"
LABS_DIR = ROOT / "labs"
