"""A client's own data file, read by the client and checked against the public schema.

:func:`load_table` reads the file (:mod:`.files`: CSV, .npy, .parquet) and :func:`check_table`
turns the raw columns into a :data:`Table` or refuses by name; values outside a numeric column's
public bounds are clipped and counted in the client's own :class:`CheckReport`, which is not sent
anywhere.

A :data:`Table` maps each schema column, in schema order, to a 1-D array of N values: float64 for
continuous, int64 for integer and binary (0 or 1), and the schema's category values (an object
array) for categorical columns.

:func:`load_image_folder` reads a folder of PNG/JPEG files into [N, C, H, W] float32 in [-1, 1].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import TableError
from .files import read_columns
from .schema import Schema

__all__ = ["Table", "CheckReport", "IMAGE_SUFFIXES", "check_table", "load_table", "ImageFolder",
           "load_image_folder"]

Table = dict[str, np.ndarray]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass
class CheckReport:
    """What :func:`check_table` did to a client's rows: ``rows`` read, and per numeric column
    the values clipped into its public bounds (below ``low``, above ``high``). The client's own:
    these counts describe its data and are not released."""

    rows: int
    clipped_low: dict[str, int] = field(default_factory=dict)
    clipped_high: dict[str, int] = field(default_factory=dict)

    @property
    def clipped(self) -> int:
        """Values clipped in all columns."""
        return sum(self.clipped_low.values()) + sum(self.clipped_high.values())


def check_table(columns: Mapping[str, np.ndarray], schema: Schema,
                source: str = "the table") -> tuple[Table, CheckReport]:
    """Check raw columns against the schema: the :data:`Table` and the client's report.

    Refuses by name (column and 1-based row): a missing or extra column, an empty or non-numeric
    value in a numeric or binary column, NaN or infinity, a fractional value in an integer
    column, a binary value other than 0 or 1, a category outside the schema's list. Clips numeric
    values into the public bounds and counts them in the report.
    """
    missing = [n for n in schema.names if n not in columns]
    extra = [n for n in columns if n not in schema.names]
    if missing:
        raise TableError(f"{source} lacks the schema's column(s) {', '.join(map(repr, missing))}; "
                         "every client's file holds every column of the schema")
    if extra:
        raise TableError(f"{source} has column(s) {', '.join(map(repr, extra))} that the schema "
                         "does not list; drop them from the file or add them to the schema")
    lengths = {len(columns[n]) for n in schema.names}
    if len(lengths) != 1:
        raise TableError(f"{source}: its columns have different lengths {sorted(lengths)}")
    report, table = CheckReport(rows=lengths.pop()), {}
    if report.rows == 0:
        raise TableError(f"{source} holds no rows")
    for column in schema.columns:
        raw, where = np.asarray(columns[column.name]), f"{source}: column {column.name!r}"
        if column.type == "categorical":
            table[column.name] = _categorical(raw, column.categories, where)
            continue
        values = _numbers(raw, where)
        if column.type == "binary":
            bad = np.flatnonzero((values != 0) & (values != 1))
            if bad.size:
                raise TableError(f"{where} row {bad[0] + 1} holds {_shown(raw[bad[0]])}; a binary "
                                 "column holds only 0 and 1")
            table[column.name] = values.astype(np.int64)
            continue
        if column.type == "integer":
            bad = np.flatnonzero(values != np.round(values))
            if bad.size:
                raise TableError(f"{where} row {bad[0] + 1} holds {_shown(raw[bad[0]])}; an "
                                 "integer column holds whole numbers (or make it continuous)")
        report.clipped_low[column.name] = int(np.sum(values < column.low))
        report.clipped_high[column.name] = int(np.sum(values > column.high))
        values = np.clip(values, column.low, column.high)
        table[column.name] = values.astype(np.int64 if column.type == "integer" else np.float64)
    return table, report


def _numbers(raw: np.ndarray, where: str) -> np.ndarray:
    """float64 values of a raw column, or a refusal naming the first bad row."""
    try:
        values = raw.astype(np.float64)
    except (TypeError, ValueError):
        for row, value in enumerate(raw, start=1):
            try:
                float(value)
            except (TypeError, ValueError):
                what = "is empty" if value is None or str(value).strip() == "" else \
                    f"holds {_shown(value)}, which is not a number"
                raise TableError(f"{where} row {row} {what}; fill it with a number or drop "
                                 "the row") from None
        raise
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        kind = "NaN" if np.isnan(values[bad[0]]) else "an infinite value"
        raise TableError(f"{where} row {bad[0] + 1} holds {kind}; fill or drop the rows with "
                         "missing values before training")
    return values


def _shown(value) -> str:
    """repr of a cell as the user wrote it (numpy scalars as Python values)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _categorical(raw: np.ndarray, categories: tuple, where: str) -> np.ndarray:
    """The schema's category values of a raw column (numbers compared as numbers)."""
    if isinstance(categories[0], str):
        keys = np.array(["" if v is None else str(v).strip() for v in raw], dtype=object)
        empty = np.flatnonzero(keys == "")
        if empty.size:
            raise TableError(f"{where} row {empty[0] + 1} is empty; fill it with one of its "
                             f"categories {list(categories)} or drop the row")
        wanted = categories
    else:
        keys, wanted = _numbers(raw, where), [float(c) for c in categories]
    lookup = {key: index for index, key in enumerate(wanted)}
    unique, inverse = np.unique(keys, return_inverse=True)
    codes = np.empty(len(unique), dtype=np.int64)
    for j, key in enumerate(unique):
        if key not in lookup:
            row = int(np.flatnonzero(inverse == j)[0]) + 1
            raise TableError(f"{where} row {row} holds {_shown(raw[row - 1])}, which is not one of "
                             f"its categories {list(categories)}; add it to the schema or drop "
                             "the row")
        codes[j] = lookup[key]
    values = np.empty(len(categories), dtype=object)
    values[:] = categories
    return values[codes[inverse.reshape(-1)]]


def load_table(path: str | Path, schema: Schema) -> tuple[Table, CheckReport]:
    """Read a client's data file and check it against the schema (:func:`check_table`)."""
    return check_table(read_columns(path, schema.names), schema, source=repr(str(path)))


@dataclass(frozen=True)
class ImageFolder:
    """Images ``x`` [N, C, H, W] float32 in [-1, 1] (pixel byte p -> p / 127.5 - 1; C = 1 for
    grayscale files, 3 otherwise), ``labels`` [N] int64 indices into ``classes`` (None when the
    folder has none), and each image's file name."""

    x: torch.Tensor
    labels: torch.Tensor | None
    classes: tuple[str, ...]
    files: tuple[str, ...]


def load_image_folder(folder: str | Path, labels_from_names: bool = False,
                      labels_csv: str | Path | None = None) -> ImageFolder:
    """Read every PNG/JPEG file of ``folder`` (sorted by name); all must share one size and
    channel count. Labels, optional: ``labels_from_names`` takes each file name's prefix before
    its first ``_`` (``cat_001.png`` -> ``cat``); ``labels_csv`` is a CSV with columns
    ``file,label`` naming every image. ``classes`` is the sorted set of labels (numerically when
    all are whole numbers)."""
    from PIL import Image

    folder = Path(folder)
    if not folder.is_dir():
        raise TableError(f"no image folder at {str(folder)!r}")
    if labels_from_names and labels_csv is not None:
        raise TableError("give labels from file names or a labels CSV, not both")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise TableError(f"{str(folder)!r} holds no image file ({', '.join(IMAGE_SUFFIXES)})")
    pixels = []
    for path in files:
        with Image.open(path) as image:
            image = image if image.mode == "L" else image.convert("RGB")
            array = np.asarray(image, dtype=np.uint8)
        array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
        if pixels and array.shape != pixels[0].shape:
            raise TableError(f"image {path.name!r} has shape {array.shape} (C, H, W) where "
                             f"{files[0].name!r} has {pixels[0].shape}; resize the images to "
                             "one size and one color mode")
        pixels.append(array)
    x = torch.from_numpy(np.stack(pixels).astype(np.float32) / 127.5 - 1.0)
    names = tuple(p.name for p in files)
    if labels_from_names:
        raw = []
        for name in names:
            if "_" not in name:
                raise TableError(f"image {name!r} has no label prefix; name it "
                                 "<label>_<anything>.png")
            raw.append(name.split("_", 1)[0])
    elif labels_csv is not None:
        raw = _labels_of(Path(labels_csv), names)
    else:
        return ImageFolder(x, None, (), names)
    whole = all(label.lstrip("-").isdigit() for label in raw)
    classes = tuple(sorted(set(raw), key=int if whole else str))
    index = {label: i for i, label in enumerate(classes)}
    return ImageFolder(x, torch.tensor([index[r] for r in raw], dtype=torch.int64), classes, names)


def _labels_of(path: Path, names: tuple[str, ...]) -> list[str]:
    """Each image's label from a ``file,label`` CSV that names every image once."""
    columns = read_columns(path)
    if set(columns) != {"file", "label"}:
        raise TableError(f"labels CSV {str(path)!r} has columns {list(columns)}; it needs "
                         "exactly file,label")
    by_file = {}
    for file, label in zip(columns["file"], columns["label"], strict=True):
        if file in by_file:
            raise TableError(f"labels CSV {str(path)!r} names {_shown(file)} twice")
        by_file[str(file)] = str(label).strip()
    unknown = sorted(set(by_file) - set(names))
    if unknown:
        raise TableError(f"labels CSV {str(path)!r} names {unknown[0]!r}, which is not an "
                         "image of the folder")
    for name in names:
        if name not in by_file:
            raise TableError(f"image {name!r} has no label in {str(path)!r}; add a row "
                             f"{name},<label>")
    return [by_file[name] for name in names]
