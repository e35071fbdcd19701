"""The import graph of `toolloop/` and `workers/`: no cycle, and a web backend's `Client` stays light.

The graph counts every import, at module level and inside functions (an import inside a function
is a cycle postponed, not one avoided), read with `ast` from the source files.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolloop", "workers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` at `path` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while (
                target and target not in known
            ):  # `import a.b.c` imports a.b.c (or its package)
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    known = set(files)
    return {name: _imports(path, name, known) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first again at the end), or None.
    A package's own `__init__` is not counted as imported by its submodules (Python imports it
    first, but it is not an edge the submodule chose)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if node.startswith(target + "."):
                continue  # a submodule naming its own package (`from toolloop import x`)
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_walker_finds_a_cycle_through_a_function_level_import() -> None:
    graph = {
        "workers.a": {"workers.b"},
        "workers.b": {"workers.c"},
        "workers.c": {"workers.a"},
    }
    assert find_cycle(graph) == ["workers.a", "workers.b", "workers.c", "workers.a"]
    source = "def f():\n    from workers.step import advance\n"
    known = {
        "workers",
        "workers.step",
        "workers.step.advance",
        "workers.worker.consumer",
    }
    path = ROOT / "tests" / "unit" / "_probe.py"
    path.write_text(source, encoding="utf-8")
    try:
        assert _imports(path, "workers.worker.consumer", known) == {
            "workers.step",
            "workers.step.advance",
        }
    finally:
        path.unlink()


def test_no_import_cycle_in_toolloop_or_workers() -> None:
    graph = import_graph()
    assert "workers.step.advance" in graph and "toolloop.loop.run" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_names_is_a_leaf() -> None:
    assert {
        m for m in import_graph()["workers.protocol.names"] if m.startswith("workers")
    } == set()


def test_importing_the_client_loads_no_worker_and_builds_no_celery_app() -> None:
    probe = (
        "import sys, json\n"
        "from workers.client import Client\n"
        "import celery._state as state\n"
        "client = Client('redis://127.0.0.1:1/0')\n"
        "apps = [app.main for app in state._get_active_apps()]\n"
        "built = 'celery' in client.__dict__\n"
        "sent_app = client.celery.main\n"
        "print(json.dumps({'modules': sorted(m for m in sys.modules if m.startswith('workers')),\n"
        "                  'apps': apps, 'built': built, 'after': sent_app}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    worker_side = {
        "workers.app",
        "workers.worker.consumer",
        "workers.process.worker_process",
        "workers.step.advance",
        "workers.worker.bootsteps",
        "workers.tasks",
        "workers.step.commit",
        "workers.process.live",
        "workers.process.redisio",
    }
    assert worker_side.isdisjoint(seen["modules"]), worker_side & set(seen["modules"])
    assert "toolloop" not in seen["apps"] and not seen["built"]
    assert seen["after"] == "toolloop"  # built once a method needs it


def _private_imports(path: Path, name: str) -> list[str]:
    """`from <module> import _x` in the module `name` where <module> is in another room of workers/
    (or in toolloop/ while `name` is in workers/): a private name reached across a boundary."""
    room = ".".join(name.split(".")[:2])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            continue
        source_room = ".".join(node.module.split(".")[:2])
        if node.module.split(".")[0] in PACKAGES and source_room != room:
            found += [
                f"{name}: from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_")
            ]
    return found


def test_no_module_reaches_into_another_rooms_private_names() -> None:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    reached = [
        line
        for name, path in sorted(files.items())
        for line in _private_imports(path, name)
    ]
    assert reached == [], "\n".join(reached)


def test_no_folder_holds_more_than_twenty_modules() -> None:
    folders: dict[Path, int] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name != "__init__.py":
                folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > 20}
    assert crowded == {}, crowded
