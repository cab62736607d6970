"""``python -m testbed lab {list,show,run,check}``: what a trainee types.

``list`` and ``show`` need no root; ``run`` runs the lab's README commands in order (as
root, like ``testbed run``); ``check`` checks the newest runs of the lab (or the given
folders) and exits 0 when every observation holds, 1 when one does not.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

from testbed.labs import catalog, observe

TIMES = "lab-times.json"  # in the results folder: each lab's measured `lab run` wall time here


def _times(results_dir: Path) -> dict:
    try:
        return json.loads((results_dir / TIMES).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def list_text(results_dir: Path) -> str:
    labs = catalog.all_labs()
    here = _times(results_dir)
    rows = []
    for lab in labs:
        mine = here.get(str(lab.number))
        rows.append((f"{lab.number}", lab.title, lab.teaches, f"{lab.minutes:.1f}",
                     f"{mine['seconds'] / 60:.1f}" if mine else "-"))
    header = ("lab", "title", "what it teaches", "min", "here")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    out = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in [header] + rows]
    total = sum(lab.minutes for lab in labs)
    out.append(f"\n'min': the wall time of `lab run N` ({labs[0].measured if labs else 'not measured'}; "
               f"{total:.0f} minutes for all); 'here': this machine's last `lab run N`.")
    out.append("python -m testbed lab show N   the lab's text;   lab run N   its runs;   lab check N   the check")
    return "\n".join(out)


def show(number: str) -> str:
    return catalog.find(number).readme.read_text(encoding="utf-8").rstrip("\n")


def run(number: str, results_dir: Path, overrides: list[str], main) -> int:
    """Run the lab's ``run`` commands in order (``all``: every lab), each with
    ``--results`` and the extra ``--set`` overrides, through ``main`` (the CLI's entry,
    argv -> exit status, given by the CLI: labs sit below it); stop at the first that fails."""

    labs = catalog.all_labs() if number == "all" else [catalog.find(number)]
    for lab in labs:
        print(f"lab {lab.number}: {lab.title}: {len(lab.runs)} run(s)", flush=True)
        start = time.monotonic()
        for cmd in lab.runs:
            argv = [*cmd.argv, "--results", str(results_dir)] + [a for o in overrides for a in ("--set", o)]
            print(f"$ python -m testbed {' '.join(argv)}", flush=True)
            rc = main(argv)
            if rc != 0:
                print(f"lab {lab.number}: the run above failed (exit {rc}); nothing more run")
                return rc
        seconds = time.monotonic() - start
        times = _times(results_dir)
        times[str(lab.number)] = {"seconds": round(seconds, 1), "overrides": overrides,
                                  "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / TIMES).write_text(json.dumps(times, indent=1, sort_keys=True))
        print(f"lab {lab.number}: {len(lab.runs)} run(s) in {seconds / 60:.1f} min, results in {results_dir}; "
              f"now: python -m testbed lab check {lab.number}", flush=True)
    return 0


def check(number: str, results_dir: Path, run_dirs: list[Path], parse_args) -> int:
    from testbed.views import report

    lab = catalog.find(number)
    runs, observations = observe.check(lab, results_dir, run_dirs, parse_args)
    if len(runs) > 1:
        print(report.compare([v.dir for v in runs.values()]))
        print()
    print(observe.render(lab, runs, observations))
    return 0 if all(o.ok for o in observations) else 1
