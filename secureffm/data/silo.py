"""A silo's own table (or image folder) as a client holds it, and the public pair its run
trains on.

A tabular run's target is the clients' data: no party can sample it, and nothing is generated
from the public seed. Each client reads its own file (:func:`load_silo`), checks it against the
public schema, holds out a public fraction of its rows for its own evaluation and encodes the
rest through the schema (docs/data.md). The source is public noise, a standard normal in the
schema's dimension, which every party samples.

An image-folder run is the same with a folder of PNG/JPEG files per client
(:func:`load_image_silo`): the public shape (C, H, W) comes from the run's config, never from a
client's file, and a client refuses its own folder when an image differs from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..names import CLIENT_DATA
from .encoding import encode
from .images import ImagePair, ImageSet, gaussian_images
from .pairs import DataPair
from .schema import Schema
from .tables import CheckReport, Table, load_image_folder, load_table
from .toy2d import Distribution, normals

__all__ = ["Silo", "load_silo", "standard_normal", "table_pair", "CLIENT_DATA", "holdout_split",
           "ImageSilo", "load_image_silo", "folder_pair"]


def standard_normal(dim: int) -> Distribution:
    """N(0, I_dim) by Box-Muller over 2 * ceil(dim / 2) uniforms (label 0 for every point)."""
    pairs = math.ceil(dim / 2)

    def transform(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = normals(u[:, :pairs], u[:, pairs:]).reshape(len(u), 2 * pairs)[:, :dim]
        return z, torch.zeros(len(u), dtype=torch.long)

    return Distribution(f"gaussian{dim}", dim, 2 * pairs, transform, (0,))


def _held_by_clients(dim: int) -> Distribution:
    def refuse(u: torch.Tensor):
        raise DataError("the target of a tabular run is the clients' own data: no party can "
                        "sample it; evaluation runs on each client's held-out rows")

    return Distribution("client data", dim, 1, refuse, (0,))


def table_pair(schema: Schema) -> DataPair:
    """Public noise N(0, I) -> the clients' encoded rows, in the schema's dimension."""
    return DataPair(standard_normal(schema.dim), _held_by_clients(schema.dim))


def holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, holdout) of a client's ``n`` rows, sorted, holding out round(fraction n)
    rows drawn with the public ``seed`` (the rows are the client's own; the split hides
    nothing). Refuses a split that leaves either part empty."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"holdout fraction {fraction} must lie strictly between 0 and 1 "
                        "(e.g. --holdout 0.2)")
    held = round(fraction * n)
    if not 1 <= held <= n - 1:
        raise DataError(f"a holdout fraction of {fraction} of {n} rows leaves "
                        f"{held} held-out and {n - held} training rows; both need at least one: "
                        "change --holdout or bring more rows")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


@dataclass
class Silo:
    """One client's own data: ``train`` and ``holdout`` tables, the encoded training rows ``x``
    [N, schema.dim] float32, and ``report`` (values clipped into the public bounds). All of it
    stays with the client; only evaluation numbers leave."""

    path: Path
    train: Table
    holdout: Table
    x: torch.Tensor
    report: CheckReport


def load_silo(path: str | Path, schema: Schema, holdout: float, seed: int,
              min_rows: int = 1) -> Silo:
    """The client's file at ``path``, read and checked by the client itself
    (:func:`~secureffm.data.tables.load_table`), split into training and held-out rows."""
    path = Path(path)
    table, report = load_table(path, schema)
    train_rows, held_rows = holdout_split(report.rows, holdout, seed)
    if len(train_rows) < min_rows:
        raise DataError(f"{path} keeps {len(train_rows)} training rows after holding out "
                        f"{holdout:g} of {report.rows}, fewer than the batch size {min_rows}; "
                        "lower --batch-size or --holdout")
    if holdout and len(held_rows) < 2:
        raise DataError(f"{path} holds out {len(held_rows)} row(s) at holdout = {holdout:g}: "
                        "evaluation needs at least 2; raise --holdout")
    train = {name: values[train_rows] for name, values in table.items()}
    held = {name: values[held_rows] for name, values in table.items()}
    return Silo(path, train, held, torch.from_numpy(encode(train, schema)), report)


def folder_pair(shape: tuple[int, int, int]) -> ImagePair:
    """Public noise N(0, I) on images of the public ``shape`` (C, H, W) -> the clients' own
    images: the server holds none, so its train and test sets are empty."""
    empty = ImageSet(torch.zeros(0, *shape), torch.zeros(0, dtype=torch.long))
    return ImagePair("image-folder", gaussian_images(shape), empty, empty, 1)


@dataclass
class ImageSilo:
    """One client's own image folder: training images ``x`` [N, C, H, W] and ``holdout``
    [M, C, H, W] in [-1, 1], their labels (``train_labels`` [N], None without labels) and the
    label names ``classes``. All of it stays with the client; only evaluation numbers leave."""

    path: Path
    x: torch.Tensor
    holdout: torch.Tensor
    train_labels: torch.Tensor | None
    classes: tuple[str, ...]


def load_image_silo(path: str | Path, shape: tuple[int, int, int], labels: str,
                    holdout: float, seed: int, min_rows: int = 1) -> ImageSilo:
    """The client's image folder at ``path`` (:func:`~.tables.load_image_folder`; ``labels``
    "none", "names" or "csv": its ``labels.csv``), checked against the public ``shape``
    (C, H, W) and split into training and held-out images by the public ``holdout`` and
    ``seed``."""
    path = Path(path)
    folder = load_image_folder(path, labels_from_names=labels == "names",
                               labels_csv=path / "labels.csv" if labels == "csv" else None)
    if tuple(folder.x.shape[1:]) != tuple(shape):
        raise DataError(f"image {folder.files[0]!r} of {str(path)!r} has shape "
                        f"{tuple(folder.x.shape[1:])} (C, H, W), not the run's public "
                        f"{tuple(shape)}: resize the folder's images, or set --image-size and "
                        "--image-channels for every client")
    train, held = holdout_split(len(folder.x), holdout, seed)
    if len(train) < min_rows:
        raise DataError(f"{path} keeps {len(train)} training images after holding out "
                        f"{holdout:g} of {len(folder.x)}, fewer than the batch size {min_rows}; "
                        "lower --batch-size or --holdout")
    if len(held) < 2:
        raise DataError(f"{path} holds out {len(held)} image(s) at holdout = {holdout:g}: "
                        "evaluation needs at least 2; raise --holdout")
    index = torch.from_numpy(train)
    return ImageSilo(path, folder.x[index], folder.x[torch.from_numpy(held)],
                     None if folder.labels is None else folder.labels[index], folder.classes)
