"""The public schema of a tabular run: columns, their types and public bounds or categories.

Every party holds the same schema file; its :meth:`Schema.digest` names it in a run's config and
in each client's pinned policy. It is data, written in TOML, one ``[[columns]]`` table per column
in the order the encoded array uses::

    [[columns]]
    name = "age"
    type = "integer"          # continuous | integer | binary | categorical
    low = 18                  # public bounds: numeric columns only, low < high
    high = 99

    [[columns]]
    name = "site"
    type = "categorical"
    categories = ["north", "south"]   # strings or numbers, not both

A column encodes to ``width`` entries of the model's vector (:mod:`.encoding`): 1 for a
continuous or integer column, 2 for binary (a one-hot pair), one per category for categorical;
``Schema.dim`` is their sum. The bounds must be public knowledge (a lab's measuring range, a
registry's code list): bounds or categories taken from a silo's data are a disclosure about that
data once the schema is shared. :func:`infer_schema` drafts a schema from one file for its owner
to review, with exactly that disclosure, and says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tomli_w

from ..errors import SchemaError
from .files import read_columns

__all__ = ["Column", "Schema", "TYPES", "infer_schema", "INFER_WARNING"]

TYPES = ("continuous", "integer", "binary", "categorical")
NUMERIC = ("continuous", "integer")
_KEYS = {"continuous": ("name", "type", "low", "high"), "integer": ("name", "type", "low", "high"),
         "binary": ("name", "type"), "categorical": ("name", "type", "categories")}
_ALL_KEYS = ("name", "type", "low", "high", "categories")

INFER_WARNING = (
    "This schema is a DRAFT taken from the data: its bounds are the file's minimum and maximum "
    "and its categories the values the file holds. Published or shared, they disclose facts "
    "about this silo's rows (an extreme value, a rare category). Review it before sharing: "
    "widen each bound to public knowledge (a measuring range, a plausible range), list "
    "categories from a public code list, and check each column's type.")


@dataclass(frozen=True)
class Column:
    """One column: ``type`` in :data:`TYPES`; public ``low`` < ``high`` for continuous (float)
    and integer (int) columns; ``categories`` (strings, or numbers) for categorical ones."""

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    categories: tuple = ()

    @property
    def width(self) -> int:
        """Entries this column takes in the encoded vector."""
        return {"binary": 2, "categorical": len(self.categories)}.get(self.type, 1)

    @property
    def numeric(self) -> bool:
        return self.type in NUMERIC

    def to_dict(self) -> dict:
        """The column as the schema file writes it (only the keys its type takes)."""
        data = {"name": self.name, "type": self.type}
        if self.numeric:
            data |= {"low": self.low, "high": self.high}
        if self.type == "categorical":
            data["categories"] = list(self.categories)
        return data


@dataclass(frozen=True)
class Schema:
    """The ordered columns of a table. Build it with :meth:`load`, :meth:`loads` or
    :meth:`from_dict`, which validate; the constructor takes already valid columns."""

    columns: tuple[Column, ...]

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        """Read and validate a schema file; every error names the file and the column."""
        path = Path(path)
        if not path.is_file():
            raise SchemaError(f"no schema file at {str(path)!r}: pass --schema PATH to a TOML "
                              "file of [[columns]] (secureffm schema infer FILE drafts one)")
        return cls.loads(path.read_text(), source=str(path))

    @classmethod
    def loads(cls, text: str, source: str = "<string>") -> Schema:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SchemaError(f"schema {source} is not valid TOML: {err}") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> Schema:
        where = f"schema {source}"
        extra = sorted(set(data) - {"columns"})
        if extra:
            raise SchemaError(f"{where}: unknown top-level key {extra[0]!r}; a schema holds only "
                              "[[columns]] tables")
        raw = data.get("columns")
        if raw is None or raw == []:
            raise SchemaError(f"{where} has no [[columns]]: list each column as a [[columns]] "
                              "table with its name and type")
        if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
            raise SchemaError(f"{where}: 'columns' must be an array of tables ([[columns]])")
        columns, seen = [], set()
        for index, fields in enumerate(raw, start=1):
            column = _column(fields, index, where)
            if column.name in seen:
                raise SchemaError(f"{where}: column {column.name!r} appears twice; rename one")
            seen.add(column.name)
            columns.append(column)
        return cls(tuple(columns))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def dim(self) -> int:
        """The encoded dimension: the model's input size."""
        return sum(c.width for c in self.columns)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise SchemaError(f"the schema has no column {name!r}; its columns: "
                          f"{', '.join(self.names)}")

    def slices(self) -> dict[str, slice]:
        """Column name -> its entries in the encoded vector."""
        out, start = {}, 0
        for column in self.columns:
            out[column.name] = slice(start, start + column.width)
            start += column.width
        return out

    def to_dict(self) -> dict:
        return {"columns": [c.to_dict() for c in self.columns]}

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON of :meth:`to_dict` (keys sorted, no spaces):
        the same for any key order, whitespace or spelling of a number (18 or 18.0)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _number(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaError(f"{where}: {key!r} must be a finite number, not {value!r}")
    return value


def _column(fields: dict, index: int, where: str) -> Column:
    """Validate one [[columns]] table (``index`` counts from 1)."""
    name = fields.get("name")
    if name is None:
        raise SchemaError(f"{where}: column {index} needs a 'name'")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{where}: column {index}: 'name' must be a non-empty string, "
                          f"not {name!r}")
    where = f"{where}: column {name!r}"
    unknown = sorted(set(fields) - set(_ALL_KEYS))
    if unknown:
        raise SchemaError(f"{where} has unknown key {unknown[0]!r}; known keys: "
                          f"{', '.join(_ALL_KEYS)}")
    kind = fields.get("type")
    if kind is None:
        raise SchemaError(f"{where} needs a 'type' (one of {', '.join(TYPES)})")
    if kind not in TYPES:
        raise SchemaError(f"{where} has unknown type {kind!r}; use one of {', '.join(TYPES)}")
    taken = _KEYS[kind]
    for key in fields:
        if key not in taken:
            raise SchemaError(f"{where} sets {key!r}, which a {kind} column does not take "
                              f"({kind} takes: {', '.join(taken)})")
    for key in taken:
        if key not in fields:
            raise SchemaError(f"{where} ({kind}) needs {key!r}: "
                              + ("its public bound" if key in ("low", "high")
                                 else "the list of its public categories"))
    if kind in NUMERIC:
        low, high = (_number(fields[k], k, where) for k in ("low", "high"))
        if kind == "integer":
            for key, value in (("low", low), ("high", high)):
                if value != int(value):
                    raise SchemaError(f"{where} (integer): bound {key} = {value!r} must be a "
                                      "whole number")
            low, high = int(low), int(high)
        else:
            low, high = float(low), float(high)
        if not low < high:
            raise SchemaError(f"{where} needs low {low!r} strictly below high {high!r}; set the "
                              "public range its values can take")
        return Column(name, kind, low=low, high=high)
    if kind == "categorical":
        return Column(name, kind, categories=_categories(fields["categories"], where))
    return Column(name, kind)


def _categories(raw, where: str) -> tuple:
    if not isinstance(raw, list) or not raw:
        raise SchemaError(f"{where} (categorical) has no categories; list its public "
                          "categories, e.g. categories = [\"a\", \"b\"]")
    out = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SchemaError(f"{where}: categories must be strings or numbers, not {value!r}")
        if isinstance(value, float):
            _number(value, "categories", where)
            value = int(value) if value.is_integer() else value
        if value in out:
            raise SchemaError(f"{where} lists category {value!r} twice")
        out.append(value)
    if len({isinstance(v, str) for v in out}) > 1:
        raise SchemaError(f"{where}: categories mix numbers and strings; write them all as "
                          "strings or all as numbers")
    return tuple(out)


def infer_schema(path: str | Path, max_categories: int = 10) -> Schema:
    """Draft a schema from one data file (CSV, .npy, .parquet) for its owner to review.

    Per column, empty cells and NaN left out: values that are not all numbers -> categorical
    (the sorted distinct strings); whole numbers only {0, 1} -> binary; whole numbers with at
    most ``max_categories`` distinct values -> categorical (those numbers); other whole numbers
    -> integer; else continuous. Bounds are the data's min and max (a constant continuous column
    v gets [v - 1, v + 1]). These bounds and categories disclose the data: see
    :data:`INFER_WARNING`.
    """
    columns = []
    for name, values in read_columns(path).items():
        columns.append(_draft(name, np.asarray(values), max_categories))
    return Schema.from_dict({"columns": columns}, source=f"inferred from {path}")


def _draft(name: str, values: np.ndarray, max_categories: int) -> dict:
    if values.dtype.kind in "OUS":  # empty cells are missing values, not a category
        values = np.array([v for v in values.tolist() if v is not None and str(v).strip()])
    try:
        numbers = values.astype(np.float64)
    except (TypeError, ValueError):
        return {"name": name, "type": "categorical",
                "categories": sorted({str(v).strip() for v in values})}
    numbers = numbers[np.isfinite(numbers)]
    if numbers.size == 0:
        raise SchemaError(f"column {name!r} of the file holds no finite number to draft from")
    distinct = np.unique(numbers)
    whole = bool(np.all(distinct == np.round(distinct)))
    if whole and set(distinct.tolist()) <= {0.0, 1.0} and len(distinct) == 2:
        return {"name": name, "type": "binary"}
    if whole and len(distinct) <= max_categories:
        return {"name": name, "type": "categorical", "categories": [int(v) for v in distinct]}
    low, high = float(distinct[0]), float(distinct[-1])
    if whole:
        return {"name": name, "type": "integer", "low": int(low), "high": int(high)}
    if low == high:
        low, high = low - 1.0, high + 1.0
    return {"name": name, "type": "continuous", "low": low, "high": high}
