"""FID of generated images: pytorch-fid's Inception features when they can run, else the
Frechet distance on the features of a classifier trained here, labelled as not comparable with
published FID.

pytorch-fid is an optional extra: it needs torchvision, which does not import next to this
machine's CPU torch (``operator torchvision::nms does not exist``), and Inception weights at a
local path (``--fid-weights``: pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth``; nothing
is downloaded). The fallback trains :class:`~.attribute_classifier.AttributeClassifier` (one
head: the data set's classes) on the training images and takes its penultimate layer, as the
colored-digits benchmarks do. Both go through :func:`~.frechet.frechet_distance`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .attribute_classifier import (
    AttributeClassifier,
    classifier_features,
    train_attribute_classifier,
)
from .frechet import feature_stats, frechet_distance

__all__ = ["ImageFeatures", "image_features", "inception_features", "pixel_features", "fid"]

NOT_COMPARABLE = ("Frechet distance on the features of a classifier trained on the data set's "
                  "training images, not Inception-v3: NOT comparable with published FID values")


@dataclass(frozen=True)
class ImageFeatures:
    """A feature extractor for the Frechet distance: ``extract`` maps images [N, C, H, W] in
    [-1, 1] to features [N, d]; ``kind`` "inception" or "classifier"; ``comparable``: whether
    values compare with published FID; ``note`` says what was used and why."""

    kind: str
    comparable: bool
    note: str
    extract: Callable[[torch.Tensor], torch.Tensor]

    def describe(self) -> dict:
        return {"kind": self.kind, "comparable_with_published_fid": self.comparable,
                "note": self.note}


def inception_features(weights: str | Path, device: torch.device) -> ImageFeatures:
    """pytorch-fid's InceptionV3 pool features (2048-d) with its FID weights read from the
    local file ``weights`` (``torch.load(weights_only=True)``; never downloaded). Raises
    ImportError when pytorch-fid or torchvision cannot be imported."""
    import pytorch_fid.inception as inception  # optional extra; may fail to import

    path = Path(weights)
    if not path.is_file():
        raise ConfigError(f"fid_weights = {str(path)!r} is not a file: give pytorch-fid's "
                          "pt_inception-2015-12-05-6726825d.pth at a local path")
    original = inception.load_state_dict_from_url
    inception.load_state_dict_from_url = (
        lambda *args, **kwargs: torch.load(path, map_location="cpu", weights_only=True))
    try:
        model = inception.InceptionV3([inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]],
                                      normalize_input=False).to(device).eval()
    finally:
        inception.load_state_dict_from_url = original

    @torch.no_grad()
    def extract(x: torch.Tensor) -> torch.Tensor:
        parts = []
        for chunk in x.split(200):
            chunk = chunk.to(device)
            if chunk.shape[1] == 1:
                chunk = chunk.expand(-1, 3, -1, -1)
            parts.append(model(chunk)[0].flatten(1).cpu())
        return torch.cat(parts)

    return ImageFeatures("inception", True, f"pytorch-fid InceptionV3, weights {path}", extract)


def image_features(train: torch.Tensor, labels: torch.Tensor, classes: int,
                   fid_weights: str = "", device: torch.device | str = "cpu", seed: int = 0,
                   epochs: int = 4, progress: bool = False,
                   classifier: AttributeClassifier | None = None) -> ImageFeatures:
    """The FID feature extractor: Inception when ``fid_weights`` is given and pytorch-fid
    imports, else ``classifier``'s features or, without one, those of a classifier of
    ``classes`` classes trained (seeded) on images ``train`` [N, C, H, W] with ``labels`` [N];
    the note says why Inception was not used."""
    why = "no --fid-weights given"
    if fid_weights:
        try:
            return inception_features(fid_weights, torch.device(device))
        except (ImportError, RuntimeError, OSError) as err:  # torchvision's import fails here
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            why = f"pytorch-fid could not run ({type(err).__name__}: {first})"
    model = classifier or train_attribute_classifier(
        train, labels[:, None], (classes,), epochs=epochs, seed=seed, progress=progress,
        device=device)
    return ImageFeatures("classifier", False, f"{NOT_COMPARABLE}; {why}",
                         lambda x: classifier_features(model, x.to(device)).cpu())


def pixel_features(why: str) -> ImageFeatures:
    """The Frechet distance on raw pixels (each image flattened to C*H*W values), for images
    without labels to train a classifier on; ``why`` says why it was used."""
    return ImageFeatures("pixels", False, "Frechet distance on raw pixels, not Inception-v3: NOT "
                         f"comparable with published FID values; {why}",
                         lambda x: x.flatten(1))


def fid(features: ImageFeatures, generated: torch.Tensor, reference: torch.Tensor) -> float:
    """Frechet distance between the features of ``generated`` and ``reference`` images."""
    return frechet_distance(feature_stats(features.extract(generated)),
                            feature_stats(features.extract(reference)))
