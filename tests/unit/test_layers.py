"""The arrows between the library, the workers and the CLI (toolloop/cli/__init__.py): the library
(`toolloop` but `toolloop.cli`) imports neither `workers` nor the CLI; `workers` does not import the
CLI. Every import is read from the source, at module level or inside a function, and an
`importlib.import_module("...")` of a literal name counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "toolloop" / "cli"


def imported(path: Path) -> set[str]:
    """The modules `path` imports by name (relative imports stay within their package: skipped)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(
            node.func, "attr", getattr(node.func, "id", "")
        ) in (
            "import_module",
            "__import__",
        ):
            names.update(
                arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant)
            )
    return {name for name in names if isinstance(name, str)}


def reaching(paths: list[Path], *prefixes: str) -> list[str]:
    return sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in paths
        for name in imported(path)
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)
    )


def test_the_library_imports_neither_workers_nor_the_cli() -> None:
    library = [
        path for path in (ROOT / "toolloop").rglob("*.py") if CLI not in path.parents
    ]
    assert len(library) > 50
    assert reaching(library, "workers", "toolloop.cli") == []


def test_workers_do_not_import_the_cli() -> None:
    assert reaching(sorted((ROOT / "workers").rglob("*.py")), "toolloop.cli") == []


def test_the_cli_imports_workers_by_name_not_by_string() -> None:
    """The CLI's imports of `workers` are import statements (typed, seen by mypy and the linter)."""
    by_string = sorted(
        f"{path.relative_to(ROOT)}: {node.args[0].value}"
        for path in CLI.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.JoinedStr | ast.Constant)
        and "workers" in ast.unparse(node.args[0])
    )
    assert by_string == []
    assert "workers.client" in imported(CLI / "commands.py")
