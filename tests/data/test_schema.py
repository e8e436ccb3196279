"""The public schema (secureffm/data/schema.py): read from TOML, validated, named in every error.

Truths used: the widths each column type encodes to (1 for a numeric column, 2 for binary, one per
category), SHA-256 of the canonical form written out by hand, and the data the inferred schemas
are drafted from.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from secureffm.data.schema import Column, Schema, infer_schema
from secureffm.errors import DataError, SchemaError

GOOD = """
[[columns]]
name = "age"
type = "integer"
low = 18
high = 99

[[columns]]
name = "weight"
type = "continuous"
low = 30.5
high = 250

[[columns]]
name = "smoker"
type = "binary"

[[columns]]
name = "site"
type = "categorical"
categories = ["north", "south", "east"]
"""


def test_a_good_schema_loads_with_its_columns_and_encoded_dimension(tmp_path):
    path = tmp_path / "schema.toml"
    path.write_text(GOOD)
    schema = Schema.load(path)
    assert schema.names == ("age", "weight", "smoker", "site")
    assert schema.columns[0] == Column("age", "integer", low=18, high=99)
    assert schema.columns[1].low == 30.5 and schema.columns[1].high == 250.0
    assert schema.columns[3].categories == ("north", "south", "east")
    assert schema.dim == 1 + 1 + 2 + 3
    assert [schema.slices()[n] for n in schema.names] == [slice(0, 1), slice(1, 2), slice(2, 4),
                                                          slice(4, 7)]


def test_the_digest_is_sha256_of_the_canonical_form():
    schema = Schema.loads(GOOD)
    canonical = [
        {"name": "age", "type": "integer", "low": 18, "high": 99},
        {"name": "weight", "type": "continuous", "low": 30.5, "high": 250.0},
        {"name": "smoker", "type": "binary"},
        {"name": "site", "type": "categorical", "categories": ["north", "south", "east"]},
    ]
    text = json.dumps({"columns": canonical}, sort_keys=True, separators=(",", ":"))
    assert schema.digest() == hashlib.sha256(text.encode()).hexdigest()


def test_the_digest_ignores_key_order_whitespace_and_number_spelling():
    reordered = """
    [[columns]]
    high = 99
    type = "integer"
    name = "age"
    low = 18.0
    [[columns]]
    type="continuous"
    high=250.0
    low=30.5
    name="weight"
    [[columns]]
    type = "binary"
    name = "smoker"
    [[columns]]
    categories = [ "north","south","east" ]
    name = "site"
    type = "categorical"
    """
    assert Schema.loads(reordered).digest() == Schema.loads(GOOD).digest()


def test_the_digest_changes_with_a_bound_a_category_or_the_column_order():
    base = Schema.loads(GOOD).digest()
    assert Schema.loads(GOOD.replace("high = 99", "high = 100")).digest() != base
    assert Schema.loads(GOOD.replace('"east"]', '"west"]')).digest() != base
    swapped = Schema(tuple(reversed(Schema.loads(GOOD).columns)))
    assert swapped.digest() != base


def test_to_toml_round_trips():
    schema = Schema.loads(GOOD)
    again = Schema.loads(schema.to_toml())
    assert again == schema and again.digest() == schema.digest()


def test_numeric_categories_are_kept_as_numbers():
    schema = Schema.loads('[[columns]]\nname = "grade"\ntype = "categorical"\n'
                          'categories = [1, 2.0, 3.5]\n')
    assert schema.columns[0].categories == (1, 2, 3.5)
    assert isinstance(schema.columns[0].categories[1], int)


# -- every bad schema is refused by name ---------------------------------------------------------

def _column(**fields) -> str:
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    return f"[[columns]]\n{body}\n"


@pytest.mark.parametrize(("text", "named"), [
    (_column(name="a", type="real", low=0, high=1), r"column 'a'.*unknown type 'real'.*continuous"),
    (_column(name="a", type="continuous", low=0), r"column 'a'.*needs 'high'"),
    (_column(name="a", type="integer", high=3), r"column 'a'.*needs 'low'"),
    (_column(name="a", type="continuous", low=1, high=1), r"column 'a'.*low 1.* below high 1"),
    (_column(name="a", type="continuous", low=2, high=1), r"column 'a'.*low 2.* below high 1"),
    (_column(name="a", type="binary") + _column(name="a", type="binary"),
     r"column 'a' appears twice"),
    (_column(name="a", type="categorical", categories=[]), r"column 'a'.*no categories"),
    (_column(name="a", type="categorical"), r"column 'a'.*needs 'categories'"),
    (_column(name="a", type="categorical", categories=["x", "x"]),
     r"column 'a'.*category 'x' twice"),
    (_column(name="a", type="categorical", categories=["x", 1]),
     r"column 'a'.*mix numbers and strings"),
    (_column(name="a", type="categorical", categories=[True, False]),
     r"column 'a'.*categories must be strings or numbers"),
    (_column(name="a", type="binary", low=0, high=1), r"column 'a'.*'low'.*binary takes"),
    (_column(name="a", type="continuous", low=0, high=1, categories=["x"]),
     r"column 'a'.*'categories'.*continuous takes"),
    (_column(name="a", type="continuous", lo=0, high=1), r"column 'a'.*unknown key 'lo'"),
    (_column(name="a", type="integer", low=0.5, high=3), r"column 'a'.*integer.*whole number"),
    (_column(name="a", type="continuous", low="zero", high=1), r"column 'a'.*'low' must be a"),
    (_column(name="a", type="continuous", low=0, high=float("inf")),
     r"column 'a'.*'high' must be a finite"),
    (_column(type="binary"), r"column 1.*needs a 'name'"),
    (_column(name="", type="binary"), r"column 1.*non-empty string"),
    (_column(name="a"), r"column 'a'.*needs a 'type'"),
    ("", r"no \[\[columns\]\]"),
    ('columns = "a"\n', r"'columns' must be an array of tables"),
    ('version = 2\n' + _column(name="a", type="binary"), r"unknown top-level key 'version'"),
    ("[[columns]\nname = ", r"not valid TOML"),
])
def test_a_bad_schema_is_refused_by_name(text, named):
    text = text.replace("Infinity", "inf")  # json.dumps spells inf as TOML does not
    with pytest.raises(SchemaError, match=named) as err:
        Schema.loads(text, source="s.toml")
    assert "s.toml" in str(err.value)


def test_schema_errors_are_data_errors_and_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(_column(name="a", type="nope"))
    with pytest.raises(DataError, match="bad.toml"):
        Schema.load(path)


def test_a_missing_schema_file_is_named(tmp_path):
    with pytest.raises(SchemaError, match="no schema file.*absent.toml"):
        Schema.load(tmp_path / "absent.toml")


# -- drafting a schema from one file ------------------------------------------------------------

def test_infer_drafts_types_and_takes_bounds_from_the_data(tmp_path):
    path = tmp_path / "silo.csv"
    path.write_text("age,weight,smoker,site,stage\n"
                    "34,70.5,0,north,1\n"
                    "61,82.25,1,south,2\n"
                    "45,55.0,1,north,3\n"
                    "29,90.0,0,east,1\n"
                    "70,64.5,0,south,2\n"
                    "52,77.0,1,north,3\n")
    schema = infer_schema(path, max_categories=3)
    by_name = {c.name: c for c in schema.columns}
    assert by_name["age"] == Column("age", "integer", low=29, high=70)
    assert by_name["weight"] == Column("weight", "continuous", low=55.0, high=90.0)
    assert by_name["smoker"] == Column("smoker", "binary")
    assert by_name["site"] == Column("site", "categorical", categories=("east", "north", "south"))
    assert by_name["stage"] == Column("stage", "categorical", categories=(1, 2, 3))
    assert schema.names == ("age", "weight", "smoker", "site", "stage")


def test_infer_leaves_out_empty_cells(tmp_path):
    path = tmp_path / "silo.csv"
    path.write_text("dose,site\n1.5,a\n,b\n2.5,\n")
    schema = infer_schema(path)
    assert schema.columns == (Column("dose", "continuous", low=1.5, high=2.5),
                              Column("site", "categorical", categories=("a", "b")))


def test_infer_on_npy_names_columns_by_position_and_widens_a_constant(tmp_path):
    data = np.array([[0.5, 7.0], [0.5, 8.0], [0.5, 9.0], [0.5, 10.0]])
    np.save(tmp_path / "silo.npy", data)
    schema = infer_schema(tmp_path / "silo.npy", max_categories=2)
    assert schema.names == ("column_0", "column_1")
    constant, counts = schema.columns
    assert constant.type == "continuous" and constant.low < 0.5 < constant.high
    assert counts == Column("column_1", "integer", low=7, high=10)
