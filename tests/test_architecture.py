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
import io
import tokenize
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
    ("engine/compiler.py", "_create_index_sql"): "Django's BaseDatabaseSchemaEditor._create_index_sql: "
    "the only way to give an index's columns a suffix (NULLS FIRST) in the backend's own CREATE INDEX; "
    "the engine's compiler module is the one place for Django internals",
    ("runtime.py", "_current_frames"): "Python's sys._current_frames: the only way to see where "
    "another thread is (the user's code or ours) before a hard stop interrupts it (--concurrency)",
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


# -- the engine owns every statement and every vendor difference --------------------------------
#
# Outside ``django_taskloop/engine/`` (and the generated migrations) no module may hold raw SQL,
# open a cursor, execute on a connection, branch on the database vendor, or reach Django's
# private query/compiler machinery; inside the engine, that machinery is used by one module,
# ``engine/compiler.py``, so that a Django upgrade touches one file. The test reads the source
# with ``ast`` (nothing is imported) and fails on:
#
# - a string literal (or f-string) that is an SQL statement or clause: it *starts* with a
#   statement's keywords (``SELECT … FROM``, ``INSERT INTO``, ``UPDATE … SET``, ``DELETE
#   FROM``, ``CREATE INDEX``, ``LISTEN``, ``NOTIFY``, ``VACUUM``, ``WITH x AS (`` …, in capitals,
#   as SQL is written here), or names a server catalogue or function (``pg_notify(``,
#   ``pg_class``, ``information_schema``); docstrings are skipped, and a message that mentions
#   ``SELECT … FOR UPDATE`` mid-sentence is not a statement;
# - ``x.cursor(…)``; ``x.execute(…)``/``executemany`` on a cursor or connection (a receiver
#   named like one) or with an SQL literal; ``x.vendor`` (but ``engine.vendor``, the module); a
#   comparison with a vendor's name (``"postgresql"``, ``"mysql"``, ``"sqlite"``);
# - Django's compiler internals: imports from ``django.db.models.sql``, and ``_raw_delete``,
#   ``get_compiler``, ``_create_index_sql``, ``create_cursor``, ``InsertQuery``/``UpdateQuery``.

import re  # noqa: E402

#: How an SQL statement or clause starts (case-sensitive: keywords in capitals).
_SQL_START = re.compile(
    r"""^\s*\(?\s*(
        SELECT\s.+\sFROM\s | SELECT\s+\w+\( | INSERT\s+(INTO|IGNORE|OR\s+IGNORE)\b | UPDATE\s+\S+\s+SET\b
        | DELETE\s+FROM\b | (CREATE|DROP)\s+(UNIQUE\s+)?(TABLE|INDEX|VIEW|TRIGGER)\b | ALTER\s+TABLE\b
        | TRUNCATE\s | (UN)?LISTEN\s | NOTIFY\s | VACUUM\b | ANALYZE\s | EXPLAIN\s | LOCK\s+TABLE
        | WITH\s+\w+\s+AS\s*\( | PRAGMA\s | SET\s+(SESSION|LOCAL|TRANSACTION)\b
        | NULLS\s+(FIRST|LAST)\b | ON\s+CONFLICT\b | FOR\s+UPDATE\b | RETURNING\s | (INNER|LEFT)\s+JOIN\s
    )""",
    re.VERBOSE | re.DOTALL,
)
#: Server catalogues and functions: SQL wherever they appear in a literal.
_SQL_ANYWHERE = re.compile(
    r"\bpg_(notify|class|stat\w*|advisory\w*)\b|\binformation_schema\b|\bsqlite_master\b"
)
_VENDORS = {"postgresql", "mysql", "sqlite", "oracle"}
_COMPILER_NAMES = {
    "_raw_delete",
    "get_compiler",
    "_create_index_sql",
    "create_cursor",
    "InsertQuery",
    "UpdateQuery",
}

#: (where, what): the few places that may, with why.
SQL_ALLOWED: dict[tuple[str, str], str] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every docstring node (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _literal_text(node: ast.AST) -> str | None:
    """A string literal's text (an f-string's with ``{}`` for its holes), else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _is_sql(text: str) -> bool:
    return bool(_SQL_START.match(text) or _SQL_ANYWHERE.search(text))


def _sql_offences(tree: ast.AST, in_compiler: bool = False) -> list[tuple[int, str]]:
    """``(line, what)`` for every statement, cursor, vendor branch or compiler internal."""
    found: list[tuple[int, str]] = []
    skip = _docstrings(tree)
    inside_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        text = None if id(node) in skip or id(node) in inside_fstring else _literal_text(node)
        if text is not None and _is_sql(text):
            found.append((node.lineno, f"SQL {text.strip()[:50]!r}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, ast.unparse(node.func.value)
            sql_arg = bool(node.args) and _is_sql(_literal_text(node.args[0]) or "")
            if name == "cursor" or (
                name in ("execute", "executemany") and (re.search(r"cursor|conn", receiver, re.I) or sql_arg)
            ):
                found.append((node.lineno, f"{receiver}.{name}()"))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "vendor"
            and not ast.unparse(node.value).endswith("engine")
        ):
            found.append((node.lineno, f"{ast.unparse(node)} (a vendor branch)"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = {e.value for s in sides for e in ast.walk(s) if isinstance(e, ast.Constant)}
            if names & _VENDORS:
                found.append((node.lineno, f"{ast.unparse(node)} (a vendor branch)"))
        if in_compiler:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django.db.models.sql"):
            found.append((node.lineno, f"from {node.module} import … (Django's compiler internals)"))
        elif isinstance(node, ast.Attribute) and node.attr in _COMPILER_NAMES:
            found.append((node.lineno, f"{ast.unparse(node)} (Django's compiler internals)"))
        elif isinstance(node, ast.Name) and node.id in _COMPILER_NAMES:
            found.append((node.lineno, f"{node.id} (Django's compiler internals)"))
    return sorted(set(found))


def sql_outside_engine(package: Path = PACKAGE) -> tuple[list[str], set[tuple[str, str]]]:
    """Return the offences (SQL, cursors, vendor branches outside ``engine/``; Django's
    compiler internals outside ``engine/compiler.py``) and the allow-list entries used."""
    offences, used = [], set()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("migrations/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        found = _sql_offences(tree, in_compiler=relative == "engine/compiler.py")
        if relative.startswith("engine/"):
            # The engine owns SQL and vendors; only its compiler module reaches Django's internals.
            found = [(line, what) for line, what in found if "compiler internals" in what]
        for line, what in found:
            entry = next((e for e in SQL_ALLOWED if relative.startswith(e[0]) and e[1] in what), None)
            if entry is not None:
                used.add(entry)
                continue
            offences.append(f"django_taskloop/{relative}:{line}: {what}")
    return offences, used


def test_only_the_engine_holds_sql_and_vendor_branches():
    offences, _used = sql_outside_engine()
    assert not offences, (
        f"{len(offences)} place(s) hold SQL, a cursor, a vendor branch or Django's compiler internals "
        "outside the engine (or its compiler module); give the engine a function instead:\n"
        + "\n".join(offences)
    )


def test_sql_allow_list_is_as_short_as_it_can_be():
    _offences, used = sql_outside_engine()
    assert used == set(SQL_ALLOWED), f"allow-list entries no longer needed: {sorted(set(SQL_ALLOWED) - used)}"


def test_the_sql_rule_catches_statements_cursors_and_vendors_but_not_prose(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "vendor.py").write_text(
        'def f(c):\n    c.cursor().execute("SELECT 1 FROM t")\n    return c.vendor == "sqlite"\n'
    )
    (tmp_path / "engine" / "claim.py").write_text("def f(q):\n    return q._raw_delete(q.db)\n")
    (tmp_path / "edge.py").write_text(
        '"""SELECT x FROM y in a module docstring is prose."""\n'
        "import logging\n"
        "from django.db.models.sql import InsertQuery\n"
        "from . import engine\n"
        "def f(connection, conn, table, backend, q):\n"
        '    """DELETE FROM t in a docstring is prose too."""\n'
        '    logging.warning("the select for update failed; UPDATE the server")\n'
        '    message = "Database does not support SELECT … FOR UPDATE SKIP LOCKED."\n'
        "    backend.execute(1, 'x')\n"
        "    engine.vendor.features('default')\n"
        "    with connection.cursor() as cursor:\n"
        '        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s", [table])\n'
        "    conn.execute(f'LISTEN \"{table}\"')\n"
        "    if connection.vendor == 'postgresql':\n"
        '        sql = f"INSERT INTO {table} (a) VALUES (%s)"\n'
        "    suffix = 'NULLS FIRST'\n"
        "    return q._raw_delete(q.db), message\n"
    )
    offences, _used = sql_outside_engine(tmp_path)
    assert [o.split(": ", 1)[1] for o in offences] == [
        "from django.db.models.sql import … (Django's compiler internals)",
        "connection.cursor()",
        "SQL 'SELECT reltuples FROM pg_class WHERE oid = %s'",
        "cursor.execute()",
        "SQL 'LISTEN \"{}\"'",
        "conn.execute()",
        "connection.vendor (a vendor branch)",
        "connection.vendor == 'postgresql' (a vendor branch)",
        "SQL 'INSERT INTO {} (a) VALUES (%s)'",
        "SQL 'NULLS FIRST'",
        "q._raw_delete (Django's compiler internals)",
        "q._raw_delete (Django's compiler internals)",  # engine/claim.py: not the compiler module
    ], offences


#: The size rule (issue 27, counted on code since issue 42): modules, classes and functions
#: small enough to read, counted in lines of code — not docstrings, comments or blank lines, so
#: that explaining a thing never costs room and nothing is squeezed to fit.
MAX_MODULE_CODE = 700
MAX_CLASS_CODE = 400
MAX_FUNCTION_CODE = 50
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> set[int]:
    """The line numbers of ``source`` that hold code: not a docstring, a comment or blank."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return code


def too_big(package: Path) -> list[str]:
    """Modules, classes and functions over the size rule's lines of code, migrations left out."""
    found = []
    limits = {
        ast.ClassDef: MAX_CLASS_CODE,
        ast.FunctionDef: MAX_FUNCTION_CODE,
        ast.AsyncFunctionDef: MAX_FUNCTION_CODE,
    }
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.relative_to(package).parts:
            continue
        source = path.read_text()
        where = path.relative_to(package)
        code = code_lines(source)
        if len(code) > MAX_MODULE_CODE:
            found.append(f"{where}: {len(code)} lines of code")
        for node in ast.walk(ast.parse(source)):
            limit = limits.get(type(node))
            if limit is None:
                continue
            assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            length = sum(1 for line in code if node.lineno <= line <= (node.end_lineno or node.lineno))
            if length > limit:
                found.append(f"{where}:{node.lineno}: {node.name} is {length} lines of code")
    return found


def test_no_module_class_or_function_over_the_size_rule():
    assert too_big(PACKAGE) == []


def test_the_size_check_sees_a_long_module_class_and_function_but_not_docstrings(tmp_path):
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_big.py").write_text("x = 1\n" * 2_000)
    body = "".join(f"    x{n} = {n}\n" for n in range(51))
    prose = '    """' + "words\n" * 500 + '    """\n' + "    # a comment\n" * 100
    methods = "".join(f"    def m{n}(self):\n        return {n}\n" for n in range(201))
    (tmp_path / "long.py").write_text(
        f"def short():\n{prose}    return 1\n\n\ndef long():\n{body}\n\nclass Big:\n{methods}"
        + "y = 2\n" * 300
    )
    found = too_big(tmp_path)
    assert found[0] == f"long.py: {2 + 52 + 403 + 300} lines of code", found
    assert [line.split(": ", 1)[1] for line in found[1:]] == [
        "long is 52 lines of code",
        "Big is 403 lines of code",
    ], found
