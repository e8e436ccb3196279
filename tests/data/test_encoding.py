"""Encoding through the public schema (secureffm/data/encoding.py) and its inverse.

Truths used: the affine map of [low, high] onto [-1, 1] written out by hand (low -> -1, the
midpoint -> 0, high -> 1), one-hot vectors written out by hand, and the round trip
decode(encode(t)) == t on random schemas and tables (hypothesis) for tables built independently
of the encoder.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secureffm.data.encoding import decode, encode
from secureffm.data.schema import Column, Schema
from secureffm.data.tables import check_table
from secureffm.errors import TableError

SCHEMA = Schema((Column("dose", "continuous", low=-2.0, high=6.0),
                 Column("age", "integer", low=10, high=20),
                 Column("smoker", "binary"),
                 Column("site", "categorical", categories=("n", "s", "e"))))


def _table(**columns):
    out = {}
    for name, values in columns.items():
        array = np.empty(len(values), dtype=object) if name == "site" else None
        if array is not None:
            array[:] = values
        out[name] = array if array is not None else np.asarray(values)
    return out


def test_encode_by_hand():
    table = _table(dose=[-2.0, 2.0, 6.0], age=[10, 15, 20], smoker=[0, 1, 1],
                   site=["e", "n", "s"])
    expected = np.array([[-1, -1, 1, 0, 0, 0, 1],
                         [0, 0, 0, 1, 1, 0, 0],
                         [1, 1, 0, 1, 0, 1, 0]], dtype=np.float32)
    x = encode(table, SCHEMA)
    assert x.dtype == np.float32 and x.shape == (3, SCHEMA.dim) == (3, 7)
    np.testing.assert_array_equal(x, expected)


def test_scaling_uses_the_public_bounds_never_the_data_s_own_range():
    """A min-max scaler fitted on the silo's rows would publish its min and max through the
    model (issue 38, item 2): one silo's rows [0, 2] and [12, 13] must land where the public
    bounds put them, not on [-1, 1]."""
    table = _table(dose=[0.0, 2.0], age=[12, 13], smoker=[0, 0], site=["n", "n"])
    x = encode(table, SCHEMA)
    np.testing.assert_allclose(x[:, 0], [-0.5, 0.0])
    np.testing.assert_allclose(x[:, 1], [-0.6, -0.4], rtol=1e-6)


def test_decode_by_hand_clips_rounds_and_takes_the_argmax():
    x = np.array([[-3.0, 0.05, 0.2, 0.1, 0.1, 0.7, 0.3],   # dose below low, age 15.25 -> 15
                  [0.5, 5.0, -1.0, -2.0, 0.0, 0.0, -1.0],  # age above high; tie n/s -> first
                  [0.25, -0.95, 0.4, 0.6, -5.0, -6.0, -4.0]])
    table = decode(x, SCHEMA)
    assert table["dose"].tolist() == [-2.0, 4.0, 3.0]
    assert table["age"].tolist() == [15, 20, 10] and table["age"].dtype == np.int64
    assert table["smoker"].tolist() == [0, 0, 1]
    assert table["site"].tolist() == ["s", "n", "e"]


def test_decode_refuses_an_array_of_the_wrong_width():
    with pytest.raises(TableError, match=r"shape \(2, 6\).*dimension 7"):
        decode(np.zeros((2, 6)), SCHEMA)


@pytest.mark.parametrize(("change", "named"), [
    ({"dose": [7.0]}, r"column 'dose' holds values outside its public bounds"),
    ({"age": [9]}, r"column 'age' holds values outside"),
    ({"smoker": [2]}, r"column 'smoker' holds 2"),
    ({"site": ["w"]}, r"column 'site' holds 'w'"),
])
def test_encode_refuses_an_unchecked_table(change, named):
    table = _table(**({"dose": [0.0], "age": [12], "smoker": [1], "site": ["n"]} | change))
    with pytest.raises(TableError, match=named):
        encode(table, SCHEMA)


@st.composite
def schemas_and_tables(draw):
    columns = []
    for j in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["continuous", "integer", "binary", "categorical"]))
        if kind == "continuous":
            low = draw(st.floats(-1e4, 1e4))
            high = low + draw(st.floats(1e-2, 1e4))
            columns.append(Column(f"c{j}", kind, low=low, high=high))
        elif kind == "integer":
            low = draw(st.integers(-10**6, 10**6))
            columns.append(Column(f"c{j}", kind, low=low, high=low + draw(st.integers(1, 10**6))))
        elif kind == "binary":
            columns.append(Column(f"c{j}", kind))
        else:
            categories = draw(st.one_of(
                st.lists(st.text(min_size=1, max_size=3).map(str.strip).filter(bool),
                         min_size=1, max_size=6, unique=True),
                st.lists(st.integers(-50, 50), min_size=1, max_size=6, unique=True)))
            columns.append(Column(f"c{j}", kind, categories=tuple(categories)))
    schema = Schema.from_dict({"columns": [c.to_dict() for c in columns]})
    n = draw(st.integers(1, 20))
    raw = {}
    for column in schema.columns:
        if column.type == "continuous":
            raw[column.name] = np.array(draw(st.lists(
                st.floats(column.low, column.high), min_size=n, max_size=n)))
        elif column.type == "integer":
            raw[column.name] = np.array(draw(st.lists(
                st.integers(column.low, column.high), min_size=n, max_size=n)))
        else:
            choices = (0, 1) if column.type == "binary" else column.categories
            values = draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))
            raw[column.name] = np.empty(n, dtype=object)
            raw[column.name][:] = values
    return schema, raw


@settings(max_examples=80, deadline=None)
@given(schemas_and_tables())
def test_decode_inverts_encode(case):
    schema, raw = case
    table, report = check_table(raw, schema)
    assert report.clipped == 0
    x = encode(table, schema)
    assert x.shape == (len(raw[schema.names[0]]), schema.dim)
    assert np.all(np.abs(x) <= 1.0)
    back = decode(x, schema)
    assert list(back) == list(schema.names)
    for column in schema.columns:
        if column.type == "continuous":
            np.testing.assert_allclose(back[column.name], raw[column.name],
                                       atol=1e-6 * (column.high - column.low))
        else:
            assert back[column.name].tolist() == raw[column.name].tolist(), column.name


@settings(max_examples=60, deadline=None)
@given(schemas_and_tables(), st.integers(0, 2**32 - 1))
def test_decode_of_any_array_is_a_table_the_schema_accepts_unclipped(case, seed):
    """What `sample` writes (decoded model samples) always passes the schema's own check."""
    schema, _ = case
    x = np.random.default_rng(seed).normal(0.0, 3.0, size=(7, schema.dim))
    table, report = check_table(decode(x, schema), schema)
    assert report.clipped == 0
    np.testing.assert_array_equal(encode(table, schema), encode(decode(x, schema), schema))
