"""The labs as data (no root): one folder per lab, ``labs/NN-short-name/``, holding

- ``README.md``: ``# Lab N: title``, the question, background, a ``## Run it`` section
  whose ``sh`` code block lists the exact commands (``python -m testbed run ...`` for each
  run, in order, then ``python -m testbed lab check N``), where to look, questions, the
  folded expected observation and one variation to try;
- ``lab.yaml``: ``teaches`` (one line for ``lab list``) and ``minutes`` with ``measured``
  (the wall time of ``lab run N`` on a 2-core machine, and where and when it was measured);
- the scenario files its runs use, and ``check.py`` (``observe(runs)``).

The run commands are read from the README, so the text a trainee follows and what
``lab run`` and the tests execute cannot drift apart.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed import paths
from testbed.errors import ConfigError

FOLDER_RE = re.compile(r"(\d\d)-[a-z0-9-]+")
TITLE_RE = re.compile(r"# Lab (\d+): (.+)")
PREFIXES = (("python", "-m", "testbed"), ("python3", "-m", "testbed"))


@dataclass(frozen=True)
class Command:
    """One line of a lab's ``Run it`` block: ``argv`` after ``python -m testbed``."""

    line: str
    argv: tuple

    @property
    def is_run(self) -> bool:
        return self.argv[:1] == ("run",)


@dataclass(frozen=True)
class Lab:
    number: int
    slug: str
    path: Path
    title: str
    teaches: str
    minutes: float
    measured: str
    commands: tuple  # of Command, in the README's order

    @property
    def runs(self) -> tuple:
        return tuple(c for c in self.commands if c.is_run)

    @property
    def readme(self) -> Path:
        return self.path / "README.md"


def commands(readme_text: str, source: str = "README.md") -> tuple:
    """The ``python -m testbed ...`` lines of the ``sh`` code blocks under ``## Run it``
    (a leading ``sudo`` dropped; comments and blank lines skipped)."""
    section = re.search(r"^## Run it\s*$(.*?)(?=^## |\Z)", readme_text, re.M | re.S)
    if not section:
        raise ConfigError(f"{source}: no '## Run it' section")
    found = []
    for block in re.findall(r"^```sh\s*$(.*?)^```\s*$", section.group(1), re.M | re.S):
        for raw in block.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line)
            if words[:1] == ["sudo"]:
                words = words[1:]
            prefix = next((p for p in PREFIXES if tuple(words[:3]) == p), None)
            if prefix is None:
                raise ConfigError(f"{source}: '## Run it': expected 'python -m testbed ...', got {line!r}")
            found.append(Command(line=line, argv=tuple(words[3:])))
    if not any(c.is_run for c in found):
        raise ConfigError(f"{source}: '## Run it' lists no 'python -m testbed run' command")
    return tuple(found)


def load(path: Path) -> Lab:
    """One lab folder; a malformed one is a ConfigError naming the file and what is wrong."""
    readme, meta_path = path / "README.md", path / "lab.yaml"
    for needed in (readme, meta_path, path / "check.py"):
        if not needed.is_file():
            raise ConfigError(f"{needed}: missing (a lab folder holds README.md, lab.yaml and check.py)")
    text = readme.read_text(encoding="utf-8")
    first = text.splitlines()[0] if text else ""
    m = TITLE_RE.fullmatch(first.strip())
    if not m or int(m.group(1)) != int(path.name[:2]):
        raise ConfigError(f"{readme}: the first line must be '# Lab {int(path.name[:2])}: <title>', got {first!r}")
    try:
        meta = yaml.safe_load(meta_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{meta_path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path}: expected a mapping of teaches, minutes, measured")
    for key in ("teaches", "minutes", "measured"):
        if key not in meta:
            raise ConfigError(f"{meta_path}: {key}: missing")
    return Lab(number=int(m.group(1)), slug=path.name, path=path, title=m.group(2).strip(),
               teaches=str(meta["teaches"]).strip(), minutes=float(meta["minutes"]),
               measured=str(meta["measured"]).strip(), commands=commands(text, str(readme)))


def all_labs(root: Path | None = None) -> list[Lab]:
    root = root or paths.LABS_DIR
    return [load(p) for p in sorted(root.iterdir()) if p.is_dir() and FOLDER_RE.fullmatch(p.name)]


def find(number: str, root: Path | None = None) -> Lab:
    """Lab ``number`` (``4`` or ``04``); a bad number is a one-line ConfigError."""
    labs = all_labs(root)
    if not str(number).isdigit() or not any(lab.number == int(number) for lab in labs):
        span = f"{labs[0].number}-{labs[-1].number}" if labs else "none"
        raise ConfigError(f"no lab {number!r}: the labs are {span} (python -m testbed lab list)")
    return next(lab for lab in labs if lab.number == int(number))
