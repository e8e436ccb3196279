"""A checked table to the model's vectors and back, through the public schema only.

``encode(table, schema) -> x`` [N, schema.dim] float32, column by column in schema order:

- continuous and integer: 2 (v - low) / (high - low) - 1, the PUBLIC bounds mapped to [-1, 1]
  (no statistic of any silo's data enters);
- binary: a one-hot pair, 0 -> (1, 0), 1 -> (0, 1);
- categorical: one-hot over the schema's categories, in the schema's order.

``decode(x, schema) -> table`` inverts it for any real array (a model's samples included):
numeric entries are unscaled and clipped to [low, high], integer columns then rounded half to
even (``np.rint``); binary and categorical columns take the argmax of their entries (the first
on a tie). ``decode(encode(t))`` returns ``t`` for every table that passed
:func:`~secureffm.data.tables.check_table` (continuous values to float rounding).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import TableError
from .schema import Schema
from .tables import Table

__all__ = ["encode", "decode"]


def encode(table: Mapping[str, np.ndarray], schema: Schema) -> np.ndarray:
    """[N, schema.dim] float32 of a checked table. Refuses a value outside a numeric column's
    bounds or a category list (run :func:`~secureffm.data.tables.check_table` first)."""
    n = len(table[schema.names[0]])
    out = np.zeros((n, schema.dim), dtype=np.float32)
    for column, where in zip(schema.columns, schema.slices().values(), strict=True):
        values = np.asarray(table[column.name])
        if column.numeric:
            values = values.astype(np.float64)
            if np.any(values < column.low) or np.any(values > column.high):
                raise TableError(f"column {column.name!r} holds values outside its public "
                                 f"bounds [{column.low}, {column.high}]: check the table with "
                                 "check_table, which clips them, before encoding")
            scaled = 2.0 * (values - column.low) / (column.high - column.low) - 1.0
            out[:, where.start] = scaled
            continue
        categories = (0, 1) if column.type == "binary" else column.categories
        lookup = {value: index for index, value in enumerate(categories)}
        unique, inverse = np.unique(values, return_inverse=True)
        missing = [v for v in unique.tolist() if v not in lookup]
        if missing:
            raise TableError(f"column {column.name!r} holds {missing[0]!r}, not one of "
                             f"{list(categories)}: check the table with check_table first")
        codes = np.array([lookup[v] for v in unique.tolist()], dtype=np.int64)[inverse.ravel()]
        out[np.arange(n), where.start + codes] = 1.0
    return out


def decode(x: np.ndarray, schema: Schema) -> Table:
    """The table of ``x`` [N, schema.dim] (any real values): see the module's docstring."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != schema.dim:
        raise TableError(f"cannot decode an array of shape {x.shape} with a schema of dimension "
                         f"{schema.dim}: it needs [N, {schema.dim}]")
    table: Table = {}
    for column, where in zip(schema.columns, schema.slices().values(), strict=True):
        block = x[:, where]
        if column.numeric:
            values = column.low + (block[:, 0] + 1.0) / 2.0 * (column.high - column.low)
            values = np.clip(values, column.low, column.high)
            table[column.name] = (np.rint(values).astype(np.int64) if column.type == "integer"
                                  else values)
        elif column.type == "binary":
            table[column.name] = np.argmax(block, axis=1).astype(np.int64)
        else:
            categories = np.empty(len(column.categories), dtype=object)
            categories[:] = column.categories
            table[column.name] = categories[np.argmax(block, axis=1)]
    return table
