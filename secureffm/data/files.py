"""Table files by suffix: the raw columns of a file, and a table written back.

``.csv``: a header row of column names, then one row per record (Python's csv module; cells are
read as strings). ``.npy``: a 2-D numeric array whose columns are named by the caller (the
schema's names, in order), or a structured array with named fields; never unpickled.
``.parquet``: pyarrow, the ``tabular`` extra (``pip install 'secureffm[tabular]'``).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import TableError

__all__ = ["SUFFIXES", "read_columns", "write_table"]

SUFFIXES = (".csv", ".npy", ".parquet")
PARQUET_HELP = "reading and writing .parquet needs pyarrow: pip install 'secureffm[tabular]'"


def read_columns(path: str | Path, names: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The raw columns of a data file by name, in the file's order (CSV cells as strings).

    A plain .npy array has no column names: ``names`` names its columns in order (default
    ``column_0``, ``column_1``, ...).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TableError(f"{str(path)!r}: unknown data file suffix {path.suffix!r}; use one of "
                         f"{', '.join(SUFFIXES)} (or a folder of images)")
    if not path.is_file():
        raise TableError(f"no data file at {str(path)!r}")
    if suffix == ".npy":
        return _read_npy(path, names)
    return _read_csv(path) if suffix == ".csv" else _read_parquet(path)


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise TableError(f"{str(path)!r} is empty: a CSV file needs a header row of column "
                         "names, then one row per record")
    header = [name.strip() for name in rows[0]]
    _no_duplicates(header, path)
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise TableError(f"{str(path)!r} line {line} has {len(row)} cells where the header "
                             f"has {len(header)}; every row needs one cell per column")
    cells = np.array(rows[1:], dtype=str).reshape(len(rows) - 1, len(header))
    return {name: cells[:, j] for j, name in enumerate(header)}


def _read_npy(path: Path, names: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise TableError(f"{str(path)!r} holds Python objects, which are never unpickled: save "
                         f"a numeric array (np.save(path, array.astype(float))) ({err})") from None
    if array.dtype.names:
        return {name: array[name] for name in array.dtype.names}
    if array.ndim != 2:
        raise TableError(f"{str(path)!r} holds an array of shape {array.shape}; a table is 2-D, "
                         "[rows, columns]")
    names = names or tuple(f"column_{j}" for j in range(array.shape[1]))
    if array.shape[1] != len(names):
        raise TableError(f"{str(path)!r} has {array.shape[1]} columns where the schema has "
                         f"{len(names)} ({', '.join(names)}); a .npy file's columns are the "
                         "schema's, in order")
    return {name: array[:, j] for j, name in enumerate(names)}


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise TableError(PARQUET_HELP) from None
    return pyarrow


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    pyarrow = _pyarrow()
    table = pyarrow.parquet.read_table(path)
    _no_duplicates(table.column_names, path)
    return {name: table.column(name).to_numpy(zero_copy_only=False)
            for name in table.column_names}


def _no_duplicates(names: list[str], path: Path) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise TableError(f"{str(path)!r} names column {name!r} twice; rename one")
        seen.add(name)


def write_table(table: Mapping[str, np.ndarray], path: str | Path) -> None:
    """Write a :data:`.Table` as .csv (header row), .npy (a structured array with named fields,
    strings as unicode) or .parquet, by suffix; read back with :func:`read_columns`."""
    path = Path(path)
    suffix = path.suffix.lower()
    names = list(table)
    if suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(names)
            writer.writerows(zip(*(_cells(table[n]) for n in names), strict=True))
    elif suffix == ".npy":
        arrays = [np.asarray(table[n]) for n in names]
        arrays = [a.astype(str) if a.dtype == object else a for a in arrays]
        out = np.empty(len(arrays[0]), dtype=[(n, a.dtype) for n, a in zip(names, arrays,
                                                                            strict=True)])
        for name, array in zip(names, arrays, strict=True):
            out[name] = array
        np.save(path, out, allow_pickle=False)
    elif suffix == ".parquet":
        pyarrow = _pyarrow()
        pyarrow.parquet.write_table(
            pyarrow.table({n: np.asarray(table[n]).tolist() for n in names}), path)
    else:
        raise TableError(f"cannot write {str(path)!r}: use one of {', '.join(SUFFIXES)}")


def _cells(values: np.ndarray) -> list[str]:
    """CSV cells: floats as their shortest exact repr, others as str."""
    return [repr(float(v)) if isinstance(v, float | np.floating) else str(v) for v in values]
