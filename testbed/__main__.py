"""``python -m testbed``: with any interpreter. The packages a run needs are checked first;
where the project's venv exists (made by ``./lab`` / scripts/install.sh) and this is not
its interpreter, the command re-executes itself there, so ``sudo python -m testbed run``
works as the README writes it; otherwise one line says how to install, exit 2, nothing
created."""

import importlib.util
import os
import sys
from pathlib import Path

NEEDED = ("yaml", "os_ken", "pyroute2", "pandas", "plotly", "mininet")
ROOT = Path(__file__).resolve().parent.parent


def _venvs():
    # the lab VM's venv first: in the VM, ROOT/.venv is the host's, seen through the synced folder
    for path in (os.environ.get("TESTBED_VENV"), "/opt/testbed/venv", ROOT / ".venv"):
        if path and (Path(path) / "bin" / "python").exists():
            yield Path(path) / "bin" / "python"


def _missing() -> list:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def _ensure_interpreter():
    missing = _missing()
    if not missing:
        return
    if not os.environ.get("TESTBED_REEXEC"):
        for python in _venvs():
            if Path(sys.prefix).resolve() != python.parent.parent.resolve():
                os.environ["TESTBED_REEXEC"] = "1"
                os.execv(str(python), [str(python), "-m", "testbed", *sys.argv[1:]])
    print(f"error: {sys.executable} has not got the testbed's packages ({', '.join(missing)} missing): run "
          f"./lab doctor as root in {ROOT} (it installs them into .venv), then python -m testbed again",
          file=sys.stderr)
    raise SystemExit(2)


_ensure_interpreter()

from testbed.cli import main  # noqa: E402

try:
    raise SystemExit(main())
except BrokenPipeError:  # the reader went away (| head): not an error of ours
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(0) from None
