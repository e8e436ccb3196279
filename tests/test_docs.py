"""The docs cite tests as the evidence for their claims: every cited test must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `tests/x/test_y.py`, `x/test_y.py` (under tests/) or either with `::test_z` (a line break may
# split the name after an underscore, as the docs wrap long names); `::test_z` alone names a
# test of the file cited last.
_CITATION = re.compile(r"`((?:\w+/)*test_\w+\.py)(?:::(test_[\w\n]+))?`|`::(test_[\w\n]+)")


def _tests_in(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _citations(text: str) -> list[tuple[str, str | None]]:
    """(test file, test name or None) for every citation in ``text``, in order."""
    cited, last = [], None
    for match in _CITATION.finditer(text):
        path, name, bare = match.groups()
        if path:
            last = path
        else:
            path, name = last, bare
        cited.append((path, name.replace("\n", "") if name else None))
    return cited


def test_every_test_the_docs_cite_exists():
    """A renamed or moved test leaves the claim it backed without evidence: the docs (and the
    README) must name files and tests that exist."""
    test_files = {path.relative_to(ROOT).as_posix(): path
                  for path in (ROOT / "tests").rglob("test_*.py")}
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for cited, name in _citations(doc.read_text()):
            found = [path for rel, path in test_files.items()
                     if cited and (rel == cited or rel.endswith("/" + cited))]
            if cited is None:
                missing.append(f"{doc.name}: ::{name} follows no cited test file")
            elif len(found) != 1:
                missing.append(f"{doc.name}: {cited} names {len(found)} test files")
            elif name and name not in _tests_in(found[0]):
                missing.append(f"{doc.name}: {cited}::{name}")
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)


def test_the_citation_reader_finds_wrapped_and_bare_names():
    text = ("see `tests/a/test_b.py::test_one_\ntwo` and `::test_three`; "
            "`c/test_d.py` alone, then `::test_four`")
    assert _citations(text) == [("tests/a/test_b.py", "test_one_two"),
                                ("tests/a/test_b.py", "test_three"),
                                ("c/test_d.py", None), ("c/test_d.py", "test_four")]
