"""An interrupted run keeps its ledger, and a resumed run counts every round released.

The adversary is whoever stops a run part way, an operator or a crash, in a way that would
make the ledger under-count: a run cut short that leaves no privacy.json and no checkpoint (a
re-run then spends a fresh budget on the same records), or a resume that counts only the
rounds its checkpoint saw (the rounds released after it are spent again, uncounted). The log is
the evidence: privacy.json of an interrupted run, and the ledger of a resumed one, equal what the
audit recomputes from the log's signed ``charged`` records.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from secureffm.audit.claims import audit_claims
from secureffm.audit.threat import load_adversary
from secureffm.audit.verify import verify_run
from secureffm.errors import BudgetError, ConfigError, RunInterrupted
from secureffm.methods.ffm import FederatedFlowMatching
from secureffm.protocols.channel import ProtectedChannel
from secureffm.runs import run
from secureffm.runs.interrupt import terminate_raises
from secureffm.runs.scaffold import load_checkpoint

TINY = dict(method="vanilla", protocol="dp-secagg", clients=2, rounds=6, shard_size=100,
            batch_size=16, hidden=32, eval_samples=100, nfe=(1,), trajectories=10,
            target_epsilon=1.0)  # large noise: its accounting is quick


def _audited(out) -> dict[str, float]:
    """Each client's total epsilon as the audit recomputes it from the log."""
    report = audit_claims(out, load_adversary("honest-but-curious-server"))
    return {client: kinds["total"] for client, kinds in report.epsilon.items()}


def _stated(out) -> dict[str, float]:
    privacy = json.loads((out / "privacy.json").read_text())
    return {client: row["rdp"]["total"] for client, row in privacy["clients"].items()}


def _charged_steps(out) -> int:
    """Rounds of gradient charged to client-1 in the log (each charge is one step)."""
    records = [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]
    return sum(r["charged"]["client-1"]["steps"] for r in records
               if r.get("event") == "charged" and "client-1" in r["charged"])


def _interrupt_after(monkeypatch, cls, name: str, at: int) -> None:
    """Make ``cls.name`` (whose round is its first argument, or its last for ``_record``) run
    as usual, then raise KeyboardInterrupt once it has run for round ``at``: a Ctrl-C that lands
    right after that step."""
    real = getattr(cls, name)

    def step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if args[-1 if name == "_record" else 0] == at:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(cls, name, step)


def test_an_interrupted_round_leaves_privacy_json_equal_to_the_audit(small_config, monkeypatch):
    """Ctrl-C in round 3, after its charge: the log closes, privacy.json states the epsilon of
    the 3 rounds released (as the audit recomputes it), and the checkpoint is round 2's."""
    _interrupt_after(monkeypatch, FederatedFlowMatching, "_record", 3)
    config = small_config(**TINY)
    with pytest.raises(RunInterrupted, match=r"round 3 of 6.*--resume"):
        run(config)
    out = Path(config.out)
    assert verify_run(out).ok  # closed, intact
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["interrupted"]["at_round"] == 3 and privacy["interrupted"]["checkpoint"] == 2
    assert _charged_steps(out) == 3
    assert _stated(out) == pytest.approx(_audited(out), rel=1e-9) and _stated(out)
    assert load_checkpoint(out / "checkpoint.safetensors")["round"] == 2
    assert not (out / "metrics.json").exists()  # a sweep must not take it for finished


def test_an_interruption_inside_an_aggregation_charges_what_was_sent(small_config, monkeypatch):
    """Ctrl-C once round 2's masked inputs reached the server but before the ledger charged
    them: the round is charged on the way out, so no input is uncharged in the log."""
    _interrupt_after(monkeypatch, ProtectedChannel, "aggregate", 2)
    config = small_config(**TINY, insecure_deterministic=False)  # else no epsilon claim holds
    with pytest.raises(RunInterrupted):
        run(config)
    out = Path(config.out)
    report = audit_claims(out, load_adversary("honest-but-curious-server"))
    epsilon = {v.claim: v for v in report.verdicts}["epsilon"]
    assert epsilon.status == "PASS", epsilon.reason
    assert _charged_steps(out) == 2
    assert _stated(out) == pytest.approx(_audited(out), rel=1e-9)


def test_a_stop_during_gots_joint_aggregation_checkpoints_the_round_before(small_config,
                                                                          monkeypatch):
    """Ctrl-C once round 2's joint aggregation (velocity gradient and dual update in one
    secure aggregation) returned, before the ledger charged it: no update of round 2 was
    applied, so the checkpoint is round 1, and both of round 2's kinds are charged on the
    way out (privacy.json equals the audit's recomputation)."""
    real = ProtectedChannel.aggregate_many

    def aggregate_many(self, round_, parts, *args, **kwargs):
        out = real(self, round_, parts, *args, **kwargs)
        if round_ == 2:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(ProtectedChannel, "aggregate_many", aggregate_many)
    config = small_config(**{**TINY, "method": "got", "potential_every": 2, "candidates": 16})
    with pytest.raises(RunInterrupted, match="checkpoint.safetensors holds round 1"):
        run(config)
    out = Path(config.out)
    assert load_checkpoint(out / "checkpoint.safetensors")["round"] == 1
    assert _stated(out) == pytest.approx(_audited(out), rel=1e-9)
    records = [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]
    assert sorted(r["of_kind"] for r in records if r.get("event") == "charged"
                  and r["round"] == 2) == ["dual_update", "gradient"]
    kinds = json.loads((out / "privacy.json").read_text())["clients"]["client-1"]["rdp"]
    assert set(kinds["by_kind"]) == {"gradient", "dual_update"}


def test_a_killed_run_resumes_counting_the_inputs_its_log_holds(small_config, monkeypatch,
                                                                tmp_path):
    """A log cut short by a kill (no closing record) in round 2's aggregation, its clients'
    inputs already logged but not charged: the resume charges them; a log with a charged
    record deleted is refused."""
    with monkeypatch.context() as patch:
        _interrupt_after(patch, ProtectedChannel, "aggregate", 2)
        with pytest.raises(RunInterrupted):
            run(small_config(**TINY))
    first = tmp_path / "run"
    lines = (first / "messages.jsonl").read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines[-2:]] == ["charged", "closed"]
    killed = tmp_path / "killed"  # as a kill in round 2 leaves it: the stop's charge not made
    killed.mkdir()
    for name in ("parties.json", "checkpoint.safetensors"):
        (killed / name).write_bytes((first / name).read_bytes())
    (killed / "messages.jsonl").write_text("\n".join(lines[:-2]) + "\n")
    assert not verify_run(killed).ok
    second = run(small_config(**{**TINY, "target_epsilon": 2.0},  # the 7th round needs more
                              resume=str(killed), out=str(tmp_path / "second")))
    assert _charged_steps(second.out) == 2 + 5  # rounds 1-2 released, then 2-6
    assert _stated(second.out) == pytest.approx(_audited(second.out), rel=1e-9)
    edited = [x for x in lines if json.loads(x).get("event") != "charged" or
              json.loads(x)["round"] != 1]
    (killed / "messages.jsonl").write_text("\n".join(edited) + "\n")
    with pytest.raises(ConfigError, match="does not verify"):
        run(small_config(**TINY, resume=str(killed), out=str(tmp_path / "third")))


def test_sigterm_stops_the_run_like_ctrl_c(small_config, monkeypatch):
    """SIGTERM (a scheduler stopping the job) is turned into the same clean stop."""
    real = FederatedFlowMatching.train_round

    def train_round(self, round_):
        if round_ == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, round_)

    monkeypatch.setattr(FederatedFlowMatching, "train_round", train_round)
    config = small_config(**TINY)
    with terminate_raises(), pytest.raises(RunInterrupted, match="SIGTERM"):
        run(config)
    out = Path(config.out)
    assert _stated(out) == pytest.approx(_audited(out), rel=1e-9)


def test_resume_counts_every_released_round_and_refuses_to_exceed_the_target(
        small_config, monkeypatch, tmp_path):
    """Interrupted after round 3's charge, checkpoint at round 2: the resume counts the 3
    rounds the log shows, so the 6 planned rounds at the calibrated noise would exceed the
    target and are refused by name; the rounds it says fit run, and the final epsilon is the
    audit's, within the target. A newer checkpoint planted beside the older log is refused."""
    config = small_config(**TINY)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, FederatedFlowMatching, "_record", 3)
        with pytest.raises(RunInterrupted):
            run(config)
    first = Path(config.out)
    with pytest.raises(ConfigError, match="new folder"):
        run(small_config(**TINY, resume=str(first)))
    with pytest.raises(BudgetError, match=r"--rounds (\d+)") as refused:
        run(small_config(**TINY, resume=str(first),
                         out=str(tmp_path / "second")))
    fit = int(re.search(r"--rounds (\d+)", str(refused.value)).group(1))
    assert 2 <= fit < 6
    assert not (tmp_path / "second").exists()  # the refused continuation left no folder
    second = run(small_config(**{**TINY, "rounds": fit}, resume=str(first),
                              out=str(tmp_path / "second")))
    out = second.out
    assert second.metrics["resumed_from"]["round"] == 2
    assert _charged_steps(out) == 3 + (fit - 2)  # the 3 released before, then rounds 3..fit
    stated, audited = _stated(out), _audited(out)
    assert stated == pytest.approx(audited, rel=1e-9)
    assert max(audited.values()) <= 1.0
    # the continuation's checkpoint planted in the interrupted run's folder: its log charges less
    (first / "checkpoint.safetensors").write_bytes((out / "checkpoint.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="charges less than the checkpoint's ledger"):
        run(small_config(**{**TINY, "rounds": fit + 1}, resume=str(first),
                         out=str(tmp_path / "third")))


def test_an_image_resume_counts_the_rounds_after_its_checkpoint(small_config, monkeypatch,
                                                                 tmp_path):
    """An image run checkpoints every 2 rounds and is interrupted after round 3's charge: the
    resumed run's ledger counts round 3's release too (the issue's 5.78 against 5.99)."""
    images = dict(TINY, data="shapes", image_size=8, unet_width=8, unet_mult=(1, 2),
                  shard_size=64, candidates=16, eval_samples=64, nfe=(2,), rounds=4,
                  protocol="dp", noise_multiplier=4.0, checkpoint_every=2)
    images.pop("hidden"), images.pop("trajectories")
    config = small_config(**images)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, FederatedFlowMatching, "_record", 3)
        with pytest.raises(RunInterrupted):
            run(config)
    first = Path(config.out)
    assert load_checkpoint(first / "checkpoint.safetensors")["round"] == 2
    second = run(small_config(**images, resume=str(first / "checkpoint.safetensors"),
                              out=str(tmp_path / "second")))
    assert _charged_steps(second.out) == 3 + 2  # rounds 1-3 released, then 3-4 again
    assert _stated(second.out) == pytest.approx(_audited(second.out), rel=1e-9)


@pytest.mark.slow
def test_ctrl_c_on_the_command_line(tmp_path):
    """A real SIGINT to ``secureffm run`` once the log shows two charges (round 1 finished, so a
    checkpoint exists to resume from; a stop in round 1 leaves none): exit 130, a one-line
    message (no traceback), a closed log and privacy.json equal to the audit's recomputation;
    ``--resume`` then runs two more rounds within the target, counting the interrupted ones."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "secureffm.cli", "run", "--method", "vanilla", "--protocol",
            "dp-secagg", "--shard-size", "100", "--batch-size", "16", "--hidden", "32",
            "--eval-samples", "100", "--nfe", "1", "--trajectories", "10", "--no-progress"]
    process = subprocess.Popen([*args, "--rounds", "5000", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "messages.jsonl"
    while process.poll() is None and not (log.is_file()
                                          and log.read_text().count('"charged"') >= 2):
        time.sleep(0.05)  # polls for the second charge; asserts nothing about time
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate()
    assert process.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]  # Opacus may warn above it
    assert "Traceback" not in stderr and last.startswith("secureffm: interrupted (SIGINT)")
    assert "--resume" in last
    assert verify_run(out).ok
    assert _stated(out) == pytest.approx(_audited(out), rel=1e-9)
    checkpoint = load_checkpoint(out / "checkpoint.safetensors")["round"]
    again = out.parent / "again"  # two rounds more, at the interrupted run's noise
    resumed = subprocess.run([*args, "--rounds", str(checkpoint + 2), "--resume", str(out),
                              "--out", str(again)], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert _charged_steps(again) == _charged_steps(out) + 2
    assert _stated(again) == pytest.approx(_audited(again), rel=1e-9)
    assert max(_audited(again).values()) <= 8.0  # dp-secagg's target
