"""An attribute classifier for generated images: one head per attribute, shared features.

It plays two roles in the DCFM benchmarks. Its penultimate layer is the feature extractor of the
Frechet distance (pytorch-fid's Inception weights cannot be downloaded here, and they are made
for 299 x 299 natural images, not 8 x 8 digits); its heads give the compositional accuracy, the
fraction of generated images whose every predicted attribute equals the requested one.
"""

from __future__ import annotations

import torch
from torch import nn

from ..progress import progress_bar

__all__ = ["AttributeClassifier", "train_attribute_classifier", "predict", "classifier_features",
           "attribute_accuracy", "compositional_accuracy"]


class AttributeClassifier(nn.Module):
    """Small CNN on images [N, C, H, W]: two 3 x 3 convolutions (the second with stride 2), a
    ``feature_dim`` ReLU layer (the features), and one linear head per attribute."""

    def __init__(self, cardinalities: tuple[int, ...],
                 image_shape: tuple[int, int, int] = (3, 8, 8), width: int = 32,
                 feature_dim: int = 64):
        super().__init__()
        channels, height, width_px = image_shape
        flat = 2 * width * ((height + 1) // 2) * ((width_px + 1) // 2)
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(flat, feature_dim), nn.ReLU(),
        )
        self.heads = nn.ModuleList(nn.Linear(feature_dim, k) for k in cardinalities)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate-layer features [N, feature_dim]."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits per attribute, each [N, cardinality_j]."""
        h = self.body(x)
        return [head(h) for head in self.heads]


def train_attribute_classifier(
    x: torch.Tensor, labels: torch.Tensor, cardinalities: tuple[int, ...], epochs: int = 4,
    batch_size: int = 128, lr: float = 2e-3, seed: int = 0, progress: bool = True,
    device: torch.device | str = "cpu",
) -> AttributeClassifier:
    """Train on images x [N, C, H, W] with labels [N, k] (sum of per-head cross-entropies, Adam)
    on ``device`` (the model stays there). Seeded; leaves torch's global generator untouched.
    Returns the model in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AttributeClassifier(cardinalities, tuple(x.shape[1:])).to(device)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = (len(x) + batch_size - 1) // batch_size
    with progress_bar(total=epochs * batches, desc="attribute classifier",
                      disable=not progress) as bar:
        for _ in range(epochs):
            for index in torch.randperm(len(x), generator=generator).split(batch_size):
                batch, wanted = x[index].to(device), labels[index].to(device)
                loss = sum(nn.functional.cross_entropy(out, wanted[:, j])
                           for j, out in enumerate(model(batch)))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                bar.update()
    return model.eval()


@torch.no_grad()
def predict(model: AttributeClassifier, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Predicted attributes [N, k] (int64)."""
    parts = [torch.stack([out.argmax(1) for out in model(chunk)], dim=1)
             for chunk in x.split(batch_size)]
    return torch.cat(parts)


@torch.no_grad()
def classifier_features(model: AttributeClassifier, x: torch.Tensor,
                        batch_size: int = 1024) -> torch.Tensor:
    """Features [N, feature_dim] for the Frechet distance."""
    return torch.cat([model.features(chunk) for chunk in x.split(batch_size)])


def attribute_accuracy(model: AttributeClassifier, x: torch.Tensor,
                       labels: torch.Tensor) -> list[float]:
    """Accuracy of each head on images x with labels [N, k]."""
    return (predict(model, x) == labels).double().mean(0).tolist()


def compositional_accuracy(model: AttributeClassifier, x: torch.Tensor,
                           labels: torch.Tensor) -> float:
    """Fraction of images x whose predicted attributes all equal the requested labels [N, k]
    (or [k], one combination for every image)."""
    return float((predict(model, x) == labels).all(dim=1).double().mean())
