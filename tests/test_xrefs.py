"""Every cross-reference names something that exists: a renamed or moved module, class or file
leaves its readers pointing at nothing (issue 40).

Checked, without importing the package (the source is read with ``ast``):

- in docstrings of the package, the benchmarks, the experiments and the tests: Sphinx roles
  (``:func:``, ``:class:``, ``:mod:``, ``:meth:``, ...), resolved the way Sphinx does
  (the enclosing class, then the module, then from the top; a leading dot from the module's
  package upwards, then as the end of any name), and plain ``secureffm.x.y`` names and
  ``folder/module.py`` paths;
- in README.md and docs/*.md: backticked ``secureffm.x.y`` names and ``folder/file`` paths
  (test files are tests/test_docs.py's job).

A name outside the package (``torch.nn.Module``, ``ValueError``) is imported to be checked.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "secureffm"
SOURCES = (PACKAGE, "benchmarks", "experiments", "tests")
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj|const):`!?~?([\w.]+)(?:\(\))?`")
_DOTTED = re.compile(rf"(?<![\w./`~-]){PACKAGE}(?:\.\w+)+")
# a path with a folder: every part lower-case (a capitalised part is a placeholder: RUN_DIR)
_PATH = r"(?:[a-z0-9_.-]+/)+[a-z0-9_-]+\.(?:py|md|toml|sh|json)"
_PLAIN_PATH = re.compile(rf"(?<![\w./\"'-]){_PATH}(?![\w/-])")  # in quotes: a value
_SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(eq=False)
class Scope:
    """What a module or a class in ``module`` binds: name -> ``(kind, where)``, kind ``import``
    (where: the dotted name it imports), ``class`` (where: the class's Scope) or ``object``;
    ``bases``: a class's base classes as written (None for a module)."""

    module: str
    names: dict[str, tuple[str, object]] = field(default_factory=dict)
    bases: list[str] | None = None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _python_files()}


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    anchor = module.split(".")[:len(module.split(".")) - level + is_package]
    return ".".join(anchor + ([name] if name else []))


def _names_bound(target: ast.expr) -> list[str]:
    """The names an assignment to ``target`` binds (``a``, ``a, *b``; not ``a[k]`` or ``a.b``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names_bound(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return [name for element in target.elts for name in _names_bound(element)]
    return []


def _bind(scope: Scope, body: list[ast.stmt], is_package: bool) -> None:
    """Bind in ``scope`` what the statements ``body`` define (through if/try/with blocks)."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            inner = Scope(scope.module, bases=[ast.unparse(b) for b in node.bases])
            _bind(inner, node.body, is_package)
            for method in node.body:  # attributes a method sets on self
                for sub in ast.walk(method) if isinstance(method, ast.FunctionDef) else ():
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        inner.names.setdefault(sub.attr, ("object", None))
            scope.names[node.name] = ("class", inner)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scope.names[node.name] = ("object", None)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    scope.names[alias.asname] = ("import", alias.name)
                else:
                    top = alias.name.split(".")[0]
                    scope.names[top] = ("import", top)
        elif isinstance(node, ast.ImportFrom):
            base = (_absolute(scope.module, is_package, node.level, node.module) if node.level
                    else node.module)
            for alias in node.names:
                scope.names[alias.asname or alias.name] = ("import", f"{base}.{alias.name}")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _names_bound(target):
                    scope.names[name] = ("object", None)
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for block in ("body", "orelse", "finalbody", "handlers"):  # if, try, with, for
                _bind(scope, getattr(node, block, []), is_package)


@cache
def _scope(module: str) -> Scope | None:
    """What the package's module ``module`` binds; None when there is no such module."""
    path = _modules().get(module)
    if path is None:
        return None
    scope = Scope(module)
    _bind(scope, _tree(path).body, path.name == "__init__.py")
    return scope


def _outside(dotted: str) -> bool:
    """Whether ``dotted``, outside the package, names something (importing it to see)."""
    parts = dotted.split(".")
    if len(parts) == 1:
        return hasattr(builtins, dotted)
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def _member(scope: Scope, parts: list[str], seen: frozenset = frozenset()) -> bool:
    """Whether ``parts`` lead from ``scope`` (a module's or a class's) to something bound."""
    if not parts:
        return True
    bound = scope.names.get(parts[0])
    if bound is None and "__getattr__" in scope.names and scope.bases is None:
        return _outside(f"{scope.module}.{'.'.join(parts)}")  # a lazy module: import it
    if bound is None:  # a member a base binds; a base outside the package gets the benefit
        bases = [_follow(scope.module, b) for b in scope.bases or []]
        return any(b is None or (b not in seen and _member(b, parts, seen | {scope}))
                   for b in bases)
    kind, where = bound
    if kind == "class":
        return _member(where, parts[1:], seen)
    if kind == "import":
        return _resolves(".".join([where, *parts[1:]]))
    return len(parts) == 1


def _follow(module: str, written: str) -> Scope | None:
    """The Scope of the class ``written`` in ``module`` (e.g. a base), None if not found."""
    scope = _scope(module)
    for part in written.split("."):
        bound = scope.names.get(part) if scope else None
        if bound is None:
            return None
        kind, where = bound
        if kind == "import":
            scope = _scope_of(where)
        elif kind == "class":
            scope = where
        else:
            return None
    return scope


def _scope_of(dotted: str) -> Scope | None:
    """The Scope of the module or class that the absolute ``dotted`` names, None if none."""
    if _scope(dotted):
        return _scope(dotted)
    module, _, name = dotted.rpartition(".")
    bound = _scope(module).names.get(name) if _scope(module) else None
    if bound and bound[0] == "class":
        return bound[1]
    if bound and bound[0] == "import":
        return _scope_of(bound[1])
    return None


def _resolves(dotted: str) -> bool:
    """Whether the absolute ``dotted`` name (module, then attributes) exists."""
    parts = dotted.split(".")
    if parts[0] not in SOURCES:
        return _outside(dotted)
    for cut in range(len(parts), 0, -1):
        scope = _scope(".".join(parts[:cut]))
        if scope is not None:
            return _member(scope, parts[cut:])
    return False


def _role_resolves(target: str, module: str, classes: list[str], is_package: bool) -> bool:
    """Whether a Sphinx role's ``target``, written in ``module`` inside ``classes`` (outermost
    first), names something: as Sphinx looks it up."""
    if target.startswith("."):
        anchors = [module] + [".".join(module.split(".")[:n])
                              for n in range(module.count(".") + (not is_package), 0, -1)]
        anchors[:0] = [".".join([module, *classes[:n]]) for n in range(len(classes), 0, -1)]
        # then, as Sphinx does, any module where it ends: ``.Channel.aggregate``
        return any(_resolves(anchor + target) for anchor in [*anchors, *_modules()])
    scopes = [".".join([module, *classes[:n]]) for n in range(len(classes), -1, -1)]
    return any(_resolves(f"{s}.{target}") for s in scopes) or _resolves(target)


def _stale_path(path: str, near: Path) -> bool:
    """Whether ``path``, from a folder of the repository, the package or the citing file's
    folder, names no file (a path from no such folder, ``path/to/x.toml``, is not a reference)."""
    bases = [b for b in (ROOT, ROOT / PACKAGE, near) if (b / path.split("/")[0]).is_dir()]
    return bases != [] and not any((b / path).exists() for b in bases)


def _docstrings(path: Path):
    """(line, text, enclosing classes) of every docstring in the Python file ``path``."""
    def walk(node: ast.AST, classes: list[str]):
        inner = classes + [node.name] if isinstance(node, ast.ClassDef) else classes
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield first.lineno, first.value.value, inner
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, block, []):
                yield from walk(child, inner)
    yield from walk(_tree(path), [])


def _python_files() -> list[Path]:
    return sorted(p for top in SOURCES for p in (ROOT / top).rglob("*.py"))


def stale_in_docstrings(path: Path) -> list[str]:
    """``file:line: reference`` for every cross-reference in ``path``'s docstrings that names
    nothing."""
    rel = path.relative_to(ROOT)
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    stale = []
    for line, text, classes in _docstrings(path):
        for offset, row in enumerate(text.splitlines()):
            where = f"{rel}:{line + offset}"
            for target in _ROLE.findall(row):
                if not _role_resolves(target, module, classes, is_package):
                    stale.append(f"{where}: {target}")
            plain = _ROLE.sub("", row)
            stale += [f"{where}: {name}" for name in _DOTTED.findall(plain)
                      if not _resolves(name.rstrip("."))]
            stale += [f"{where}: {p}" for p in _PLAIN_PATH.findall(plain)
                      if _stale_path(p, path.parent)]
    return stale


def stale_in_markdown(path: Path) -> list[str]:
    """``file:line: reference`` for every backticked name or path in ``path`` that names
    nothing; a test file is left to tests/test_docs.py."""
    stale = []
    for number, row in enumerate(path.read_text().splitlines(), 1):
        for span in _SPAN.findall(row):
            for token in span.split():
                name = re.fullmatch(rf"({PACKAGE}(?:\.\w+)+)(?:\(.*)?", token)
                if name and not _resolves(name.group(1)):
                    stale.append(f"{path.relative_to(ROOT)}:{number}: {token}")
                if (re.fullmatch(_PATH, token) and not Path(token).name.startswith("test_")
                        and _stale_path(token, path.parent)):
                    stale.append(f"{path.relative_to(ROOT)}:{number}: {token}")
    return stale


def test_docstring_cross_references_resolve():
    stale = [s for path in _python_files() for s in stale_in_docstrings(path)]
    assert stale == [], "docstrings name what does not exist:\n" + "\n".join(stale)


def test_docs_name_modules_and_files_that_exist():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    stale = [s for path in docs for s in stale_in_markdown(path)]
    assert stale == [], "docs name what does not exist:\n" + "\n".join(stale)


def test_the_reader_tells_a_moved_name_from_a_present_one():
    """The pin moved from audit/ to federation/ (issue 40): the old names must not resolve."""
    assert _resolves("secureffm.federation.pin.RunPin.key_differences")
    assert not _resolves("secureffm.audit.pin.RunPin")
    assert _role_resolves(".Channel.aggregate", "secureffm.protocols.channel", [], False)
    assert not _role_resolves("Channel.aggregate", "secureffm.protocols.channel", [], False)
