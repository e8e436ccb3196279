import json

import pytest

from secureffm.cli import main
from secureffm.errors import ConfigError, ProtocolError
from secureffm.protocols import load_protocol
from secureffm.runs import run


def privacy(result):
    return json.loads((result.out / "privacy.json").read_text())


def uploads(result):
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] in ("gradient", "dual_update")
            and r["recipient"] == "server"]


def test_dp_secagg_got_meets_its_target_and_logs_both_stages(small_config):
    result = run(small_config(method="got", protocol="dp-secagg", rounds=20, potential_every=5,
                              target_epsilon=4.0, insecure_deterministic=False))
    report = privacy(result)
    for client in ("client-1", "client-2"):
        row = report["clients"][client]
        assert row["target_held"] and row["rdp"]["total"] <= 4.0
        assert row["rdp"]["total"] > 3.5  # calibrated to the target, not far below it
        assert set(row["rdp"]["by_kind"]) == {"gradient", "dual_update"}
        assert row["prv"]["total"] > 0
    masked = [r for r in uploads(result) if r["phase"] == "masked_input"]
    assert masked and all(r["stages"] == ["dp", "secagg"] for r in masked)


def test_got_spends_more_than_vanilla_at_the_same_noise_and_steps(small_config, tmp_path):
    common = dict(protocol="dp", rounds=20, noise_multiplier=1.0, potential_every=2)
    got = privacy(run(small_config(method="got", out=str(tmp_path / "g"), **common)))
    vanilla = privacy(run(small_config(method="vanilla", out=str(tmp_path / "v"), **common)))
    for client in ("client-1", "client-2"):
        g, v = got["clients"][client]["rdp"], vanilla["clients"][client]["rdp"]
        assert g["by_kind"]["gradient"] == pytest.approx(v["by_kind"]["gradient"])
        assert g["total"] > v["total"]


def test_lot_under_dp_is_refused_with_the_reason(small_config):
    with pytest.raises(ConfigError, match="couples every example with every other"):
        run(small_config(method="lot", protocol="dp"))


def test_got_with_an_unprotected_dual_update_is_refused(small_config, tmp_path):
    spec = tmp_path / "half.toml"
    spec.write_text('name = "half"\n[[stages]]\nstage = "dp"\nprotects = ["gradient"]\n'
                    'clip = 1.0\ndelta = 1e-5\ntarget_epsilon = 8.0\n')
    with pytest.raises(ProtocolError, match="does not protect 'dual_update', which method 'got'"):
        run(small_config(method="got", protocol=str(spec), out=str(tmp_path / "got")))
    run(small_config(method="vanilla", protocol=str(spec), rounds=3))  # vanilla sends none


@pytest.mark.parametrize("line, fragment", [
    ('noise = "shared"', "noise = 'shared'"),
    ('protects = ["measure"]', "cannot protect kind 'measure'"),
    ('clip = -1.0', "clip = -1.0"),
    ('accountant = "gdp"', "accountant = 'gdp'"),
])
def test_dp_spec_errors_name_the_key(tmp_path, line, fragment):
    keys = {"protects": '["gradient"]', "clip": "1.0", "delta": "1e-5",
            "target_epsilon": "8.0"}
    key = line.split(" =")[0]
    keys[key] = line.split("= ", 1)[1]
    body = "\n".join(f"{k} = {v}" for k, v in keys.items())
    spec = tmp_path / "bad.toml"
    spec.write_text(f'name = "bad"\n[[stages]]\nstage = "dp"\n{body}\n')
    with pytest.raises(ProtocolError, match=fragment):
        load_protocol(str(spec))


def test_got_potential_stays_healthy_under_dp(small_config):
    # Each example's clipped dual gradient must carry both terms of its semi-dual loss; clipping
    # only the data term while adding the source term unclipped made the potential grow without
    # bound on the source and collapsed the coupling (dual value about -900, 99.6% of the
    # candidates unused).
    result = run(small_config(method="got", protocol="dp", rounds=300, potential_every=1,
                              potential_lr=3e-3, shard_size=2000, target_epsilon=8.0))
    health = result.metrics["eval"]["potential"]
    assert health["dual_value"] > 1.0 and health["unused_candidates"] < 0.9


@pytest.mark.parametrize("method", ["vanilla", "icfm"])
def test_dp_options_without_a_dp_stage_are_refused(small_config, method):
    with pytest.raises(ConfigError, match="has no dp stage"):
        run(small_config(method=method, protocol="plaintext", target_epsilon=8.0))


def test_max_grad_norm_and_accountant_override_the_spec_in_privacy_json(tmp_path):
    """Opacus users' knobs from the command line: --max-grad-norm replaces the dp stage's clip
    (1.0) and --accountant prv calibrates and enforces; privacy.json states both as resolved."""
    out = tmp_path / "run"
    assert main(["run", "--method", "vanilla", "--protocol", "dp", "--rounds", "3",
                 "--shard-size", "200", "--batch-size", "32", "--eval-samples", "100",
                 "--nfe", "1", "--trajectories", "10", "--no-progress", "--device", "cpu",
                 "--target-epsilon", "8", "--max-grad-norm", "0.5", "--accountant", "prv",
                 "--out", str(out)]) == 0
    report = json.loads((out / "privacy.json").read_text())
    assert (report["clip"], report["enforced_by"]) == (0.5, "prv")
    assert all(row["prv"]["total"] <= 8.0 for row in report["clients"].values())


def test_prv_with_distributed_noise_is_refused_by_name(small_config):
    with pytest.raises(ConfigError, match="accountant = 'prv'.*--accountant rdp"):
        run(small_config(method="vanilla", protocol="dp-secagg-distributed", accountant="prv"))
