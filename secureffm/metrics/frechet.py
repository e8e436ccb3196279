"""Frechet distance between feature sets (the FID formula, on any feature extractor).

.. math::
    d^2 = |\\mu_1 - \\mu_2|^2
          + \\operatorname{tr}(\\Sigma_1 + \\Sigma_2 - 2 (\\Sigma_1 \\Sigma_2)^{1/2})

computed as pytorch-fid does (Heusel et al. 2017): float64, ``scipy.linalg.sqrtm`` of the
product, an ``eps`` ridge when the square root is not finite, and the imaginary residue of the
square root dropped when it is numerically zero. The value is the squared W2 distance between
the two Gaussians with the features' means and covariances.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from ..errors import SolverError

__all__ = ["FeatureStats", "feature_stats", "frechet_distance", "frechet_distance_features"]


@dataclass(frozen=True)
class FeatureStats:
    """Mean [d] and covariance [d, d] (unbiased, float64) of a feature set."""

    mean: np.ndarray
    cov: np.ndarray


def feature_stats(features: torch.Tensor) -> FeatureStats:
    """Statistics of features [N, d], N >= 2."""
    array = features.detach().double().cpu().numpy()
    return FeatureStats(array.mean(axis=0), np.atleast_2d(np.cov(array, rowvar=False)))


def frechet_distance(a: FeatureStats, b: FeatureStats, eps: float = 1e-6) -> float:
    """Frechet distance between N(a.mean, a.cov) and N(b.mean, b.cov) (squared units of the
    features). Raises SolverError when the matrix square root keeps an imaginary diagonal."""
    diff = a.mean - b.mean
    root = scipy.linalg.sqrtm(a.cov @ b.cov)
    if not np.isfinite(root).all():
        ridge = np.eye(len(a.cov)) * eps
        root = scipy.linalg.sqrtm((a.cov + ridge) @ (b.cov + ridge))
    if np.iscomplexobj(root):
        if not np.allclose(np.diagonal(root).imag, 0, atol=1e-3):
            raise SolverError(
                f"the covariance square root has an imaginary part of "
                f"{np.abs(root.imag).max():.2g}; use more samples than feature dimensions")
        root = root.real
    return float(diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2 * np.trace(root))


def frechet_distance_features(x: torch.Tensor, y: torch.Tensor) -> float:
    """Frechet distance between feature sets x [N, d] and y [M, d]."""
    return frechet_distance(feature_stats(x), feature_stats(y))
