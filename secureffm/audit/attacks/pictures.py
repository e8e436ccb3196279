"""Originals beside reconstructions: one labelled row of images per kind, as a PNG."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["write_rows"]


def write_rows(path: Path, rows: list[tuple[str, torch.Tensor]], title: str) -> None:
    """A PNG of one row per (label, images [N, C, H, W] in [-1, 1]) pair, rows of equal N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = max(len(images) for _, images in rows)
    fig, axes = plt.subplots(len(rows), count, figsize=(1.1 * count + 1.6, 1.2 * len(rows)),
                             squeeze=False)
    for r, (label, images) in enumerate(rows):
        for k in range(count):
            ax = axes[r][k]
            ax.set_xticks([])
            ax.set_yticks([])
            if k < len(images):
                pixels = ((images[k].float().clamp(-1, 1) + 1) / 2).permute(1, 2, 0)
                ax.imshow(pixels.squeeze(-1).numpy() if pixels.shape[-1] == 1 else
                          pixels.numpy(), cmap="gray", vmin=0, vmax=1)
            else:
                ax.axis("off")
        axes[r][0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
