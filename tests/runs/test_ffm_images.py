"""FFM on images end to end, through the same method, channel and protocols as 2D: a tiny U-Net
on 8 x 8 synthetic shapes, a few rounds each."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from secureffm.audit.claims import audit_claims
from secureffm.audit.threat import load_adversary
from secureffm.config import RunConfig
from secureffm.errors import ConfigError
from secureffm.methods import ffm as ffm_method
from secureffm.models.unet import UNet, make_unet
from secureffm.runs import run
from secureffm.runs.ffm import load_velocity
from secureffm.runs.scaffold import load_checkpoint

TINY = dict(data="shapes", image_size=8, unet_width=8, unet_mult=(1, 2), shard_size=64,
            batch_size=16, candidates=16, eval_samples=64, nfe=(2,), potential_every=2,
            rounds=4, progress=False, device="cpu", insecure_deterministic=True)


NOISE = 4.0  # large: the PRV accountant of privacy.json is quick (seconds at 1.0)


def _config(tmp_path, name="run", **changes) -> RunConfig:
    return RunConfig(**{**TINY, "out": str(tmp_path / name), **changes})


def _deliveries(out, kind):
    records = [json.loads(line) for line in (out / "messages.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == kind and r.get("sender", "").startswith("c")]


@pytest.mark.parametrize("method", ["vanilla", "lot", "got"])
def test_each_method_trains_the_unet_through_the_channel(tmp_path, method):
    config = _config(tmp_path, method=method, ctransform_steps=5, ctransform_lr=0.5,
                     sample_every=2)
    result = run(config)
    out, metrics = result.out, result.metrics
    params = sum(p.numel() for p in UNet(3, 8, channel_mult=(1, 2), image_size=8).parameters())
    assert metrics["parameters"]["velocity"] == params
    uploads = _deliveries(out, "gradient")
    assert len(uploads) == 2 * 4 and all(r["bytes"] >= 4 * params for r in uploads)
    assert (len(_deliveries(out, "dual_update")) == 4) == (method == "got")  # rounds 2 and 4
    fid = metrics["eval"]
    assert fid["features"]["comparable_with_published_fid"] is False
    assert np.isfinite(fid["fid"]["2"]) and fid["fid"]["2"] > fid["fid_floor"] >= 0
    assert metrics["images_per_second"] > 0 and metrics["precision"] == "fp32"
    grid = np.asarray(Image.open(out / "samples.png"))
    assert grid.shape[:2] == (7 * (8 * 9 + 1),) * 2  # 8 x 8 images of 8 px, 1 px gaps, 7x
    assert (out / "samples" / "round-0000002.png").is_file()
    assert load_velocity(out)(torch.zeros(1, 3, 8, 8), torch.zeros(1)).shape == (1, 3, 8, 8)


def test_resume_continues_from_the_checkpoint_and_keeps_the_ledger(tmp_path):
    first = run(_config(tmp_path, "first", method="vanilla", protocol="dp", rounds=4,
                        checkpoint_every=2, noise_multiplier=NOISE, lr_warmup=8))
    saved = load_checkpoint(first.out / "checkpoint.safetensors")
    assert saved["round"] == 4
    before = torch.cat([v.flatten() for v in saved["state"]["velocity"]["module"].values()])
    second = run(_config(tmp_path, "second", method="vanilla", protocol="dp", rounds=5,
                         noise_multiplier=NOISE, lr_warmup=8,
                         resume=str(first.out / "checkpoint.safetensors")))
    assert second.metrics["resumed_from"]["round"] == 4 and second.metrics["rounds"] == 5
    after = load_checkpoint(second.out / "checkpoint.safetensors")
    assert after["round"] == 5
    theta = torch.cat([v.flatten() for v in after["state"]["velocity"]["module"].values()])
    step = (theta - before).abs().max()
    assert 0 < step < 2e-2  # one Adam step (lr 1e-3) from the checkpoint, not a fresh start
    assert after["state"]["velocity"]["schedule"]["last_epoch"] == 5  # the warm-up went on
    fresh = torch.cat([p.detach().flatten() for p in
                       UNet(3, 8, channel_mult=(1, 2), image_size=8).parameters()])
    assert (fresh - before).abs().max() > 10 * step
    privacy = json.loads((second.out / "privacy.json").read_text())
    schedule = privacy["clients"]["client-1"]["schedule"]["gradient"]
    assert sum(steps for *_, steps in schedule) == 5  # 4 rounds before the resume + 1 after
    # the resumed run's log charges the 4 rounds before it too: the audit's epsilon is the whole
    report = audit_claims(second.out, load_adversary("honest-but-curious-server"))
    assert report.epsilon["client-1"]["total"] == pytest.approx(
        privacy["clients"]["client-1"]["rdp"]["total"], rel=1e-9)
    with pytest.raises(ConfigError, match="unet_width = 16 but the checkpoint's run used 8"):
        run(_config(tmp_path, "third", method="vanilla", protocol="dp", rounds=6,
                    noise_multiplier=NOISE, unet_width=16, lr_warmup=8,
                    resume=str(first.out / "checkpoint.safetensors")))


@pytest.mark.parametrize("layout", ["compact", "guided"])
def test_dp_sgd_on_the_unet_with_bf16_autocast(tmp_path, layout):
    """Opacus' ghost clipping on conv + GroupNorm + attention layers, under bf16 autocast (as
    on CUDA; here on the CPU), in both U-Net layouts."""
    result = run(_config(tmp_path, method="got", protocol="dp-secagg", noise_multiplier=NOISE,
                         precision="bf16", unet_attention=(4,), rounds=2, unet_layout=layout))
    params = make_unet(layout, 3, base_width=8, channel_mult=(1, 2), attention=(4,),
                       image_size=8)
    assert result.metrics["parameters"]["velocity"] == sum(p.numel() for p in params.parameters())
    assert result.metrics["precision"] == "bf16-autocast"
    masked = [r for kind in ("gradient", "gradient+dual_update")
              for r in _deliveries(result.out, kind) if r["phase"] == "masked_input"]
    # 2 clients x 2 rounds, masked by secure aggregation; round 2 (potential_every = 2) is
    # one aggregation of the gradient and the dual update
    assert sorted((r["round"], r["kind"]) for r in masked) == [
        (1, "gradient")] * 2 + [(2, "gradient+dual_update")] * 2
    assert np.isfinite(result.metrics["eval"]["fid"]["2"])


def test_layers_dp_sgd_cannot_clip_are_refused_by_name(tmp_path, monkeypatch):
    def with_batchnorm(settings, pair):
        model = UNet(3, 8, channel_mult=(1, 2), image_size=8)
        model.out[0] = torch.nn.BatchNorm2d(8)
        return model

    monkeypatch.setattr(ffm_method, "velocity_network", with_batchnorm)
    with pytest.raises(ConfigError, match=r"layer 'out\.0' \(BatchNorm2d\).*GroupNorm"):
        run(_config(tmp_path, method="vanilla", protocol="dp", noise_multiplier=NOISE))


def test_image_options_are_checked():
    with pytest.raises(ConfigError, match="method = 'icfm'"):
        RunConfig(data="shapes", method="icfm")
    with pytest.raises(ConfigError, match="28 is not divisible by 8"):
        RunConfig(data="mnist", unet_mult=(1, 2, 2, 2))
    with pytest.raises(ConfigError, match="resume = 'x.pt': continues a federated FFM run"):
        RunConfig(method="icfm", resume="x.pt")
    with pytest.raises(ConfigError, match="multiple of 8"):
        RunConfig(data="shapes", unet_width=12)
    with pytest.raises(ConfigError, match="unet_layout.*compact, guided"):
        RunConfig(data="shapes", unet_layout="paper")
    with pytest.raises(ConfigError, match="lr_warmup.*DCFM"):
        RunConfig(method="dcfm-a", data="modes2d", lr_warmup=10)
