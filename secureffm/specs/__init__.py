"""Spec files shipped in the wheel (protocol specs, threat models; symlinked from the
repository root) and the one loader that reads them, or a user's file in their place.

:func:`read_spec_file` finds and parses a spec; :func:`check_keys` refuses an unknown or missing
key by name. Protocol specs (:mod:`secureffm.protocols.registry`) and threat models
(:mod:`secureffm.federation.faults`) both read through them, each raising its own error type.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from ..errors import SecureFFMError
from ..spelling import did_you_mean

__all__ = ["read_spec_file", "shipped", "check_keys"]


def shipped(folder: str) -> list[str]:
    """Names of the specs shipped in ``folder`` (``protocols`` or ``threat_models``)."""
    directory = resources.files(__name__) / folder
    return sorted(p.name[:-5] for p in directory.iterdir() if p.name.endswith(".toml"))


def read_spec_file(folder: str, name_or_path: str, what: str,
                   error: type[SecureFFMError]) -> tuple[dict, str]:
    """The top-level table of a shipped spec (``folder/NAME.toml``) by name, or of a user's
    file by path (anything ending in ``.toml`` or holding a ``/``), and a label of where it
    came from. ``what`` names the kind of spec in messages; failures raise ``error``."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise error(f"{what} file {name_or_path!r} does not exist")
        text, source = path.read_text(), str(path)
    else:
        resource = resources.files(__name__) / folder / f"{name_or_path}.toml"
        if not resource.is_file():
            names = shipped(folder)
            raise error(f"unknown {what} {name_or_path!r}{did_you_mean(name_or_path, names)}; "
                        f"shipped: {', '.join(names) or 'none'}, or give a path to a .toml file")
        text, source = resource.read_text(), f"{name_or_path}.toml"
    try:
        return tomllib.loads(text), source
    except tomllib.TOMLDecodeError as err:
        raise error(f"{what} {source} is not valid TOML: {err}") from None


def check_keys(table: dict, allowed: set[str], required: tuple[str, ...], where: str,
               error: type[SecureFFMError]) -> None:
    """Refuse a table with a key outside ``allowed`` or without a ``required`` one, by name."""
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise error(f"{where}: unknown key {unknown[0]!r}; allowed keys are "
                    f"{', '.join(sorted(allowed - {'stage'}))}")
    for key in required:
        if key not in table:
            raise error(f"{where}: missing required key {key!r}")
