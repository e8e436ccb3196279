"""Real tables as three silos' files (issue 38, item 5): the data a tabular run starts from.

    .venv/bin/python experiments/tabular.py --out data/tabular

Writes, for each of scikit-learn's bundled tables (no download), ``OUT/<name>/silo-{1,2,3}.csv``
and ``OUT/<name>/schema.toml``:

- ``breast-cancer`` (569 rows x 30 features, plus the binary column ``benign``, scikit-learn's
  target: 1 benign, 0 malignant), split by the tertiles of ``mean_radius``;
- ``wine`` (178 rows x 13 features, plus the categorical column ``cultivar``: class_0, class_1,
  class_2), split by the tertiles of ``alcohol``.

The split is non-IID on purpose: silo 1 holds the rows below the first tertile of the split
column, silo 2 the middle third, silo 3 the rest, so each silo sees a different part of the
joint law (and a different class mix). Column names are scikit-learn's with every run of
non-alphanumeric characters replaced by ``_``.

Bounds: each numeric column's [low, high] is the FULL public table's min and max rounded outward
to a step of one tenth of the column's order of magnitude (``_bounds``). These data sets are
public, so bounds taken from them disclose nothing; for a silo's private table, bounds taken
from its data are a disclosure if the schema is published (docs/data.md). Columns whose values
are all whole numbers (wine's magnesium and proline) are integer columns.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer, load_wine

from secureffm.data.files import write_table
from secureffm.data.schema import Schema

SILOS = 3
DATASETS = {
    # name: (loader, target column, its type, split column)
    "breast-cancer": (load_breast_cancer, "benign", "binary", "mean_radius"),
    "wine": (load_wine, "cultivar", "categorical", "alcohol"),
}


def _name(feature: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", feature).strip("_")


def _bounds(values: np.ndarray) -> tuple[float, float]:
    """[min, max] of a public column rounded outward to a step of 10^(floor(log10(range)) - 1)."""
    low, high = float(values.min()), float(values.max())
    step = 10.0 ** (math.floor(math.log10(high - low)) - 1)
    return (round(math.floor(low / step) * step, 12), round(math.ceil(high / step) * step, 12))


def table_and_schema(name: str) -> tuple[dict[str, np.ndarray], Schema]:
    """The whole public table (a Table: one array per column) and its schema."""
    loader, target, kind, _ = DATASETS[name]
    data = loader()
    table, columns = {}, []
    for j, feature in enumerate(data.feature_names):
        values, column = data.data[:, j], _name(feature)
        low, high = _bounds(values)
        if np.all(values == np.round(values)):
            table[column] = values.astype(np.int64)
            columns.append({"name": column, "type": "integer", "low": math.floor(low),
                            "high": math.ceil(high)})
        else:
            table[column] = values
            columns.append({"name": column, "type": "continuous", "low": low, "high": high})
    if kind == "binary":
        table[target] = data.target.astype(np.int64)
        columns.append({"name": target, "type": "binary"})
    else:
        categories = [str(c) for c in data.target_names]
        table[target] = np.array(categories, dtype=object)[data.target]
        columns.append({"name": target, "type": "categorical", "categories": categories})
    return table, Schema.from_dict({"columns": columns}, source=f"experiments/tabular.py {name}")


def silo_of_rows(values: np.ndarray, silos: int = SILOS) -> np.ndarray:
    """Each row's silo (0 .. silos - 1) by the quantiles of ``values``: silo k holds the rows
    between the k-th and (k + 1)-th of ``silos`` equal quantiles."""
    edges = np.quantile(values, np.arange(1, silos) / silos)
    return np.searchsorted(edges, values, side="right")


def write_silos(name: str, out: Path) -> list[tuple[Path, int]]:
    """Write ``out/name/silo-k.csv`` and ``schema.toml``; returns each silo's file and rows."""
    table, schema = table_and_schema(name)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    comment = ("# Bounds: the full public table's min and max rounded outward (experiments/"
               "tabular.py).\n# The data set is public, so these bounds disclose nothing; "
               "bounds taken from a private\n# silo's data would (docs/data.md).\n\n")
    (folder / "schema.toml").write_text(comment + schema.to_toml())
    silo = silo_of_rows(table[DATASETS[name][3]])
    written = []
    for k in range(SILOS):
        rows = silo == k
        path = folder / f"silo-{k + 1}.csv"
        write_table({column: values[rows] for column, values in table.items()}, path)
        written.append((path, int(rows.sum())))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/tabular", help="folder for <name>/silo-k.csv "
                        "and <name>/schema.toml (default data/tabular)")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"comma-separated, of {', '.join(DATASETS)}")
    args = parser.parse_args(argv)
    for name in args.datasets.split(","):
        if name not in DATASETS:
            parser.error(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
        target, split = DATASETS[name][1], DATASETS[name][3]
        print(f"{name}: split by the tertiles of {split}; target {target}")
        for path, rows in write_silos(name, Path(args.out)):
            print(f"  {path}: {rows} rows")


if __name__ == "__main__":
    main()
