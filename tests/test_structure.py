"""The package's shape (issue 19): small modules and functions, apps at the edge, SQL in storage only.

Read from the source with ``ast``: nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zhantune"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
#: the command-line apps (python -m zhantune.<name>) and the module only apps use (problems files);
#: every other module is library code and never imports one of them
APPS = {"export", "collect", "compare", "replay", "space", "check", "db", "kerneltuner", "problemset", "app",
        "__main__"}
#: SQLAlchemy's statement builders: a query is written in zhantune/storage/ only
SQL_NAMES = {"select", "update", "delete", "insert", "text", "exists", "func"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _name(path: Path) -> str:
    return ".".join(("zhantune", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")


def _imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_no_module_or_function_is_too_long():
    too_long = []
    for path in _modules():
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{_name(path)}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{_name(path)}.{node.name} (line {node.lineno}): {n} lines")
    assert not too_long, f"over {MAX_MODULE_LINES} lines per module / {MAX_FUNCTION_LINES} per function: {too_long}"


def test_library_code_never_imports_an_app():
    apps = {f"zhantune.{a}" for a in APPS}
    bad = []
    for path in _modules():
        name = _name(path)
        if name.split(".")[1:2] and name.split(".")[1] in APPS:
            continue
        for imported in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if any(imported == a or imported.startswith(a + ".") for a in apps):
                bad.append(f"{name} imports {imported}")
    assert not bad, bad


def test_no_raw_sql_outside_storage():
    bad = []
    for path in _modules():
        name = _name(path)
        if name.startswith("zhantune.storage"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
                sql = {a.name for a in node.names} & SQL_NAMES
                if sql or node.module in ("sqlalchemy.orm", "sqlalchemy.sql"):
                    bad.append(f"{name} imports {node.module}: {sorted(sql)}")
            elif isinstance(node, ast.Attribute) and node.attr in ("session", "execute", "scalars", "scalar"):
                if isinstance(node.value, ast.Name) and node.value.id in ("store", "s", "session", "conn"):
                    bad.append(f"{name} line {node.lineno}: {node.value.id}.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module in ("zhantune.storage.orm", "zhantune.storage.models"):
                bad.append(f"{name} imports the ORM models ({node.module})")
    assert not bad, bad


def test_no_two_modules_share_a_name():
    seen: dict[str, str] = {}
    clash = []
    for path in _modules():
        if path.name == "__init__.py":
            continue
        other = seen.setdefault(path.stem, _name(path))
        if other != _name(path):
            clash.append(f"{other} and {_name(path)}")
    assert not clash, clash


@pytest.mark.parametrize("package", ["bench", "search", "storage", "inductor", "report", "problems"])
def test_every_package_has_a_face(package):
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"zhantune.{package} has no docstring"
    assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
               for n in tree.body), f"zhantune.{package} has no __all__"
