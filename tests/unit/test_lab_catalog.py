"""The labs as data: every lab folder loads, its README's commands parse and name real
scenarios, and the `lab` commands a trainee types without root answer (or refuse in one
line, exit 2)."""

import subprocess
import sys

import pytest

import testbed.cli
from testbed.errors import ConfigError
from testbed.labs import catalog, observe
from testbed.paths import ROOT

README = """# Lab 4: Buffers

## Run it

```sh
sudo python -m testbed run labs/x/a.yaml --set queues.buffer=16KB   # the small one
python3 -m testbed lab check 4
```

## Where to look

```sh
python -m testbed run not/this.yaml
```
"""


def test_commands_are_read_from_the_run_it_block_only():
    cmds = catalog.commands(README)
    assert [c.argv for c in cmds] == [("run", "labs/x/a.yaml", "--set", "queues.buffer=16KB"),
                                      ("lab", "check", "4")]
    assert [c.is_run for c in cmds] == [True, False]


@pytest.mark.parametrize("text, problem", [
    ("# Lab 1: x\n", "no '## Run it' section"),
    ("# Lab 1: x\n## Run it\n```sh\nls -l\n```\n", "expected 'python -m testbed ...'"),
    ("# Lab 1: x\n## Run it\n```sh\npython -m testbed lab check 1\n```\n", "lists no 'python -m testbed run'"),
])
def test_a_malformed_run_it_block_is_refused_naming_the_file(text, problem):
    with pytest.raises(ConfigError) as err:
        catalog.commands(text, "labs/01-x/README.md")
    assert str(err.value).startswith("labs/01-x/README.md: ") and problem in str(err.value)


def test_every_shipped_lab_loads_in_teaching_order_and_names_its_own_runs(in_repo):
    labs = catalog.all_labs()
    assert [lab.number for lab in labs] == list(range(1, len(labs) + 1)) and len(labs) >= 9
    seen = set()
    for lab in labs:
        names = observe.run_names(lab, testbed.cli.parser().parse_args)  # every run command's scenario loads and validates
        assert all(n.startswith(f"lab{lab.number:02d}-") for n in names), (lab.slug, names)
        assert len(set(names)) == len(names) and not seen & set(names)
        seen |= set(names)
        assert ("lab", "check", str(lab.number)) in [c.argv for c in lab.commands], lab.slug
        assert lab.minutes > 0 and lab.teaches
        text = lab.readme.read_text()
        for heading in ("## The question", "## Background", "## Run it", "## Where to look", "## Questions",
                        "<summary>What you should have seen</summary>", "## Try this next"):
            assert heading in text, (lab.slug, heading)
    assert sum(lab.minutes for lab in labs) < 30  # `lab run all` in under 30 minutes


def cli(*argv):
    return subprocess.run([sys.executable, "-m", "testbed", *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_lab_list_and_show_need_no_root():
    out = cli("lab", "list")
    assert out.returncode == 0, out.stderr
    for lab in catalog.all_labs():
        assert f"{lab.number}  " in out.stdout and lab.title in out.stdout
    shown = cli("lab", "show", "4")
    assert shown.returncode == 0 and shown.stdout.startswith("# Lab 4: ")


@pytest.mark.parametrize("argv, message", [
    (("lab", "show", "99"), "error: no lab '99': the labs are 1-"),
    (("lab", "show", "four"), "error: no lab 'four'"),
    (("lab", "check", "0"), "error: no lab '0'"),
    (("lab", "check", "4", "/nonexistent/run"), "error: /nonexistent/run: no such run folder"),
    (("lab", "check", "4", "tests"), "error: tests: not a run folder (no manifest.json)"),
    (("lab", "check", "4", "--results", "/nonexistent"), "error: no run of lab04-"),
])
def test_bad_lab_numbers_and_run_folders_get_one_line_and_exit_2(argv, message):
    out = cli(*argv)
    assert out.returncode == 2 and out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_a_run_of_another_lab_is_refused(tmp_path):
    run = tmp_path / "lab01-burst-20261203T000000Z"
    run.mkdir()
    (run / "manifest.json").write_text('{"scenario": "lab01-burst"}')
    out = cli("lab", "check", "4", str(run))
    assert out.returncode == 2 and "a run of scenario 'lab01-burst', not one of lab 4's runs" in out.stderr


def test_newest_run_of_a_scenario_is_picked_by_its_start_time(tmp_path):
    for stamp in ("20261203T100000Z", "20261203T120000Z", "20261203T110000Z"):
        d = tmp_path / f"lab01-burst-{stamp}"
        d.mkdir()
        (d / "manifest.json").write_text(f'{{"scenario": "lab01-burst", "started_utc": "{stamp}"}}')
    other = tmp_path / "lab01-burst-x-20261203T130000Z"  # another scenario whose name starts alike
    other.mkdir()
    (other / "manifest.json").write_text('{"scenario": "lab01-burst-x", "started_utc": "20261203T130000Z"}')
    assert observe.newest(tmp_path, "lab01-burst").name == "lab01-burst-20261203T120000Z"
    assert observe.newest(tmp_path, "lab02-rail") is None


def test_a_labs_report_shows_the_plots_it_talks_about_first(tmp_path):
    from testbed.views import report
    from testbed.config.scenario import REPORT_SECTIONS

    (tmp_path / "scenario.yaml").write_text("name: x\nreport: {first: [counters, queues]}\n")
    assert [sec[0] for sec in report._order(tmp_path)][:3] == ["counters", "queues", "throughput"]
    assert len(report._order(tmp_path)) == len(REPORT_SECTIONS)
    (tmp_path / "scenario.yaml").write_text("name: x\n")
    assert tuple(sec[0] for sec in report._order(tmp_path)) == REPORT_SECTIONS
    for lab in catalog.all_labs():  # every lab's scenarios name the plots first
        for path in lab.path.glob("*.yaml"):
            if path.name != "lab.yaml":
                assert "report: {first: [" in path.read_text(), path
