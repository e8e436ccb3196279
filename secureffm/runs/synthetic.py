"""Synthetic data out of a finished FFM run: :func:`load` (``secureffm.load``), ``sample`` and
``export`` (docs/data.md, "Synthetic data out").

:func:`load` returns a :class:`TrainedModel` from a run folder (its checkpoint, read with
``weights_only=True``) or from an exported folder (safetensors and JSON: no pickle at all).
``sample(n)`` pushes public noise through the evaluated velocity field (its EMA) with Euler
steps and, on a tabular run, decodes the rows through the public schema; on an image run it
gives images [n, C, H, W] in [-1, 1], which :func:`write_samples` writes as PNG files. Sampling is
post-processing of the released model: a DP model's samples carry its guarantee, whatever
their number; :meth:`TrainedModel.privacy_notice` says what the run's privacy.json claims.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import config_from_dict
from ..data.files import write_table
from ..data.images import gaussian_images, image_shape
from ..data.schema import Schema
from ..data.silo import standard_normal
from ..errors import ConfigError
from ..metrics.sampling import integrate
from ..names import IMAGE_FOLDER
from .ffm import load_velocity
from .scaffold import load_checkpoint

__all__ = ["TrainedModel", "load", "export", "write_samples", "write_png_folder",
           "EXPORT_WEIGHTS", "EXPORT_CARD"]

EXPORT_WEIGHTS = "velocity.safetensors"
EXPORT_CARD = "model.json"
EXPORT_FORMAT = "secureffm-velocity/1"  # an MLP on R^dim, or the run's U-Net on image_shape


@dataclass
class TrainedModel:
    """A run's evaluated velocity field ``velocity`` on R^dim (``schema``: the public schema of
    a tabular run, else None: 2D points), its default Euler ``nfe``, the run's ``config``
    (a dict) and its ``privacy`` statement (privacy.json, a dict; empty when absent);
    ``image_shape`` (C, H, W) on an image run (dim = C * H * W), else None."""

    velocity: torch.nn.Module
    dim: int
    schema: Schema | None
    nfe: int
    config: dict
    privacy: dict
    image_shape: tuple[int, int, int] | None = None

    def sample_array(self, n: int, nfe: int | None = None, seed: int | None = None
                     ) -> np.ndarray:
        """[n, dim] float32 samples (an image run's: [n, C, H, W] in [-1, 1]): n public-noise
        points pushed through the field with ``nfe`` Euler steps (the run's default when None);
        ``seed`` makes them repeatable, else the noise comes from OS entropy."""
        if n < 1:
            raise ConfigError(f"n = {n}: ask for at least one sample")
        generator = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)
        device = next(self.velocity.parameters()).device
        if self.image_shape is not None:
            x0 = gaussian_images(self.image_shape).sample(n, generator)[0].to(device)
            with torch.no_grad():
                parts = [integrate(self.velocity, chunk, nfe or self.nfe)[0].cpu()
                         for chunk in x0.split(500)]
            return torch.cat(parts).clamp(-1, 1).numpy()
        x0 = standard_normal(self.dim).sample(n, generator)[0].to(device)
        parts = [integrate(self.velocity, chunk, nfe or self.nfe)[0].cpu()
                 for chunk in x0.split(10_000)]
        return torch.cat(parts).numpy()

    def sample(self, n: int, nfe: int | None = None, seed: int | None = None
               ) -> dict[str, np.ndarray]:
        """n synthetic rows as a table (column -> values): decoded through the schema on a
        tabular run, else columns ``x0``, ``x1``, ... of the points."""
        if self.image_shape is not None:
            raise ConfigError("an image run's samples are images, not a table: write them to a "
                              "folder (secureffm sample RUN --n N --out DIR) or .npy, or call "
                              "sample_array")
        x = self.sample_array(n, nfe, seed)
        if self.schema is not None:
            from ..data.encoding import decode

            return decode(x, self.schema)
        return {f"x{i}": x[:, i].astype(np.float64) for i in range(x.shape[1])}

    def privacy_notice(self) -> dict:
        """What holds of samples from this model, from the run's privacy.json."""
        p = self.privacy
        if not p:
            return {"guarantee": "unknown: the model came without the run's privacy.json"}
        dp = str(p.get("dp", ""))
        if p.get("insecure_deterministic") or "INSECURE" in str(p.get("secret_randomness")):
            holds = ("none: the run derived its secrets from the published seed "
                     "(--insecure-deterministic), so no privacy claim of it holds")
        elif dp.startswith("none") or not dp:
            holds = ("none: the run applied no DP, so these samples may reproduce training "
                     "rows; they are not private data")
        else:
            holds = (f"the run's DP guarantee ({dp}), by post-processing, for any number of "
                     "samples; what the run released besides the model (exclusions) is not "
                     "covered by it")
        spent = {client: facts.get("rdp", {}).get("total")
                 for client, facts in (p.get("clients") or {}).items()}
        return {"source": "secureffm sample", "run_protocol": p.get("protocol"),
                "unit": p.get("unit"), "holds": holds, "target_epsilon": p.get("target_epsilon"),
                "delta": p.get("delta"), "epsilon_spent_rdp": spent or None,
                "exclusions": p.get("exclusions", [])}


def load(run: str | Path, device: str = "cpu") -> TrainedModel:
    """The trained model of a finished FFM run folder, or of a folder :func:`export` wrote."""
    run = Path(run)
    privacy = _json(run / "privacy.json")
    if (run / EXPORT_CARD).is_file():
        return _load_export(run, privacy, device)
    checkpoint = load_checkpoint(run / "checkpoint.safetensors", device)
    config = checkpoint["config"]
    if config.get("method") not in ("vanilla", "lot", "got", "icfm", "otcfm"):
        raise ConfigError(f"{run} is not an FFM run: sample and export take FFM's 2D, tabular "
                          "and image runs")
    velocity = load_velocity(run, device)
    saved = config_from_dict(config)
    if saved.images:
        shape = ((saved.image_channels, saved.image_size, saved.image_size)
                 if saved.data == IMAGE_FOLDER else image_shape(saved.data, saved.image_size))
        return TrainedModel(velocity, int(np.prod(shape)), None, _nfe(config), config, privacy,
                            shape)
    schema = Schema.loads(checkpoint["schema"]) if "schema" in checkpoint else None
    dim = velocity.net[-1].out_features  # VelocityMLP's output: a velocity on R^dim
    return TrainedModel(velocity, dim, schema, _nfe(config), config, privacy)


def _nfe(config: dict) -> int:
    """The run's sampling steps: its largest evaluated NFE, at most 100."""
    return min(max(config_from_dict(config).nfe), 100)


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def export(run: str | Path, out: str | Path) -> Path:
    """Write the run's evaluated velocity field to ``out``: ``velocity.safetensors`` (its
    weights), ``model.json`` (architecture, NFE, config, the schema's TOML), ``privacy.json``
    (the run's); :func:`load` reads the folder back without unpickling anything."""
    from safetensors.torch import save_file

    model = load(run)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; export into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.velocity.state_dict().items()},
              out / EXPORT_WEIGHTS)
    card = {"format": EXPORT_FORMAT, "dim": model.dim, "nfe": model.nfe,
            "image_shape": None if model.image_shape is None else list(model.image_shape),
            "config": model.config,
            "schema": model.schema.to_toml() if model.schema is not None else None}
    (out / EXPORT_CARD).write_text(json.dumps(card, indent=2))
    (out / "privacy.json").write_text(json.dumps(model.privacy, indent=2))
    return out


def _load_export(folder: Path, privacy: dict, device: str) -> TrainedModel:
    from safetensors.torch import load_file

    from ..methods.ffm import FFMSettings, image_velocity
    from ..models.mlp import VelocityMLP

    card = _json(folder / EXPORT_CARD)
    if card.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"{folder / EXPORT_CARD} is not a secureffm export (format "
                          f"{card.get('format')!r}, not {EXPORT_FORMAT!r})")
    config = config_from_dict(card["config"])
    shape = tuple(card["image_shape"]) if card.get("image_shape") else None
    velocity = (image_velocity(FFMSettings.of(config), shape) if shape is not None
                else VelocityMLP(int(card["dim"]), config.hidden))
    velocity.load_state_dict(load_file(folder / EXPORT_WEIGHTS, device=device))
    schema = Schema.loads(card["schema"]) if card.get("schema") else None
    return TrainedModel(velocity.to(device).eval(), int(card["dim"]), schema, int(card["nfe"]),
                        card["config"], privacy, shape)


def write_samples(model: TrainedModel, n: int, out: str | Path, nfe: int | None = None,
                  seed: int | None = None) -> Path:
    """``n`` samples to ``out`` (.csv, .npy, .parquet; an image run's: a new folder of PNG
    files, or .npy [n, C, H, W]) and, beside it, ``<out>.privacy.json``: what holds of them
    (:meth:`TrainedModel.privacy_notice`). Returns the notice's path."""
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} exists; choose a new --out")
    if model.image_shape is None:
        write_table(model.sample(n, nfe, seed), out)
    elif out.suffix == ".npy":
        np.save(out, model.sample_array(n, nfe, seed))
    elif out.suffix:
        raise ConfigError(f"--out {out}: an image run's samples go to a new folder of PNG files "
                          "(a name without a suffix) or a .npy file")
    else:
        write_png_folder(model.sample_array(n, nfe, seed), out)
    notice = out.with_name(out.name + ".privacy.json")
    count = "rows" if model.image_shape is None else "images"
    notice.write_text(json.dumps({count: n, **model.privacy_notice()}, indent=2))
    return notice


def write_png_folder(images: np.ndarray, out: Path) -> None:
    """Images [n, C, H, W] in [-1, 1] as ``out``/sample-00000.png, ... (8-bit; C = 1:
    grayscale, C = 3: RGB) in a new folder."""
    from PIL import Image

    out.mkdir(parents=True)
    pixels = np.clip(np.rint((images + 1) * 127.5), 0, 255).astype(np.uint8)
    width = max(5, len(str(len(pixels) - 1)))
    for i, image in enumerate(pixels):
        array = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
        Image.fromarray(array).save(out / f"sample-{i:0{width}d}.png")
