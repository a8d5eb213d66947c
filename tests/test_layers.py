"""The package's floors: no import circle, and no import that runs up a floor.

The test reads the source with ``ast`` (nothing is imported) and builds the import graph of
``django_taskloop``: every ``import`` and ``from … import`` anywhere in a module — at module
level, inside functions and methods, under ``if TYPE_CHECKING`` — relative or absolute, with
``from . import x`` resolved to the submodule ``x`` when there is one. Migrations are left
out (Django loads them, nothing imports them).

It fails on any circle between modules, and on any import from a module to one on a higher
floor (DESIGN.md, "Floors after it"). A package's ``__init__`` may re-export its own
submodules (that is the same room) as long as that makes no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_NAME = "django_taskloop"
PACKAGE = Path(__file__).resolve().parent.parent / PACKAGE_NAME

#: Floors, bottom up: a module may import its own floor and those below, never above. The
#: first prefix that matches a module's dotted name (without the package's) gives its floor.
#: One change from DESIGN.md's list: ``wakeup`` (the database's notifications, which a waiting
#: ``take`` listens to) sits beside the engine, not above the models: ``Tube.wait_take`` uses
#: it, and it imports nothing but ``conf`` and ``engine``.
FLOORS: list[tuple[int, tuple[str, ...]]] = [
    (
        0,
        (
            "conf",
            "validation",
            "exceptions",
            "signals",
            "cron",
            "compat",
            "runtime",
            "stopping",
            "task_options",
            "human",
        ),
    ),
    # What handlers call to report progress (django_taskloop.progress): imports nothing of ours.
    (0, ("progress",)),
    (1, ("engine", "wakeup")),
    (2, ("models",)),
    (3, ("stats", "reaper", "health", "shards")),
    # Django Tasks calls waiting in tubes, read as results: the backend, the admin and the worker.
    (3, ("task_calls",)),
    (4, ("workers", "backends", "schedules")),
    # A queue as an operator names it, and the operator's verbs (retry reaches the Tasks backend).
    (4, ("queues",)),
    (5, ("admin", "metrics", "management", "checks", "templatetags", "urls", "apps", "views")),
    # The test helpers (django_taskloop.testing, its pytest plugin): edges, on the Tasks backend.
    (5, ("testing", "pytest_plugin")),
]
#: The package's own ``__init__`` (lazy ``__getattr__`` over the models) is on the models' floor.
TOP = {"": 2}


def floor(module: str) -> int:
    if module in TOP:
        return TOP[module]
    for level, prefixes in FLOORS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return level
    raise AssertionError(f"{module!r} is on no floor: add it to FLOORS in {__file__}")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name relative to it (``""`` is the package)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source."""
    return imports_in(name, path, ast.parse(path.read_text(), str(path)), known)


def imports_in(name: str, path: Path, tree: ast.AST, known: dict[str, Path]) -> set[str]:
    """The package's modules that the imports in ``tree`` (of module ``name``) name."""
    here = name.split(".") if name else []
    if not _is_package(path):
        here = here[:-1]
    found: set[str] = set()

    def resolve(dotted: str) -> str | None:
        # The longest prefix that is one of our modules (``models.tubes.Task`` → models.tubes).
        parts = dotted.split(".") if dotted else []
        while True:
            candidate = ".".join(parts)
            if candidate in known:
                return candidate
            if not parts:
                return None
            parts.pop()

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE_NAME or alias.name.startswith(PACKAGE_NAME + "."):
                    target = resolve(alias.name[len(PACKAGE_NAME) + 1 :])
                    if target is not None:
                        found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
                if node.level - 1 > len(here):
                    continue
                dotted = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and (node.module == PACKAGE_NAME or node.module.startswith(PACKAGE_NAME + ".")):
                dotted = node.module[len(PACKAGE_NAME) + 1 :]
            else:
                continue
            for alias in node.names:
                # ``from . import x``: the submodule x if there is one, else a name of the module.
                sub = f"{dotted}.{alias.name}" if dotted else alias.name
                target = sub if sub in known else resolve(dotted)
                if target is not None:
                    found.add(target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _show(name: str) -> str:
    return f"{PACKAGE_NAME}.{name}" if name else PACKAGE_NAME


def test_the_graph_sees_every_kind_of_import() -> None:
    """The reader finds relative, absolute, in-function and ``from . import x`` imports."""
    edges = graph()
    # models/__init__ re-exports its submodules with ``from .tubes import …``.
    assert "models.tubes" in edges["models"]
    # ``from . import engine`` resolves to the engine package, not to the package's __init__.
    assert any("engine" in targets for targets in edges.values())
    assert "" not in edges.get("models.operating", set())


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(
        " ↔ ".join(_show(name) for name in component) for component in found
    )


def test_no_import_runs_up_a_floor() -> None:
    upward = [
        f"{_show(name)} (floor {floor(name)}) imports {_show(target)} (floor {floor(target)})"
        for name, targets in sorted(graph().items())
        for target in sorted(targets)
        if floor(target) > floor(name)
    ]
    assert not upward, "imports that run up a floor:\n" + "\n".join(upward)


def test_the_worker_runtime_cron_and_registry_import_no_plug_in() -> None:
    """``runtime`` reads settings and nothing else of the package; the worker registry
    imports neither the Tasks backend nor the scheduler (``apps.ready()`` registers them)."""
    edges = graph()
    assert edges["runtime"] <= {"conf"}, edges["runtime"]
    assert not edges["workers"] & {"backends", "schedules"}, edges["workers"]
    assert edges["cron"] <= {"conf", "validation"}, edges["cron"]
    assert edges["compat"] == set(), edges["compat"]


#: Imports of the package's own modules inside functions, each with why it cannot be at the top.
#: Any other one is a circle held open or a floor crossed in hiding: move it to the top.
LAZY_IMPORTS = {
    ("", "models"): "the package's __getattr__: importing django_taskloop must not load the "
    "models before the app registry is ready",
    ("apps", "checks"): "AppConfig.ready(): apps.py is imported before the models are",
    ("apps", "backends"): "AppConfig.ready(): apps.py is imported before the models are",
    ("apps", "schedules"): "AppConfig.ready(): apps.py is imported before the models are",
    ("apps", "workers"): "AppConfig.ready(): apps.py is imported before the models are",
    ("apps", "shards"): "AppConfig.ready(): apps.py is imported before the models are",
    ("pytest_plugin", "testing"): "fixtures: pytest imports the plugin (a conftest's "
    "pytest_plugins) before pytest-django has set Django up, and testing imports the models",
}


def lazy_imports() -> set[tuple[str, str]]:
    """(module, imported module) for every import of the package inside a function."""
    known = modules()
    found = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = ast.Module(body=node.body, type_ignores=[])
                inner = imports_in(name, path, body, known)
                found |= {(name, target) for target in inner}
    return found


def test_imports_inside_functions_are_only_the_lazy_ones_with_a_reason() -> None:
    unexplained = sorted(lazy_imports() - set(LAZY_IMPORTS))
    assert not unexplained, "imports inside functions with no reason to be there:\n" + "\n".join(
        f"{_show(name)} imports {_show(target)}" for name, target in unexplained
    )
    stale = sorted(set(LAZY_IMPORTS) - lazy_imports())
    assert not stale, f"LAZY_IMPORTS names imports that are gone: {stale}"


def test_every_module_is_on_a_floor() -> None:
    for name in modules():
        floor(name)
