"""A method family added by this file alone (issue 40): the method interface is enough.

The toy family ``toy-mean`` estimates the mean of the federation's data. Its client program
(a :data:`~secureffm.federation.channel.Program` running a
:class:`~secureffm.federation.channel.Task`) answers task ``mean.release`` once per planned
round with the mean of its shard; under a dp stage, with the sum of a Poisson sample of its
rows, each clipped to L2 norm C, plus Gaussian noise of std sigma C, over the expected batch
(one subsampled Gaussian step a round). Its server aggregates the means through the Channel,
charges a :class:`~secureffm.privacy.budget.ServerLedger` and returns a
:class:`~secureffm.methods.round_report.RoundReport`; its runner writes the run folder with
privacy.json, and :func:`secureffm.families.register` makes ``secureffm.runs.run`` (the entry
the real methods use) dispatch to it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

from secureffm import families
from secureffm.config import RunConfig, write_config
from secureffm.data.pairs import get_pair, make_shards
from secureffm.errors import BudgetError, ConfigError
from secureffm.federation.channel import Channel, Task, TaskRefused, task_count
from secureffm.federation.log import MessageLog
from secureffm.federation.message import Payload
from secureffm.federation.parties import Client, new_clients
from secureffm.methods.round_report import RoundReport
from secureffm.privacy import budget
from secureffm.privacy.budget import Plan, ServerLedger
from secureffm.privacy.dpsgd import poisson_rate, poisson_rows
from secureffm.privacy.ledger import CHARGED, PrivacyLedger, charged_entries
from secureffm.privacy.releases import ReleaseGuard, Rounds
from secureffm.privacy.settings import DPSettings
from secureffm.protocols.protocol import load_protocol
from secureffm.protocols.statement import privacy_statement
from secureffm.runs import run
from secureffm.runs.scaffold import (
    RunResult,
    open_channel,
    prepare_run_folder,
    record_pin,
    resolve_dp,
    run_folder,
)

KIND = "gradient"  # a kind a dp stage can protect: the toy's noisy mean is gradient-like
TASK = "mean.release"
TOY = families.Family("toy", ("toy-mean",), f"{__name__}:run_mean")


class MeanClient:
    """The toy's client program, from public settings only: ``dp`` (None: the exact mean of
    the shard), ``plan`` (q and the planned rounds), ``batch`` (the expected batch, the DP
    divisor) and ``rounds`` (what it answers: rounds 1..rounds, each once)."""

    def __init__(self, dp: DPSettings | None, plan: Plan, batch: int, rounds: int):
        self.dp, self.plan, self.batch = dp, plan, batch
        self.sigma = budget.noise_multiplier(dp, plan) if dp is not None else 0.0
        self.releases = ReleaseGuard({TASK: Rounds(1, rounds)})

    def __call__(self, client: Client, task: Task) -> Payload:
        if task.name != TASK:
            raise TaskRefused(f"toy clients run {TASK}, not {task.name!r}")
        refused = self.releases.admit(client.id, client.state, TASK,
                                      task_count(client.id, task, "round"))
        if refused:
            raise TaskRefused(refused)
        if self.dp is None:
            return {"mean": client.data.mean(0).numpy().astype(np.float32)}
        secret = client.state.setdefault("dp_rng", client.streams.torch("dp"))
        x = client.data[poisson_rows(client.size, self.plan.rate, secret)]
        clip = self.dp.clip
        x = x * (clip / x.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
        noise = torch.randn(x.shape[1], generator=secret) * self.sigma * clip
        return {"mean": ((x.sum(0) + noise) / self.batch).numpy().astype(np.float32)}


class MeanServer:
    """The toy's server: the running mean of the rounds' aggregated means (``estimate``)."""

    def __init__(self, channel: Channel, dp: DPSettings | None, plan: Plan, sigma: float,
                 dim: int):
        self.channel = channel
        self.weights = {c.id: 1 / len(channel.clients) for c in channel.clients}
        self.template = {"mean": ((dim,), np.dtype(np.float32))}
        self.estimate, self.rounds = np.zeros(dim), 0
        self.ledger = None if dp is None else ServerLedger(
            dp, plan.rate, dict.fromkeys(self.weights, sigma), note=channel.note)

    def train_round(self, round_: int) -> RoundReport:
        result = self.channel.aggregate(round_, KIND, Task(TASK, {"round": round_}),
                                        self.weights, self.template)
        if self.ledger is not None:
            self.ledger.charge(result.asked, KIND, round_)
        if result.payload is None:
            return RoundReport(aborted=1)
        self.rounds += 1
        self.estimate += (result.payload["mean"] - self.estimate) / self.rounds
        return RoundReport(diagnostics={"estimate_norm": float(np.linalg.norm(self.estimate))})


def run_mean(config: RunConfig, connect=None) -> RunResult:
    """The toy family's runner: the run folder, config.toml, messages.jsonl, privacy.json and
    metrics.json (the estimate and the exact mean, which only this test's evaluator knows)."""
    if connect is not None:
        raise ConfigError("the toy family runs in-process only; use --engine inprocess")
    out = prepare_run_folder(run_folder(config), config.overwrite)
    write_config(config, out / "config.toml")
    protocol = load_protocol(config.protocol)
    dp = resolve_dp(config, protocol, (KIND,))
    plan = Plan(poisson_rate(config.batch_size, config.shard_size), ((KIND, config.rounds),))
    program = MeanClient(dp, plan, config.batch_size, config.rounds)
    if dp is not None:
        budget.refuse_overspending(
            lambda rounds: budget.gaussian_epsilon(dp, replace(plan, steps=((KIND, rounds),)),
                                                   program.sigma),
            dp, program.sigma, 1, config.rounds, "rounds", "pass --rounds {fit}")
    pair = get_pair(config.data)
    shards = make_shards(pair, config.clients, config.shard_size, config.partition, config.seed)
    log = MessageLog(out / "messages.jsonl")
    channel = open_channel(protocol, new_clients(shards, config.deterministic_seed), log,
                           deterministic_seed=config.deterministic_seed, program=program)
    server = MeanServer(channel, dp, plan, program.sigma, pair.dim)
    reports = [server.train_round(r) for r in range(1, config.rounds + 1)]
    pin = record_pin(out, channel.close(), config.pin_to)
    accounting = None if server.ledger is None else server.ledger.accounting(
        rounds_run=config.rounds)
    statement = privacy_statement(protocol, (KIND,), deterministic=config.insecure_deterministic,
                                  nominal_records=config.shard_size,
                                  sample_rate=plan.rate if dp else None, accounting=accounting)
    (out / "privacy.json").write_text(json.dumps(statement, indent=2))
    metrics = {"method": config.method, "protocol": protocol.name, "rounds": config.rounds,
               "aborted_aggregations": sum(r.aborted for r in reports),
               "eval": {"estimate": server.estimate.tolist(),
                        "mean": torch.cat(shards).mean(0).tolist()}}
    return RunResult(out, metrics, pin)


@pytest.fixture
def toy(monkeypatch):
    """The toy family registered for one test (the registry restored after it)."""
    monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))
    families.register(TOY)


def _config(tmp_path, name, **changes) -> RunConfig:
    values = dict(method="toy-mean", data="8gaussians-moons", clients=3, partition="iid",
                  shard_size=200, batch_size=50, rounds=3, progress=False, device="cpu",
                  insecure_deterministic=True, out=str(tmp_path / name))
    return RunConfig(**{**values, **changes})


def test_an_unregistered_method_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="choose one of vanilla"):
        _config(tmp_path, "unknown")
    with pytest.raises(ConfigError, match="are taken"):
        families.register(families.Family("again", ("got",), "x:y"))


def test_a_toy_family_trains_through_the_runner_entry_of_the_real_methods(toy, tmp_path):
    """Plaintext: the estimate is the exact mean of the federation's data (equal shards, equal
    weights); no DP, so no ledger and privacy.json says so."""
    result = run(_config(tmp_path, "plain"))
    evaluation = result.metrics["eval"]
    np.testing.assert_allclose(evaluation["estimate"], evaluation["mean"], rtol=1e-5, atol=1e-6)
    assert result.metrics["aborted_aggregations"] == 0 and result.pin is not None
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert privacy["dp"].startswith("none") and "clients" not in privacy
    assert result.metrics["summary"]["privacy"] is None


def test_a_toy_family_under_dp_secagg_charges_its_ledger_and_states_it(toy, tmp_path):
    """dp-secagg at sigma 2: the server sees masked inputs only, charges each client one
    subsampled Gaussian step a round, signed into the log; privacy.json's epsilon is Opacus'
    for that history, and the charged records rebuild the same ledger. A target that 3 rounds
    at sigma 0.5 would pass is refused before anything is sent."""
    result = run(_config(tmp_path, "dp", protocol="dp-secagg", noise_multiplier=2.0,
                         insecure_deterministic=False))  # else no claim holds
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    inputs = [r for r in records if r["kind"] == KIND and r["recipient"] == "server"]
    assert inputs and {tuple(r["stages"]) for r in inputs} == {("dp", "secagg")}
    charged = [r for r in records if r.get("event") == CHARGED]
    assert [r["round"] for r in charged] == [1, 2, 3]
    rebuilt = PrivacyLedger(1e-5)
    for record in charged:
        for entry in charged_entries(record):
            rebuilt.record(entry)
    accountant = RDPAccountant()
    accountant.history = [(2.0, 50 / 200, 3)]
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert set(privacy["clients"]) == {"client-1", "client-2", "client-3"}
    for cid, row in privacy["clients"].items():
        assert row["rdp"]["total"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
        assert row["rdp"]["total"] == pytest.approx(rebuilt.epsilon(cid), rel=1e-12)
        assert row["target_held"] is True
    assert privacy["mechanisms"][KIND]["stages"] == ["dp", "secagg"]
    assert privacy["rounds_run"] == 3 and privacy["noise_multiplier"]["client-1"] == 2.0
    with pytest.raises(BudgetError, match="past the target 2"):
        run(_config(tmp_path, "over", protocol="dp-secagg", noise_multiplier=0.5,
                    target_epsilon=2.0))
