"""Production code never imports the demo (design.md section 11, issue 21 item 4).

Every module under ``daemon/``, ``storage/``, ``admin_ui/`` and ``config/`` (the CLI
included) is parsed and every import statement it holds -- top level, inside a
function, behind ``TYPE_CHECKING`` -- is checked; so is ``importlib.import_module``
or ``__import__`` called with a literal. The sandbox is wired to a configuration by
its own entry point (``python -m sandbox``), never from inside the daemon.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("daemon", "storage", "admin_ui", "config")


def _is_sandbox(module: str) -> bool:
    return module == "sandbox" or module.startswith("sandbox.")


def sandbox_imports(source: str, filename: str) -> list[str]:
    """``line: statement`` for every import of the sandbox in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute)
                    and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            names = [node.args[0].value]
        line = getattr(node, "lineno", 0)
        found += [f"{line}: {n}" for n in names if _is_sandbox(n)]
    return found


def _modules() -> list[Path]:
    return sorted(p for d in PRODUCTION for p in (ROOT / d).rglob("*.py"))


def test_the_walk_covers_the_production_packages() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"daemon/cli.py", "daemon/services/cutover.py", "storage/cutover/steps.py",
            "admin_ui/app.py", "config/load.py"} <= names


@pytest.mark.parametrize("source", [
    "import sandbox",
    "import sandbox.legacy.store as legacy",
    "from sandbox.legacy.store import install",
    "from sandbox import demo",
    "def f():\n    from sandbox.demo import run_sandbox\n",
    "if TYPE_CHECKING:\n    import sandbox.ports\n",
    "importlib.import_module('sandbox.legacy')",
    "__import__('sandbox')",
])
def test_the_check_sees_every_form_of_import(source: str) -> None:
    assert sandbox_imports(source, "<row>")


@pytest.mark.parametrize("source", [
    "import sandboxes", "from storage.sandboxing import x", "x = 'sandbox'",
    "from . import sandbox_names",
])
def test_the_check_leaves_other_names_alone(source: str) -> None:
    assert sandbox_imports(source, "<row>") == []


def test_no_production_module_imports_the_sandbox() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{hit}" for p in _modules()
                 for hit in sandbox_imports(p.read_text(), str(p))]
    assert offenders == []
