"""The package's seams: edges reach the facades only through their public doors.

The facades live in ``django_taskloop/models/`` (``Tube``, ``Task``, ``JobBoard``, ``Job``, the
loop managers and querysets, ``Lockable``, ...). Every other module — workers, the Tasks
backend, the scheduler, the admin, the metrics, the commands, the reaper, the engine — may
not reach an underscore member of anything but itself. The test reads the source with
``ast`` (nothing is imported) and fails on:

- ``x._name`` (and ``getattr``/``setattr``/``hasattr(x, "_name")``) where ``x`` is not
  ``self``, ``cls`` or ``super()``;
- ``from <a module of the package> import _name``;

unless ``_name`` is one of Django's own model API names below, a name the module itself
defines or assigns and no facade defines (its own private state, e.g. a marker it sets on
Django's connection), or an entry of the short allow-list below, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_taskloop"

#: Underscore names that are Django's documented model API, not ours.
DJANGO_API = {
    "_meta": "Model._meta, the Options API (documented)",
    "_state": "Model._state: .db and .adding (documented)",
    "_default_manager": "Model._default_manager (documented)",
    "_base_manager": "Model._base_manager (documented)",
    "_registry": "AdminSite._registry: Django has no public way to list a site's ModelAdmins",
}

#: (where, name): the few private doors that are not our facades', with why they stay.
ALLOWED = {
    ("engine/", "_raw_delete"): "Django's QuerySet._raw_delete (one DELETE, no collector): "
    "the engine owns Django internals",
    ("validation.py", "_iterable_class"): "Django's QuerySet._iterable_class: the only way to "
    "tell a values()/values_list() queryset from one of model instances",
    ("migrations/", "_new_id"): "a migration freezes the dotted path of a field's default "
    "callable (models.results._new_id); renaming it would break the migration",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _is_self(node: ast.AST) -> bool:
    if isinstance(node, ast.Name) and node.id in ("self", "cls"):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _own_names(tree: ast.AST) -> set[str]:
    """Private names the module defines or assigns itself: its own, not a facade's."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                own.add(str(node.args[1].value))
    return {name for name in own if _private(name)}


def _reaches(tree: ast.AST) -> list[tuple[int, int, str, str]]:
    """``(line, column, name, what)`` for every underscore member reached on something else."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
            found.append((node.lineno, node.col_offset, node.attr, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _is_self(node.args[0])
        ):
            found.append((node.lineno, node.col_offset, node.args[1].value, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("django_taskloop")
        ):
            for alias in node.names:
                if _private(alias.name):
                    what = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                    found.append((node.lineno, node.col_offset, alias.name, what))
    return sorted(found)


def private_doors(package: Path = PACKAGE) -> tuple[list[str], set[tuple[str, str]]]:
    """Return the offences outside ``models/`` and the allow-list entries that were used."""
    offences, used = [], set()
    trees = {
        path.relative_to(package).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(package.rglob("*.py"))
    }
    # The facades' private members: a module's "own" name is never one of these.
    facade = set().union(*(_own_names(tree) for name, tree in trees.items() if name.startswith("models/")))
    for relative, tree in trees.items():
        if relative.startswith("models/"):
            continue
        own = _own_names(tree) - facade
        for line, _column, name, what in _reaches(tree):
            if name in DJANGO_API or name in own:
                continue
            entry = next((e for e in ALLOWED if e[1] == name and relative.startswith(e[0])), None)
            if entry is not None:
                used.add(entry)
                continue
            offences.append(f"django_taskloop/{relative}:{line}: {what}")
    return offences, used


def test_edges_use_only_public_facade_verbs():
    offences, _used = private_doors()
    assert not offences, (
        f"{len(offences)} place(s) outside models/ reach a private member; give the facade a "
        "public verb instead:\n" + "\n".join(offences)
    )


def test_allow_list_is_as_short_as_it_can_be():
    _offences, used = private_doors()
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_rule_catches_a_private_door(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tubes.py").write_text("def f(tube):\n    return tube._take(1)\n")
    (tmp_path / "edge.py").write_text(
        "from .models.tubes import _slot\n"
        "def f(tube, board):\n"
        "    tube._meta, self_ok = None, None\n"
        "    return tube._take(1, 'me', checked=True), getattr(board, '_alias'), super()._x\n"
    )
    offences, _used = private_doors(tmp_path)
    assert [o.split(": ", 1)[1] for o in offences] == [
        "from .models.tubes import _slot",
        "tube._take",
        "getattr(board, '_alias')",
    ]
