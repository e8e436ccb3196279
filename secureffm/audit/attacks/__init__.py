"""Attacks on exactly what a run's server logged (runs made with ``--keep-payloads``), by name
(docs/audit.md, "Attacks"):

- ``inversion``: gradient inversion of an FFM image run's gradients (:mod:`.inversion_run`);
- ``membership``: membership inference on the released model (:mod:`.membership`);
- ``fedwad-reconstruction``: the clients' points from FedWAD's interpolating measures
  (:mod:`.fedwad_reconstruction`);
- ``one-run``: the one-run empirical epsilon lower bound of an audit run's canaries (Steinke et
  al. 2023; :mod:`secureffm.audit.one_run`).

:func:`run_attack` runs one and returns its flat numeric results; pictures go to the run
folder's ``attacks/``.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from ...errors import SecureFFMError

__all__ = ["ATTACKS", "run_attack"]

# name -> "module:function" under secureffm.audit, imported when run (the image attacks need
# the data and autograd).
ATTACKS = {
    "inversion": "attacks.inversion_run:gradient_inversion",
    "membership": "attacks.membership:membership_inference",
    "fedwad-reconstruction": "attacks.fedwad_reconstruction:fedwad_reconstruction",
    "one-run": "one_run:one_run_audit",
}


def run_attack(run_dir: Path, name: str, **options) -> dict[str, float]:
    """Run attack ``name`` (one of :data:`ATTACKS`) on the run folder ``run_dir`` with the
    attack's keyword ``options`` (each has a default); returns its results, name -> number."""
    if name not in ATTACKS:
        raise SecureFFMError(f"attack {name!r} is unknown; use one of {', '.join(ATTACKS)}")
    module, function = ATTACKS[name].split(":")
    attack = getattr(importlib.import_module(f"..{module}", __name__), function)
    known = [p for p in inspect.signature(attack).parameters if p != "run_dir"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise SecureFFMError(f"attack {name!r} has no option {unknown[0]!r}; its options: "
                             f"{', '.join(known)}")
    return attack(Path(run_dir), **options)
