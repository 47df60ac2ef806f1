"""The package's shape: layers that only point down (.importlinter, run by CI as `lint-imports`), no import cycle
anywhere in solo/ (imports inside functions included), no function of more than 50 statements, and no dotted
`solo.` name in the code's text or the docs that names nothing."""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.test_train import REPO

MAX_STATEMENTS = 50


def import_cycles(package: str) -> list[list[str]]:
    """Every cycle a depth-first walk of the package's module imports (lazy ones too) closes."""
    graph = grimp.build_graph(package)
    state, path, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == "open":
                cycles.append(path[path.index(imported) :] + [imported])
            elif imported not in state:
                visit(imported)
        path.pop()
        state[module] = "done"

    for module in sorted(graph.modules):
        if module not in state:
            visit(module)
    return cycles


def test_layers_point_down():
    lint_imports = (
        "from importlinter.cli import lint_imports_command; lint_imports_command()"  # the lint-imports script
    )
    out = subprocess.run(
        [sys.executable, "-c", lint_imports, "--config", ".importlinter"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0 and "0 broken" in out.stdout, out.stdout + out.stderr


def test_no_import_cycle_in_solo():
    assert import_cycles("solo") == []


def test_a_lazy_import_cycle_is_found(tmp_path, monkeypatch):
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text("def later():\n    from cyclic import a  # lazy, inside a function\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclic") == [["cyclic.a", "cyclic.b", "cyclic.a"]]


def long_functions(root: Path) -> list[str]:
    """Functions of more than MAX_STATEMENTS statements (nested ones included): counted in statements, not lines, so
    that the formatter's wrapping of a long call does not count and a long function cannot hide on long lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                statements = sum(isinstance(inner, ast.stmt) for inner in ast.walk(node)) - 1
                if statements > MAX_STATEMENTS:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({statements} statements)")
    return found


def test_no_function_has_more_than_50_statements(tmp_path):
    assert long_functions(REPO / "solo") == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("def f():\n" + "    x = 1\n" * (MAX_STATEMENTS + 1))
    assert long_functions(tmp_path / "pkg") == ["pkg/long.py:1 f (51 statements)"]


@pytest.mark.slow
@pytest.mark.one_process
def test_every_bench_and_script_imports():
    """bench/ and scripts/ are not imported by the suite otherwise: a moved module would break them unseen.
    One interpreter runs each with --help (argparse exits before any work)."""
    files = sorted(str(p) for folder in ("bench", "scripts") for p in (REPO / folder).glob("*.py"))
    code = (
        "import runpy, sys\nfor f in sys.argv[1:]:\n    sys.argv = [f, '--help']\n    try:\n"
        "        runpy.run_path(f, run_name='__main__')\n    except SystemExit as e:\n"
        "        assert e.code in (0, None), (f, e.code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *files], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


DOTTED = re.compile(r"\bsolo(?:\.[A-Za-z_]\w*)+")
FILE_NAMES = (".py", ".yaml", ".md", ".log", ".json", ".png", ".pt")


def names_something(reference: str) -> bool:
    """Whether `reference` (solo.a.b.c) is a module, or a module's attribute path."""
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def unresolved(paths) -> dict[str, list[str]]:
    """{dotted solo. reference: the files that write it} for those that name nothing; file names and solo's
    OmegaConf resolvers (${solo.global_batch:...}) are not module references."""
    from omegaconf import OmegaConf

    from solo.config import register_configs

    register_configs()
    found: dict[str, list[str]] = {}
    for path in paths:
        for reference in DOTTED.findall(Path(path).read_text()):
            if reference.endswith(FILE_NAMES) or OmegaConf.has_resolver(reference) or names_something(reference):
                continue
            found.setdefault(reference, []).append(str(Path(path).relative_to(REPO)))
    return found


def test_every_dotted_solo_name_in_the_code_and_docs_resolves():
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "solo").rglob("*.py")]
    assert unresolved(pages) == {}
    stale = REPO / "tests" / "__stale_reference__.md"  # a module named before solo.data was split: found
    try:
        stale.write_text("The views are drawn in solo.data.augment; solo.data.views.augment is where they are now.")
        assert unresolved([stale]) == {"solo.data.augment": ["tests/__stale_reference__.md"]}
    finally:
        stale.unlink()
