"""What a resumed FFM run takes from the run it continues: the checkpoint (loaded with
``weights_only``) and every charge the continued run's log shows.

The log, not the checkpoint, says what was spent: a run stopped after its last checkpoint had
already released the rounds since (the checkpoint's ledger misses them), and a round stopped
after its charge was released even though it never completed. The resumed run records those
charges in its ledger and signs them into its own log, keeps the continued run's noise
multiplier, and is refused (:class:`~secureffm.errors.BudgetError`) when its remaining rounds
would take a client past the target.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..audit.verify import LOG_FILE, verify_run
from ..config import RunConfig, config_from_dict
from ..errors import BudgetError, ConfigError
from ..federation.message import SERVER
from ..privacy.ledger import CHARGED, LedgerEntry, charged_entries
from ..protocols.dp import DPStage
from ..protocols.protocol import input_phases
from .scaffold import load_checkpoint, run_folder

__all__ = ["RESUMABLE", "ResumePoint", "resume_point", "logged_charges", "refuse_over_budget"]

# Keys a resumed run may change; every other key must equal the checkpoint's.
RESUMABLE = frozenset({"rounds", "out", "overwrite", "resume", "progress", "device", "threads",
                       "sample_every", "checkpoint_every", "eval_samples", "nfe", "pin_to",
                       "fid_weights", "precision", "keep_payloads", "adaptive_solver",
                       "adaptive_tol", "trajectories", "data_dir", "target_epsilon",
                       "noise_multiplier"})


@dataclass(frozen=True)
class ResumePoint:
    """``source``: the continued run's folder; ``checkpoint``: its checkpoint.safetensors (config,
    state, round); ``round``: the last round the checkpoint completed; ``charged``: its log's
    ``charged`` records, in order, each as the ledger entries it states."""

    source: Path
    checkpoint: dict
    round: int
    charged: list[list[LedgerEntry]]

    def config(self, config: RunConfig) -> RunConfig:
        """``config`` with the noise multiplier the continued run's clients last ran (its log's
        last charge) unless ``config`` names one: recalibrating to the target over the planned
        rounds would ignore what was spent."""
        if config.noise_multiplier or not self.charged:
            return config
        return replace(config, noise_multiplier=self.charged[-1][0].noise_multiplier)


def resume_point(config: RunConfig, device: torch.device) -> ResumePoint:
    """The run ``config.resume`` names (its folder or its checkpoint.safetensors), after checking
    that it used the same settings (every key but :data:`RESUMABLE`), that its checkpoint is before
    ``config.rounds``, that the resumed run writes elsewhere, and that its log is intact and
    charges at least what the checkpoint's ledger holds."""
    path = Path(config.resume)
    path = path / "checkpoint.safetensors" if path.is_dir() else path
    source = path.parent
    if run_folder(config).resolve() == source.resolve():
        raise ConfigError(f"resume: give --out a new folder; {source} keeps the interrupted "
                          "run's log, the evidence of what it released")
    checkpoint = load_checkpoint(path, device)
    if "round" not in checkpoint:
        raise ConfigError(f"{path} has no round: it was written before runs could be resumed; "
                          "start a new run")
    saved = config_from_dict(checkpoint["config"])
    changed = [key for key, value in config.to_dict().items()
               if key not in RESUMABLE and saved.to_dict()[key] != value]
    if changed:
        key = changed[0]
        raise ConfigError(f"resume: {key} = {getattr(config, key)!r} but the checkpoint's run "
                          f"used {getattr(saved, key)!r}; a resumed run keeps every setting "
                          f"except {', '.join(sorted(RESUMABLE))}")
    if checkpoint["round"] >= config.rounds:
        raise ConfigError(f"resume: the checkpoint is at round {checkpoint['round']}, not "
                          f"before rounds = {config.rounds}; raise --rounds to train further")
    charged = logged_charges(source)
    _check_covers(checkpoint, charged, source)
    return ResumePoint(source, checkpoint, checkpoint["round"], charged)


def logged_charges(run_dir: Path) -> list[list[LedgerEntry]]:
    """The server-signed ``charged`` records of ``run_dir``'s log, each as its entries. The log
    must verify; one cut short (a killed process: every line verifies, the closing record is
    missing) is taken, and a client input it holds without a charge (the aggregation the kill
    cut short) is charged as that client's previous charge of the kind, one per round."""
    report = verify_run(run_dir)
    bad = report.first_bad
    cut_short = bad is not None and bad.seq is None and report.records == report.lines
    if not report.ok and not cut_short:
        raise ConfigError(f"resume: {run_dir / LOG_FILE} does not verify ({bad.problem}); a "
                          "resumed run counts the privacy spent from that log, so it needs the "
                          "log intact")
    records = [json.loads(line) for line in (run_dir / LOG_FILE).read_text().splitlines()]
    charged = [charged_entries(record) for record in records
               if record.get("event") == CHARGED and record.get("sender") == SERVER]
    return charged + _uncharged(records, charged, run_dir) if cut_short else charged


def _uncharged(records: list[dict], charged: list[list[LedgerEntry]],
               run_dir: Path) -> list[list[LedgerEntry]]:
    """Charges for the DP client inputs (``dp`` among their stages) that no charge covers,
    priced as the client's last charge of that kind (of any kind under local noise, where
    every kind costs the same)."""
    covered = {(e.round, e.kind, e.client) for entries in charged for e in entries}
    last = {(e.client, e.kind): e for entries in charged for e in entries}
    last.update({(e.client, None): e for entries in charged for e in entries
                 if e.mechanism == "gaussian"})
    missing: dict[tuple[int, str], list[LedgerEntry]] = {}
    phases = input_phases()
    for r in records:
        key = (r.get("round"), r.get("kind"), r.get("sender"))
        if (r.get("phase") not in phases or r.get("recipient") != SERVER
                or DPStage.name not in r.get("stages", ()) or key in covered):
            continue
        covered.add(key)
        previous = last.get((r["sender"], r["kind"])) or last.get((r["sender"], None))
        if previous is None:
            raise ConfigError(f"resume: {run_dir / LOG_FILE} was cut short with "
                              f"{r['sender']}'s round-{r['round']} {r['kind']} input uncharged "
                              "and no earlier charge to price it by; start a new run")
        missing.setdefault((r["round"], r["kind"]), []).append(
            replace(previous, kind=r["kind"], round=r["round"], steps=1))
    return list(missing.values())


def _check_covers(checkpoint: dict, charged: list[list[LedgerEntry]], source: Path) -> None:
    """Every entry of the checkpoint's ledger is in the log's charges (a log that charges less
    than the checkpoint saw was cut or rewritten)."""
    logged = Counter((e.client, e.kind, e.round) for entries in charged for e in entries)
    saved = Counter((e["client"], e["kind"], e["round"])
                    for e in checkpoint["state"].get("ledger", {}).get("entries", []))
    missing = saved - logged
    if missing:
        client, kind, round_ = next(iter(missing))
        raise ConfigError(f"resume: {source / LOG_FILE} charges less than the checkpoint's "
                          f"ledger (no charge for {client}'s round-{round_} {kind}); resume "
                          "only from the log the run wrote")


def refuse_over_budget(trainer, point: ResumePoint, last: int, rounds: int) -> None:
    """Raise :class:`BudgetError` when the resumed ``trainer`` (its ledger holding
    ``point``'s charges) can reach only round ``last`` of the planned ``rounds`` within its
    target: the message says how many rounds fit."""
    if last >= rounds:
        return
    dp, first = trainer.dp, point.round + 1
    spent = {cid: trainer.ledger.epsilon(cid, "rdp" if trainer.distributed else dp.accountant)
             for cid in trainer.ledger.clients()}
    worst = max(spent, key=spent.get)
    released = max((e.round for entries in point.charged for e in entries), default=0)
    multiplier = next(iter(trainer.noise_multipliers.values()))
    head = (f"resume: the log of {point.source} charged releases through round {released} "
            f"({worst} at epsilon {spent[worst]:.4g} of target {dp.target_epsilon:g}); rounds "
            f"{first}..{rounds} at noise multiplier {multiplier:.4g} would exceed the target")
    if last >= first:
        raise BudgetError(f"{head}: rounds {first}..{last} fit; pass --rounds {last}, or raise "
                          "--target-epsilon")
    raise BudgetError(f"{head}: not one more round fits; raise --target-epsilon")
