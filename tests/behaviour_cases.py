"""Tiny seeded runs of every method and protocol, and what one of them is observed to do.

Helpers for tests/test_behaviour.py and tests/fixtures/record_behaviour.py (no tests here).
A case runs through the public runners only (``secureffm.runs.run`` for the FFM family, the
centralized baselines and DCFM; ``secureffm.runs.run_fedwad`` for FedWAD) with
``insecure_deterministic`` and a fixed seed. :func:`observe` returns

- ``metrics``: every numeric leaf of the run's metrics (RunResult.metrics, or FedWAD's
  result.json) and of privacy.json, flattened to ``a/b/c`` keys, wall-clock times left out,
  floats rounded to 9 significant digits;
- ``messages``: the log's records in order, a delivery as
  ``[round, phase, kind, sender, recipient, bytes, stages, origin]`` and an event as
  ``[round, phase, "event", event, party]``: only what the message-boundary refactor (issue 15)
  must keep, not signatures, hashes, seq, prev or detail strings;

or, for a run the runner refuses, ``refused``: the error's class and the first words of its
message.

While a case runs, matplotlib's ``Figure.tight_layout`` and ``Figure.savefig`` do nothing:
laying out and rendering the run folder's PNGs took most of these tiny runs' time, and no plot
is compared (tests/test_plots.py checks the plots).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import matplotlib.pyplot  # noqa: F401 - imported before Figure is patched: pyplot copies
import torch  # Figure.savefig's docstring at import (matplotlib >= 3.11)
from matplotlib.figure import Figure

from secureffm.config import RunConfig
from secureffm.errors import SecureFFMError
from secureffm.methods.fedwad import FedWADConfig
from secureffm.runs import FedWADRun, run, run_fedwad

__all__ = ["Case", "CASES", "observe", "SIGNIFICANT", "REFUSAL_WORDS"]

SIGNIFICANT = 9  # significant digits kept of every float metric
REFUSAL_WORDS = 12  # words of a refusal's message kept


@dataclass(frozen=True)
class Case:
    """One tiny run: ``family`` ``run`` (a RunConfig from ``options``) or ``fedwad`` (a
    FedWADRun from ``options``, its FedWADConfig from ``fedwad``). ``why``: why its metrics
    cannot repeat even under ``insecure_deterministic`` ("" when they must)."""

    name: str
    family: str
    options: dict[str, Any] = field(default_factory=dict)
    fedwad: dict[str, Any] = field(default_factory=dict)
    why: str = ""


# tests/conftest.py's small_config, smaller still.
_FFM = dict(rounds=6, shard_size=200, batch_size=32, hidden=16, potential_hidden=16,
            potential_every=2, candidates=32, eval_samples=100, nfe=(1, 4), trajectories=20,
            seed=3)
# tests/methods/test_dcfm.py's _config.
_DCFM = dict(data="modes2d", partition="disjoint", shard_size=150, batch_size=32, hidden=16,
             local_steps=6, dcfm_rounds=2, dcfm_steps=4, distill_steps=4, teacher_steps=4,
             fedflow_rounds=2, fedflow_local_steps=2, eval_samples=50, nfe=(4,), seed=3)
# DP runs: a given noise multiplier skips calibration (the spec's target epsilon still holds);
# at sigma = 4 Opacus' RDP and PRV accountants answer in tens of ms (at sigma = 1, seconds).
_DP = dict(noise_multiplier=4.0)
SKELLAM = ("each client's share of the distributed Skellam noise is drawn from a generator "
           "seeded by the OS CSPRNG (protocols/secagg/client.py: _skellam, secrets.randbits), "
           "which insecure_deterministic does not seed, so the model and every metric computed "
           "from it differ from run to run; sizes and the privacy accounting do not")
_FEDWAD = dict(data="gaussians", samples=60, dim=2, seed=3)
_ALGORITHM = dict(iterations=3, support_size=20, seed=3)


def _ffm(method: str, protocol: str = "plaintext", suffix: str = "", why: str = "",
         **options) -> Case:
    return Case(f"ffm-{method}-{protocol}{suffix}", "run",
                {**_FFM, "method": method, "protocol": protocol, **options}, why=why)


def _dcfm(method: str, protocol: str = "plaintext", **options) -> Case:
    return Case(f"dcfm-{method}-{protocol}", "run",
                {**_DCFM, "method": method, "protocol": protocol, **options})


def _fedwad(name: str, protocol: str, clients: int, **algorithm) -> Case:
    return Case(f"fedwad-{name}-{protocol}", "fedwad",
                {**_FEDWAD, "clients": clients, "protocol": protocol},
                {**_ALGORITHM, **algorithm})


CASES: list[Case] = [
    # FFM and the centralized baselines, plaintext.
    *[_ffm(m) for m in ("vanilla", "lot", "got", "icfm", "otcfm")],
    # GOT under every protocol that protects gradients (and the two that protect models only).
    _ffm("got", "secagg"),
    # SecAgg+ draws a random 8-regular neighbour graph only when 8 < clients - 1.
    _ffm("got", "secagg-plus", clients=10, partition="iid", rounds=1, potential_every=1,
         shard_size=64),
    _ffm("got", "dp", **_DP),
    _ffm("got", "dp-secagg", **_DP),
    _ffm("got", "dp-secagg-distributed", why=SKELLAM, **_DP),
    # Keys agreed once per kind (setup = "once"): one set-up, then two exchanges a round.
    _ffm("got", "secagg-once"),
    _ffm("got", "dp-secagg-once", **_DP),
    _ffm("got", "sealed"),
    _ffm("got", "dp-sealed", **_DP),
    # A client drops after sharing its keys (rounds 2-4): with 3 clients the survivors reveal
    # its mask-key shares and the round completes over the rest (dropout recovery).
    _ffm("vanilla", "secagg", "-drop-after-sharing", clients=3,
         partition="iid", threat_model="drop-after-sharing", rounds=4),
    # The server's shares delivery to client-2 is lost (rounds 2-3): client-2 cannot mask and
    # drops out; with 2 clients the round aborts and the model stays put.
    _ffm("vanilla", "secagg", "-lose-shares-delivery", threat_model="lose-shares-delivery",
         rounds=4),
    # Corrupted, replayed and unregistered uploads, each rejected on receipt and logged.
    _ffm("vanilla", "plaintext", "-faulty-uploads", threat_model="faulty-uploads", rounds=4),
    # DCFM and its baselines, plaintext; DCFM-B's upload sealed, and DP-trained and sealed.
    *[_dcfm(m) for m in ("dcfm-a", "dcfm-b", "fedflow", "fedflow-l", "ddm", "ddm-l")],
    _dcfm("dcfm-b", "sealed"),
    _dcfm("dcfm-b", "dp-sealed", **_DP),
    # FedWAD: one distance (2 clients) and every pairwise distance (3 clients).
    _fedwad("distance", "plaintext", 2),
    _fedwad("distance-exact", "plaintext", 2, exact=True),
    _fedwad("pairwise", "plaintext", 3),
    _fedwad("distance", "fedwad-private", 2),
    _fedwad("pairwise", "fedwad-private", 3),
]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Numeric leaves of ``value`` (dicts and lists) under ``a/b/c`` keys; wall-clock times
    and strings left out, floats rounded to :data:`SIGNIFICANT` digits (NaN and inf kept as
    strings, which JSON can hold). The run's ``summary`` is left out: it repeats numbers of
    ``eval`` and privacy.json (secureffm/runs/summary.py, tests/test_cli.py checks it)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if "seconds" in key or (not prefix and key == "summary"):  # wall clock: never equal
                continue
            _flatten(item, f"{prefix}{key}/", out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _flatten(item, f"{prefix}{index}/", out)
    elif isinstance(value, bool) or value is None:
        out[prefix[:-1]] = value
    elif isinstance(value, int):
        out[prefix[:-1]] = value
    elif isinstance(value, float):
        out[prefix[:-1]] = (float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value)
                            else str(value))


def _messages(path: Path) -> list[list]:
    """The log's records as compact rows (see the module's docstring)."""
    rows = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "event":
            rows.append([r["round"], r["phase"], "event", r["event"], r["party"]])
        else:
            rows.append([r["round"], r["phase"], r["kind"], r["sender"], r["recipient"],
                         r["bytes"], list(r["stages"]), r.get("origin", "")])
    return rows


def _refusal(err: Exception) -> str:
    words = str(err).split()
    return f"{type(err).__name__}: {' '.join(words[:REFUSAL_WORDS])}"


def _run(case: Case, out: Path) -> dict[str, Any]:
    """The case's metrics as its runner returns them."""
    if case.family == "fedwad":
        return run_fedwad(FedWADRun(FedWADConfig(**case.fedwad), out=str(out), progress=False,
                                    insecure_deterministic=True, **case.options)).result
    config = RunConfig(**{**case.options, "out": str(out), "progress": False, "device": "cpu",
                          "insecure_deterministic": True})
    return run(config).metrics


def observe(case: Case, tmp_path: Path) -> dict[str, Any]:
    """Run ``case`` in ``tmp_path / case.name`` and return what it did (module docstring)."""
    out = Path(tmp_path) / case.name
    torch.set_num_threads(1)  # as tests/conftest.py: one thread, the runners' default
    try:
        with mock.patch.object(Figure, "tight_layout"), mock.patch.object(Figure, "savefig"):
            numbers = _run(case, out)
    except SecureFFMError as err:
        return {"refused": _refusal(err)}
    metrics: dict[str, Any] = {}
    _flatten(numbers, "", metrics)
    privacy = out / "privacy.json"
    if privacy.is_file():
        _flatten(json.loads(privacy.read_text()), "privacy/", metrics)
    return {"metrics": metrics, "messages": _messages(out / "messages.jsonl")}
