"""The package's layering (shared/DESIGN.md, "must not know about"), checked on the source.

Every import anywhere in a module counts, inside functions and under TYPE_CHECKING too: a lazy
import hides a circle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import secureffm

ROOT = Path(secureffm.__file__).parent
RUNNERS = ("secureffm.runs", "secureffm.cli")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(tree: ast.AST, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``; with ``module_level``, only those that run when the
    module is imported (anywhere but inside a function body)."""
    found, stack = [], list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph(module_level: bool = False) -> dict[str, set[str]]:
    """secureffm module -> the secureffm modules it imports (with ``module_level``: only when it
    is imported, see :func:`_import_nodes`)."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in _import_nodes(ast.parse(path.read_text()), module_level):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            else:
                base = _from_module(node, _package(path))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                          for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _package(path: Path) -> str:
    """The package a module's relative imports start from."""
    name = _module(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from`` import (in ``package``) reads from."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(anchor + ([base] if base else []))


def _violations(source: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in _graph().items() if m.startswith(source)
                  for t in targets if t.startswith(forbidden) or t in forbidden)


def test_metrics_know_nothing_of_methods():
    assert _violations("secureffm.metrics", ("secureffm.methods",)) == []


def test_methods_take_their_own_settings_not_the_run_config():
    """Each method receives a typed settings object and resolved DP settings (issue 15)."""
    assert _violations("secureffm.methods", ("secureffm.config",)) == []


def test_federation_knows_no_method_and_no_runner():
    assert _violations("secureffm.federation", ("secureffm.methods", *RUNNERS)) == []


def test_federation_knows_no_protocol():
    assert _violations("secureffm.federation", ("secureffm.protocols",)) == []


def test_methods_know_no_protocol_and_no_runner():
    assert _violations("secureffm.methods", ("secureffm.protocols", *RUNNERS)) == []


def test_methods_reach_the_federation_only_through_the_channel():
    """Methods see the Channel, messages and parties: never the transport, the log, keys or
    faults (those belong to the engine and the protocols)."""
    allowed = ("secureffm.federation.channel", "secureffm.federation.message",
               "secureffm.federation.parties")
    assert [v for v in _violations("secureffm.methods", ("secureffm.federation",))
            if not v.endswith(allowed)] == []


def test_the_run_scaffold_knows_no_audit():
    """The audit reads runs through runs/scaffold.py (checkpoints, the attack runs); the scaffold
    reaches the pin in federation/, never back up into audit/ (issue 40)."""
    assert _violations("secureffm.runs.scaffold", ("secureffm.audit",)) == []


def test_no_import_circle():
    graph = _graph()
    seen: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in seen and (cycle := visit(nxt, path + [node])):
                return cycle
        seen[node] = 2
        return None

    cycles = [c for n in sorted(graph) if n not in seen and (c := visit(n, []))]
    assert cycles == [], " -> ".join(cycles[0])


def _third_party_at_import(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports when it is imported."""
    names = set()
    for node in _import_nodes(ast.parse(path.read_text()), module_level=True):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif not node.level:
            names.add((node.module or "").split(".")[0])
    return names


def test_opacus_loads_only_when_a_function_uses_it():
    """Importing Opacus loads its privacy engine and torch.distributed, about 3 s of start-up
    here (privacy/accounting.py), which a command, run or benchmark without DP must not pay:
    no module imports it when it is imported, only the functions that call it."""
    found = sorted(_module(path) for path in ROOT.rglob("*.py")
                   if "opacus" in _third_party_at_import(path))
    assert found == []


def test_the_command_line_starts_without_pot_or_scikit_learn():
    """POT imports scikit-learn and scipy.stats, 1.6 s of start-up here (secureffm/ot.py's
    ``pot``) that ``secureffm --help`` and ``secureffm audit`` do not need: no module that
    importing ``secureffm.cli`` loads imports either when it is imported."""
    graph = _graph(module_level=True)
    loaded, todo = set(), ["secureffm.cli"]
    while todo:
        name = todo.pop()
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for module in [name, *parents]:  # importing a.b.c runs a and a.b first
            if module not in loaded and module in graph:
                loaded.add(module)
                todo.extend(graph[module])
    paths = {_module(p): p for p in ROOT.rglob("*.py")}
    found = sorted(f"{m} imports {lib}" for m in loaded
                   for lib in _third_party_at_import(paths[m]) & {"ot", "sklearn"})
    assert found == []


_MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "__setitem__"}


def _imported_names(tree: ast.Module) -> set[str]:
    """The names a module binds by importing when it is imported (``import a.b`` binds
    ``a``)."""
    names = set()
    for node in _import_nodes(tree, module_level=True):
        for alias in node.names:
            names.add(alias.asname or alias.name.split(".")[0])
    return names


def _base_name(node: ast.expr) -> str | None:
    """``X`` of ``X``, ``X.y``, ``X[k]``, ``X.y[k].z``."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _written(node: ast.AST) -> list[ast.expr]:
    """What ``node`` writes into in place: the attribute or item targets of an assignment or a
    deletion (``X[k] = f``, ``X.attr = f``), the receiver of a mutating call
    (``X.append(f)``)."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
        return [t for t in getattr(node, "targets", [getattr(node, "target", None)])
                if isinstance(t, ast.Attribute | ast.Subscript)]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS):
        return [node.func.value]
    return []


def import_time_hooks(source: str, name: str) -> list[str]:
    """Statements of module ``name`` (its ``source``) that run when it is imported (anywhere
    but inside a function or class body) and fill or change a name imported from another
    module: ``X.append(f)``, ``X.update(...)``, ``X[key] = f``, ``X.attr = f``. Such a list or
    table is a hook another module fills by being imported: which entries it holds depends on
    what happened to be imported first, and the import that fills it is a circle the import
    graph cannot see. A class body counts (it runs on import); a function body does not."""
    tree = ast.parse(source)
    imported = _imported_names(tree)
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        found += [(node.lineno, f"{name}:{node.lineno}: {ast.unparse(node)[:60]}")
                  for t in _written(node) if _base_name(t) in imported]
        stack.extend(ast.iter_child_nodes(node))
    return [hook for _, hook in sorted(found)]


def registrars(source: str) -> set[str]:
    """The module's own functions (``source``) that, when called, write into one of its
    module-level names (their nested functions' writes and a ``global`` rebinding included):
    the registering functions of a table the module keeps."""
    tree = ast.parse(source)
    tables = {t.id for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
              for t in getattr(node, "targets", [getattr(node, "target", None)])
              if isinstance(t, ast.Name)}
    functions = [f for f in tree.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    return {f.name for f in functions for n in ast.walk(f)
            if isinstance(n, ast.Global) or any(_base_name(t) in tables for t in _written(n))}


def _dotted(node: ast.expr, origin: dict[str, str]) -> str | None:
    """``f`` or ``m.f`` as the absolute dotted name its imports give it, or None."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in origin:
        return None
    return ".".join([origin[node.id], *attributes])


def import_time_registrations(source: str, name: str, package: str,
                              registering: dict[str, set[str]]) -> list[str]:
    """Calls that run when module ``name`` (its ``source``, in ``package``) is imported, of a
    function another module registers into its own table with (``registering``: module ->
    its :func:`registrars`). A decorator counts: ``@f("x")`` above a function calls ``f`` and
    what it returns when the module is imported, though the function's body runs later. The
    ``@client_action("ckks.decrypt")`` lines filled ``endpoint.ACTIONS`` so: every client
    answered whatever handler some imported module had registered."""
    tree = ast.parse(source)
    origin = {}
    for node in _import_nodes(tree, module_level=True):
        for alias in node.names:
            if isinstance(node, ast.ImportFrom):
                origin[alias.asname or alias.name] = (f"{_from_module(node, package)}."
                                                      f"{alias.name}")
            else:
                origin[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        callees = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            callees = [d for d in node.decorator_list if not isinstance(d, ast.Call)]
        elif isinstance(node, ast.Call):
            callees = [node.func]
        for callee in callees:
            module, _, function = (_dotted(callee, origin) or "").rpartition(".")
            if function in registering.get(module, ()):
                found.append((node.lineno, f"{name}:{callee.lineno}: calls "
                                           f"{ast.unparse(callee)} when imported"))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(node.decorator_list)  # its body runs later, when it is called
        elif not isinstance(node, ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return [hook for _, hook in sorted(found)]


def test_no_module_fills_another_modules_list_when_imported():
    """Issue 40: no import-time hook lists. secagg.py kept ``EPOCH_AGGREGATE: list = []``,
    which secagg_epoch.py appended to when imported (and ``endpoint.SESSIONS``, which secagg.py
    filled so): a protocol worked only if something had imported the second module first; and
    ``@client_action`` decorators in five modules filled ``endpoint.ACTIONS``. Registries are
    filled by explicit calls instead (``build_protocol`` registers the shipped stages; a stage
    restores its own client state and lists its clients' actions)."""
    paths = sorted(ROOT.rglob("*.py"))
    registering = {_module(path): registrars(path.read_text()) for path in paths}
    found = [hook for path in paths
             for hook in (*import_time_hooks(path.read_text(), _module(path)),
                          *import_time_registrations(path.read_text(), _module(path),
                                                     _package(path), registering))]
    assert found == []


def test_the_hook_rule_sees_an_append_and_an_assignment_at_import():
    """The rule above on the two hooks it was written for, and not on the same statements
    inside a function or on a module's own list."""
    source = ("from .base import HOOKS, TABLE\n\nOWN = []\n\n"
              "def run():\n    HOOKS.append(run)\n    TABLE['tag'] = run\n\n"
              "OWN.append(run)\nHOOKS.append(run)\n\nclass Stage:\n    TABLE['tag'] = run\n")
    assert import_time_hooks(source, "variant") == ["variant:10: HOOKS.append(run)",
                                                    "variant:13: TABLE['tag'] = run"]


# The registry as secureffm/protocols/endpoint.py kept it before issue 40, and one of the
# modules that filled it when imported (ckks.py's handlers, their bodies left out).
_OLD_ENDPOINT = """
ACTIONS: dict = {}


def client_action(name):
    def register(handler):
        ACTIONS[name] = handler
        return handler
    return register


def accept(step):
    return None
"""
_OLD_CKKS = """
from dataclasses import dataclass
from .endpoint import Step, client_action
from . import endpoint


@dataclass
class Round:
    epoch: int


@client_action("ckks.upload")
def _client_upload(step: Step):
    client_action("ckks.inner")


@endpoint.client_action("ckks.decrypt")
def _client_decrypt(step: Step):
    return endpoint.accept(step)
"""


def test_the_hook_rule_sees_a_decorator_that_registers_into_an_imported_table():
    """The rule on the ``@client_action`` lines it was extended for (issue 40): a decorator
    whose function fills the table of the module it comes from, called directly or through
    the module; not ``@dataclass`` nor a call inside a function body, nor a function of
    that module that fills nothing."""
    registering = {"secureffm.protocols.endpoint": registrars(_OLD_ENDPOINT)}
    assert registering["secureffm.protocols.endpoint"] == {"client_action"}
    assert import_time_registrations(_OLD_CKKS, "ckks", "secureffm.protocols", registering) == [
        "ckks:12: calls client_action when imported",
        "ckks:17: calls endpoint.client_action when imported"]


def _names_a_stage(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` is a stage's name written out, alone or in a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return any(isinstance(item, ast.Constant) and item.value in names for item in items)


def test_no_stage_name_is_compared_outside_protocols():
    """A stage describes itself (shared/DESIGN.md, Conventions): no module outside
    ``protocols/`` compares anything with a stage's name (``== "secagg"``, ``"secagg" in
    stages``, ``.name == "dp"``, ``in ("ckks", "sealed")``); it asks the stage or the
    protocol, so adding a stage touches only its own module, the registry and its tests."""
    from secureffm.protocols import load_protocol
    from secureffm.protocols.registry import STAGES

    load_protocol("plaintext")  # registers the built-in stages
    names = set(STAGES)
    found = sorted(f"{_module(path)}:{node.lineno}" for path in ROOT.rglob("*.py")
                   if not _module(path).startswith("secureffm.protocols")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Compare)
                   and any(_names_a_stage(o, names) for o in (node.left, *node.comparators)))
    assert found == []
