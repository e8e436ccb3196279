import json

import pytest
import torch

from secureffm.errors import ConfigError
from secureffm.run import run

FILES = {"config.toml", "metrics.json", "messages.jsonl", "checkpoint.pt", "trajectories.png",
         "w2_nfe.png"}


@pytest.mark.parametrize("method", ["vanilla", "lot", "got", "icfm", "otcfm"])
def test_short_run_of_every_method_writes_the_run_folder(small_config, method):
    config = small_config(method=method, potential_every=5)
    result = run(config)
    assert FILES <= {p.name for p in result.out.iterdir()}
    w2 = result.metrics["eval"]["w2"]
    assert set(w2) == {"1", "4"} and all(v > 0 and v == v for v in w2.values())
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    if method in ("icfm", "otcfm"):
        assert records == []
        return
    # One gradient per client per round, each up to the server; the server never uploads.
    assert kinds.count("gradient") == config.rounds * config.clients
    assert kinds.count("global_model") == config.rounds * config.clients
    assert all(r["recipient"] == "server" for r in records if r["kind"] == "gradient")
    duals = kinds.count("dual_update")
    assert duals == (config.rounds // 5 * config.clients if method == "got" else 0)
    state = torch.load(result.out / "checkpoint.pt", weights_only=False)
    assert ("potential" in state["state"]) == (method == "got")


def test_training_reduces_w2(small_config):
    before = run(small_config(method="icfm", rounds=1, ema_decay=0.0, shard_size=2000,
                              eval_samples=1000, nfe=(8,)))
    after = run(small_config(method="icfm", rounds=600, ema_decay=0.0, shard_size=2000,
                             eval_samples=1000, nfe=(8,)))
    assert after.metrics["eval"]["w2"]["8"] < 0.5 * before.metrics["eval"]["w2"]["8"]


def test_got_dual_ascent_raises_the_held_out_dual_value(small_config):
    # Algorithm 4 printed as descent collapses the coupling; ascent must raise the dual value
    # towards W2^2 / 2 and keep many candidates in use.
    short = run(small_config(method="got", rounds=1, potential_every=1, potential_lr=3e-3))
    long = run(small_config(method="got", rounds=300, potential_every=1, potential_lr=3e-3))
    before, after = short.metrics["eval"]["potential"], long.metrics["eval"]["potential"]
    assert after["dual_value"] > before["dual_value"] + 1.0
    assert after["unused_candidates"] < 0.9


def test_centralized_baseline_refuses_a_protective_protocol(small_config):
    with pytest.raises(ConfigError, match="centralized baseline"):
        run(small_config(method="icfm", protocol="secagg"))
