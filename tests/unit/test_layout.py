"""The layout's rules, checked: the pure packages import without root and without Mininet,
os-ken, pyroute2 or Scapy; each heavy dependency is imported in one place; modules and
functions stay small enough to read."""

import ast
import importlib.util
import re
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.paths import ROOT

PACKAGE = ROOT / "testbed"
HEAVY = ("mininet", "os_ken", "pyroute2", "scapy")
PURE = ("config", "model", "wire", "analysis", "views")
# where each heavy dependency may be imported (package or module)
HOMES = {"mininet": ("apply/fabric.py",), "os_ken": ("controller/app.py", "controller/__main__.py"),
         "pyroute2": ("apply/datapath/tc.py",), "scapy": ("wire/reference.py",), "pandas": ("analysis/results.py",),
         "plotly": ("views/report.py",), "google": ("wire/chakra.py",)}
BLOCKER = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError(f"{{name}} is blocked: pure modules must not import it")
sys.meta_path.insert(0, Block())
"""


def modules(packages):
    for pkg in packages:
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            if rel.as_posix() != "testbed/wire/reference":  # the Scapy reference the tests check against
                yield ".".join(rel.parts).removesuffix(".__init__")


def test_pure_packages_import_without_root_or_heavy_dependencies():
    names = list(modules(PURE))
    assert len(names) > 20
    code = BLOCKER + "".join(f"import {name}\n" for name in names) + "print('ok')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.stdout.strip() == "ok", res.stderr[-3000:]


def test_the_blocker_blocks():
    """The check above can fail: a module that imports os-ken does not get past it."""
    res = subprocess.run([sys.executable, "-c", BLOCKER + "import testbed.controller.app"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode != 0 and "os_ken" in res.stderr and "blocked" in res.stderr


def imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_each_heavy_dependency_is_imported_in_one_place():
    found = {dep: [] for dep in HOMES}
    for path in PACKAGE.rglob("*.py"):
        for dep in imports(path) & set(HOMES):
            found[dep].append(path.relative_to(PACKAGE).as_posix())
    assert {dep: sorted(paths) for dep, paths in found.items()} == {dep: sorted(h) for dep, h in HOMES.items()}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_modules_and_functions_stay_small(path):
    src = path.read_text()
    assert src.count("\n") <= 400, "a module over 400 lines has more than one reason to change"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(src))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80]
    assert not long


def test_test_modules_have_unique_basenames():
    """pytest imports test files by basename (rootdir-relative, no packages): two
    test_x.py in different folders stop collection of the whole suite."""
    seen = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a basename"
        seen[path.name] = path


def test_test_folders_hold_tests_and_nothing_imports_conftest(tmp_path):
    """Test folders hold test modules only (helpers and the scripts tests start live in
    tests/helpers), and no module imports conftest: pytest loads it itself, and an import
    of it by name can load it a second time under another name; fixtures are its interface."""
    for folder in ("unit", "integration"):
        others = [p.name for p in (ROOT / "tests" / folder).glob("*.py") if not p.name.startswith("test_")]
        assert not others, f"tests/{folder} holds non-test modules {others}: move them to tests/helpers"
    importers = [p.relative_to(ROOT).as_posix() for p in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
                 if "conftest" in imports(p)]
    assert not importers, f"{importers} import conftest: use a fixture or tests/helpers"
    planted = tmp_path / "test_planted.py"  # the rule sees both spellings of the import
    planted.write_text("import conftest\n")
    assert "conftest" in imports(planted)
    planted.write_text("def f():\n    from conftest import ROOT\n")
    assert "conftest" in imports(planted)


# a dilation converted by hand: multiplied or divided by D (``d``, ``dilation``, ``self.d``,
# ``plan.dilation.factor``, ...) instead of through units.Dilation's methods
DILATION_NAMES = ("d", "_d", "dilation")


def _is_dilation(node) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "factor":
        node = node.value
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in DILATION_NAMES


def raw_dilation(src: str) -> list:
    """Lines where a value is multiplied or divided by the dilation (f-string expressions
    included: the syntax tree has them, where a token scan on Python 3.11 does not)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(src))
                   if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv))
                   and (_is_dilation(node.left) or _is_dilation(node.right))})


def test_the_dilation_is_converted_only_in_units():
    """Only units.Dilation turns real-fabric values into emulated ones and back: a ``* d`` or
    ``/ dilation`` anywhere else is a conversion that can drift from it."""
    planted = ("def f(x_ns, d, plan):\n    a = x_ns / d\n    b = plan.dilation.factor * 2\n"
               "    c = d.real_duration_ns(x_ns)\n    return f'{x_ns / self.d:g}'\n")
    assert raw_dilation(planted) == [2, 3, 5]
    found = {path.relative_to(PACKAGE).as_posix(): raw_dilation(path.read_text())
             for path in PACKAGE.rglob("*.py") if path.name != "units.py"}
    assert {p: hits for p, hits in found.items() if hits} == {}


# the floors, lowest first: a module imports from its own package or a lower floor only;
# ``units``, ``errors``, ``paths``, ``jsonlines`` and ``wire`` are the ground every floor stands on
GROUND = ("units", "errors", "paths", "jsonlines", "wire", "__init__", "__version__")
FLOORS = (("config",), ("model",), ("apply",), ("controller", "agent"), ("analysis",), ("views",), ("run", "labs"),
          ("cli",))  # testbed/__main__.py is the cli's


def _floor(package: str):
    if package in GROUND:
        return -1
    return next(i for i, names in enumerate(FLOORS) if package in names)


def _testbed_imports(src: str) -> list:
    """(line, imported testbed module's first part below ``testbed``) for every import, lazy ones too."""
    out = []
    for node in ast.walk(ast.parse(src)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "testbed" else [node.module]
        out += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("testbed.")]
    return out


def floor_violations(rel: str, src: str) -> list:
    """Imports in module ``rel`` (a path below testbed/) that point to a higher floor, or to
    another package of its own floor."""
    here = rel.split("/")[0].removesuffix(".py").replace("__main__", "cli")
    out = []
    for line, there in _testbed_imports(src):
        there = there.replace("__main__", "cli")
        if there == here or _floor(there) == -1:
            continue
        if _floor(here) == -1 or _floor(there) >= _floor(here):
            out.append(f"{rel}:{line} imports testbed.{there}")
    return out


def test_the_floors_point_down():
    planted = {"config/x.py": "from testbed.model import plan\n", "wire/x.py": "import testbed.config.scenario\n",
               "agent/x.py": "def f():\n    from testbed.controller import routing\n",
               "views/x.py": "from testbed import analysis, units\n"}
    assert [v for rel, src in planted.items() for v in floor_violations(rel, src)] == [
        "config/x.py:1 imports testbed.model", "wire/x.py:1 imports testbed.config", "agent/x.py:2 imports testbed.controller"]
    found = [v for path in sorted(PACKAGE.rglob("*.py"))
             for v in floor_violations(path.relative_to(PACKAGE).as_posix(), path.read_text())]
    assert found == []


def module_graph(paths) -> dict:
    """testbed module -> the testbed modules it imports (lazy imports too)."""
    names = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}
    graph = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                         for a in node.names} & set(names)
        graph[name] = deps - {name}
    return graph


def test_no_import_cycle():
    with pytest.raises(graphlib.CycleError):  # the check sees a planted one
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}}).static_order())
    tuple(graphlib.TopologicalSorter(module_graph(PACKAGE.rglob("*.py"))).static_order())


# the project's modules are imported under their own names: an alias (``plan as planning``)
# hides which module a name comes from, and every new one would need a reason
def aliases(rel: str, src: str) -> set:
    """(module, project module imported, the name it is bound to) of every ``as`` import."""
    out = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out |= {(rel, a.name, a.asname) for a in node.names if a.asname and a.name.startswith("testbed")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("testbed"):
            out |= {(rel, f"{node.module}.{a.name}", a.asname) for a in node.names if a.asname}
    return out


def test_no_new_import_alias():
    planted = aliases("x.py", "from testbed.model import plan as planning\nimport testbed.units as u\nimport os as o\n")
    assert planted == {("x.py", "testbed.model.plan", "planning"), ("x.py", "testbed.units", "u")}
    found = set().union(*(aliases(p.relative_to(PACKAGE).as_posix(), p.read_text()) for p in PACKAGE.rglob("*.py")))
    assert found == set()


def process_table(text: str) -> list:
    """(module run with ``python -m``, the file said to start it) of each row of the
    process table in docs/architecture.md."""
    rows = re.findall(r"^\|[^|\n]*`python -m ([\w.]+)`[^|\n]*\| `([\w/.]+\.py)` \|", text, re.M)
    return [(module, "testbed/" + path) for module, path in rows]


def test_the_architecture_docs_process_table_names_what_starts_each_process():
    """Each process the docs list is a module that exists, and the file named as starting it
    puts ``-m`` and that module in an argv (the table went stale once: it named the PFC
    process's own module as its launcher)."""
    planted = "| x (`python -m testbed.agent`) | `apply/fabric.py` | y |\n"
    ((module, path),) = process_table(planted)
    assert f'"-m", "{module}"' not in (ROOT / path).read_text()  # the check below would see it
    rows = process_table((ROOT / "docs" / "architecture.md").read_text())
    assert len(rows) == 4
    for module, path in rows:
        assert importlib.util.find_spec(module) is not None, module
        assert f'"-m", "{module}"' in (ROOT / path).read_text(), f"{path} does not start {module}"
