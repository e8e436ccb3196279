"""Pictures of a run: the data split with learned trajectories, and W2 against NFE."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

__all__ = ["plot_trajectories", "plot_w2_nfe"]

CLIENT_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def plot_trajectories(path: Path, shards: list[torch.Tensor], paths: torch.Tensor,
                      title: str, label: str | None = None,
                      target: torch.Tensor | None = None) -> None:
    """Left: each client's shard (or one sample named ``label``). Right: trajectories ``paths``
    [T, N, 2] from source to target, over ``target`` [M, 2] (a held-out target sample, in
    light grey) when given, so that a reader sees whether the ends land on it."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5), sharex=True, sharey=True)
    for i, shard in enumerate(shards):
        pts = shard[:2000].numpy()
        left.scatter(pts[:, 0], pts[:, 1], s=2, alpha=0.5, color=CLIENT_COLORS[i % 6],
                     label=label or (f"client-{i + 1}" if len(shards) > 1 else "pooled data"))
    left.set_title("data held by each party" if label is None else "data")
    left.legend(markerscale=5, loc="upper right")
    if target is not None:
        held_out = target[:2000].numpy()
        right.scatter(held_out[:, 0], held_out[:, 1], s=2, color="lightgrey",
                      label="held-out target sample")
    p = paths.numpy()
    right.plot(p[:, :, 0], p[:, :, 1], color="olive", alpha=0.15, linewidth=0.5)
    right.scatter(p[0, :, 0], p[0, :, 1], s=3, color="black", label="source x0")
    right.scatter(p[-1, :, 0], p[-1, :, 1], s=3, color="tab:blue", label="x1 (100 Euler steps)")
    right.set_title(title, fontsize="medium")
    # below the axes, where it hides no point (inside, it covered a source cluster)
    right.legend(markerscale=4, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=3,
                 frameon=False, fontsize="small")
    for ax in (left, right):
        ax.set_aspect("equal")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_w2_nfe(path: Path, curves: dict[str, dict[int, float]], title: str,
                errors: dict[str, dict[int, float]] | None = None,
                floor: tuple[float, int] | None = None) -> None:
    """W2 (y) against Euler NFE (x, log scale), one line per label; optional error bars;
    ``floor``: (the i.i.d. floor, its sample size), drawn as a dashed line."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        nfes = sorted(curve)
        err = [errors[label][n] for n in nfes] if errors else None
        ax.errorbar(nfes, [curve[n] for n in nfes], yerr=err, marker="o", capsize=3, label=label)
    if floor is not None:
        ax.axhline(floor[0], color="gray", linestyle="--",
                   label=f"i.i.d. floor {floor[0]:.3f}: a perfect model at {floor[1]:,} points")
    ax.set_xscale("log")
    ticks = sorted({n for curve in curves.values() for n in curve})
    ax.set_xticks(ticks, [str(n) for n in ticks])  # 1, 2, 4, not 2 x 10^0
    ax.minorticks_off()
    ax.set_xlabel("NFE (Euler steps)")
    ax.set_ylabel("W2 to held-out target")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
