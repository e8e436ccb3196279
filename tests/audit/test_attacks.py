"""Attacks on what a run's server logged (secureffm.audit.attacks), on real tiny runs.

Runs: FFM-vanilla on 8x8 digits, two clients, batch 1, a width-8 U-Net, payloads kept, secret
streams derived from the seed so the experimenter can replay the truth. Thresholds: on images in
[-1, 1], 20 dB PSNR is an RMS error of 0.2 per pixel (a tenth of the range: the same digit to
the eye); the test set's mean image, what an attacker gets with no message, scores about 12 dB.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from secureffm.audit.attacks import run_attack
from secureffm.audit.attacks.fedwad_reconstruction import invert_interpolation
from secureffm.audit.attacks.membership import auc_and_tpr, membership_scores
from secureffm.cli import main
from secureffm.config import RunConfig
from secureffm.data.images import load_digit_images
from secureffm.errors import SecureFFMError
from secureffm.methods.fedwad import FedWADConfig, Measure, interpolate, wasserstein
from secureffm.methods.flow_matching import flow_matching_loss
from secureffm.models.unet import UNet
from secureffm.runs.fedwad import FedWADRun, run_fedwad
from secureffm.runs.ffm import run_ffm

# The informed attacker on one client's message (the search the experiment runs, shortened).
QUICK = {"steps": 150, "clients": 1, "uninformed": False, "aggregate": False}


def digits_run(folder, protocol: str) -> str:
    config = RunConfig(method="vanilla", protocol=protocol, data="digits", clients=2,
                       batch_size=1, shard_size=600, rounds=1, unet_width=8, unet_mult=(1, 2),
                       ema_decay=0.0, eval_samples=50, nfe=(1,), keep_payloads=True,
                       insecure_deterministic=True, progress=False, device="cpu",
                       out=str(folder))
    run_ffm(config)
    return folder


@pytest.fixture(scope="module")
def plaintext_run(tmp_path_factory):
    return digits_run(tmp_path_factory.mktemp("plaintext"), "plaintext")


def test_the_informed_attacker_recovers_a_plaintext_gradient_s_image(plaintext_run):
    """Adversary: the honest-but-curious server, holding the round's model and the client's
    plaintext gradient, knowing the example's noise and time (the upper bound)."""
    torch.set_num_threads(1)
    found = run_attack(plaintext_run, "inversion", **QUICK)
    assert found["batch"] == 1 and found["prior_psnr"] < 15
    assert found["message_informed_psnr"] > 20 and found["message_informed_ssim"] > 0.8
    assert (plaintext_run / "attacks" / "inversion.png").is_file()


def test_the_same_attacker_gets_nothing_from_a_masked_vector(tmp_path):
    """Adversary: the same server under secagg; it holds only the client's masked vector (and
    the sum, not attacked here): its reconstruction is no closer than the mean image."""
    found = run_attack(digits_run(tmp_path / "secagg", "secagg"), "inversion",
                       **{**QUICK, "restarts": 1})  # one start (time): experiments/attacks.py
    assert found["message_informed_psnr"] < found["prior_psnr"] + 1  # runs 3, with this result


@pytest.mark.slow
def test_secagg_s_sum_of_two_batch_one_gradients_still_gives_both_images(tmp_path):
    """Adversary: the server under secagg attacking the sum it unmasks: with two clients of
    one example each, the informed attacker inverts the sum as a batch of two."""
    found = run_attack(digits_run(tmp_path / "secagg", "secagg"), "inversion", steps=300,
                       uninformed=False)
    assert found["message_informed_psnr"] < found["prior_psnr"] + 1
    assert found["sum_informed_psnr"] > 20


def test_the_attacks_refuse_runs_they_cannot_score(plaintext_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(plaintext_run, copy)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace("insecure_deterministic = true",
                                                 "insecure_deterministic = false"))
    with pytest.raises(SecureFFMError, match="--insecure-deterministic"):
        run_attack(copy, "inversion", **QUICK)
    (copy / "payloads.bin").unlink()
    with pytest.raises(SecureFFMError, match="--keep-payloads"):
        run_attack(copy, "membership")
    with pytest.raises(SecureFFMError, match="applies to tabular runs only"):
        run_attack(copy, "membership", samples=100)
    with pytest.raises(SecureFFMError, match="use one of inversion"):
        run_attack(copy, "model-stealing")
    with pytest.raises(SecureFFMError, match="no option 'stpes'"):
        run_attack(copy, "inversion", stpes=3)


def test_membership_is_a_coin_flip_on_a_model_that_memorised_nothing(plaintext_run):
    """Adversary: anyone holding the released model; after one round of batch one the model
    has seen two of its 1,200 members, so no score tells members apart (AUC within 0.1 of
    0.5; its standard error at 400 + 400 images is about 0.02)."""
    found = run_attack(plaintext_run, "membership", count=400, draws=4)
    for score in ("loss", "averaged", "calibrated"):
        assert abs(found[f"{score}_auc"] - 0.5) < 0.1, (score, found)
    assert json.loads((plaintext_run / "attack-membership.json").read_text()) == found
    assert "0.50 is chance" in found["interpretation"] and "test images" in found["interpretation"]
    assert "applied no DP" in found["interpretation"]


def test_the_membership_command_prints_its_json_then_what_it_means(plaintext_run, capsys):
    """A user of ``secureffm audit --attack membership`` on a digits run: the results as JSON
    (parsable on their own), then one paragraph saying what AUC 0.5 and TPR at 1% FPR mean."""
    assert main(["audit", "--attack", "membership", "--attack-option", "count=60",
                 "--attack-option", "draws=2", str(plaintext_run)]) == 0
    out = capsys.readouterr().out
    data, words = out.split("\nmembership: ")
    found = json.loads(data)["membership"]
    assert found["members"] == 60 and "interpretation" not in found
    assert "0.50 is chance" in words and "At 1% FPR" in words


@pytest.mark.slow
def test_membership_scores_find_the_members_of_an_overfit_model():
    """Adversary: anyone holding a model trained for 400 full-batch steps on 32 digits: the
    averaged and calibrated scores separate its members from 32 held-out digits."""
    torch.manual_seed(0)
    members = load_digit_images("train").x[:32]
    others = load_digit_images("test").x[:32]
    model = UNet(1, 8, channel_mult=(1, 2), image_size=8)
    reference = UNet(1, 8, channel_mult=(1, 2), image_size=8)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(400):
        x0, t = torch.randn(members.shape, generator=g), torch.rand(len(members), generator=g)
        loss = flow_matching_loss(model, x0, members, t).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    inside = membership_scores(model, members, generator, 16, reference)
    generator.set_state(state)
    outside = membership_scores(model, others, generator, 16, reference)
    assert auc_and_tpr(inside["averaged"], outside["averaged"])[0] > 0.85
    assert auc_and_tpr(inside["calibrated"], outside["calibrated"])[0] > 0.7


def test_auc_and_tpr_of_separated_and_identical_scores():
    assert auc_and_tpr(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == (1.0, 1.0)
    assert auc_and_tpr(torch.zeros(5), torch.zeros(5))[0] == 0.5


def test_an_interpolation_inverts_exactly_at_its_own_t():
    """The step the server inverts (docs/fedwad.md): knowing t, the data come back."""
    rng = torch.Generator().manual_seed(0)
    data = Measure.uniform(torch.randn(50, 2, generator=rng).double().numpy())
    xi = Measure.uniform(torch.randn(50, 2, generator=rng).double().numpy() + 1)
    moved = interpolate(data, xi, 0.37)
    assert wasserstein(invert_interpolation(moved, xi, 0.37), data, 2) < 1e-6
    assert wasserstein(invert_interpolation(moved, xi, 0.6), data, 2) > 0.1


@pytest.mark.parametrize("protocol", ["plaintext", "fedwad-private"])
def test_fedwad_reconstruction_exact_in_the_clear_and_up_to_t_without_it(tmp_path, protocol):
    """Adversary: the FedWAD server, holding every measure it sent and got back (and, in the
    clear, each iteration's distance, which gives away t)."""
    run = FedWADRun(fedwad=FedWADConfig(iterations=2, support_size=100), data="gaussians",
                    samples=100, protocol=protocol, keep_payloads=True, progress=False,
                    out=str(tmp_path / protocol))
    run_fedwad(run)
    found = run_attack(tmp_path / protocol, "fedwad-reconstruction")
    assert found["measures"] == 4
    if protocol == "plaintext":
        assert found["t_recovered"] == 1 and found["w2_reconstruction"] < 1e-6
    else:
        # A guess t_g of the secret t leaves each point |t - t_g| / (1 - t_g) of its gap to xi
        # away: never exact, closer than xi, closer than mu itself only when t > 1/3 (t is
        # uniform on [0.2, 0.8] here, so that last order is not asserted).
        assert found["t_recovered"] == 0
        assert 0.01 < found["w2_reconstruction"] < found["w2_server"]
        assert found["w2_measure"] < found["w2_server"]


def test_secureffm_audit_attack_prints_each_attack_s_results(tmp_path, capsys):
    run_fedwad(FedWADRun(fedwad=FedWADConfig(iterations=1, support_size=50), samples=50,
                         keep_payloads=True, progress=False, out=str(tmp_path / "run")))
    assert main(["audit", "--attack", "fedwad-reconstruction", "--attack-option",
                 "t_guess=0.5", str(tmp_path / "run")]) == 0
    found = json.loads(capsys.readouterr().out)["fedwad-reconstruction"]
    assert found["measures"] == 2 and found["w2_reconstruction"] < 1e-6
    assert main(["audit", "--attack", "fedwad-reconstruction"]) == 2
    assert "needs the run folder" in capsys.readouterr().err
    assert main(["audit", "--attack", "fedwad-reconstruction", "--attack-option", "t_guess",
                 str(tmp_path / "run")]) == 2
    assert "write KEY=VALUE" in capsys.readouterr().err
