"""A package's names imported when first used (PEP 562), so that importing the package, or one
of its light modules, does not import its heavy ones (torch): see ``secureffm.runs`` and
``secureffm.federation``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["exports"]


def exports(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """The ``__getattr__`` of ``package`` for ``where``: exported name -> the module of the
    package that defines it."""

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{where[name]}", package), name)

    return __getattr__
