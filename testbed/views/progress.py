"""Training progress on the terminal, from the agents' records as they are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path


class Progress:
    """Training progress from the agents' records as they are written: ops done of all,
    iterations every GPU has finished, and what the newest op was doing. On a terminal a
    bar redrawn in place; otherwise one plain line per finished iteration."""

    BAR = 30

    def __init__(self, ops: dict, records_dir: Path, iterations: int, out=None):
        self.records_dir, self.iterations = records_dir, iterations
        self.out = out if out is not None else sys.stderr
        self.tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.total = sum(len(v) for v in ops.values())
        self.per_iteration: dict[int, int] = {}
        for lst in ops.values():
            for op in lst:
                self.per_iteration[op.iteration] = self.per_iteration.get(op.iteration, 0) + 1
        self.done_per_iteration: dict[int, int] = {}
        self.offsets: dict[Path, int] = {}
        self.done = 0
        self.now = ""
        self.reported = 0
        self.drawn = False  # a bar is on the terminal without its newline

    def close(self):
        """End a bar left unfinished (training failed or was interrupted)."""
        if self.drawn:
            self.out.write("\n")
            self.out.flush()
            self.drawn = False

    def poll(self):
        for path in sorted(self.records_dir.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # whole lines only
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") == "op":
                    self.done += 1
                    it = rec["iteration"]
                    self.done_per_iteration[it] = self.done_per_iteration.get(it, 0) + 1
                    self.now = rec["phase"] if rec["kind"] == "compute" else f"{rec['phase']} {rec['kind']}s"

    @property
    def iterations_done(self) -> int:
        n = 0
        while n < self.iterations and self.done_per_iteration.get(n, 0) >= self.per_iteration.get(n, 1):
            n += 1
        return n

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.BAR)
        return (f"training [{'#' * filled}{'.' * (self.BAR - filled)}] {frac:4.0%}  iteration "
                f"{min(self.iterations_done + 1, self.iterations)}/{self.iterations}  {self.now}")

    def tick(self):
        self.poll()
        if self.tty:
            self.out.write("\r" + self.line().ljust(90))
            self.drawn = self.done < self.total
            if not self.drawn:
                self.out.write("\n")
            self.out.flush()
            return
        while self.reported < self.iterations_done:
            self.reported += 1
            self.out.write(f"training: iteration {self.reported}/{self.iterations} done on every GPU "
                           f"({self.done}/{self.total} ops)\n")
            self.out.flush()
