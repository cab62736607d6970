"""The run folder's JSON-lines files: written a line at a time as things happen (so an
interrupted run keeps everything so far), read whole by ``read_events``."""

from __future__ import annotations

import json
from pathlib import Path


def read_events(path: Path) -> list[dict]:
    """Every whole JSON line of a file (a line still being written is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
