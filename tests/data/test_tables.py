"""A client's data file (secureffm/data/files.py, tables.py): each loader, every refusal named.

Truths used: the values written into each file by hand (or by numpy, Python's csv module, pyarrow
and PIL directly), and counts of out-of-bounds values made by construction.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from secureffm.data.files import read_columns, write_table
from secureffm.data.schema import Schema
from secureffm.data.tables import check_table, load_image_folder, load_table
from secureffm.errors import TableError

SCHEMA = Schema.loads("""
[[columns]]
name = "age"
type = "integer"
low = 0
high = 100
[[columns]]
name = "dose"
type = "continuous"
low = 0.0
high = 5.0
[[columns]]
name = "smoker"
type = "binary"
[[columns]]
name = "site"
type = "categorical"
categories = ["north", "south"]
[[columns]]
name = "grade"
type = "categorical"
categories = [1, 2, 3]
""")

CSV = ("age,dose,smoker,site,grade\n"
       "34,1.5,0,north,1\n"
       "61,4.25,1,south,3\n"
       "7,0.0,1,north,2\n")


def _expected_table():
    return {"age": np.array([34, 61, 7]), "dose": np.array([1.5, 4.25, 0.0]),
            "smoker": np.array([0, 1, 1]), "site": np.array(["north", "south", "north"]),
            "grade": np.array([1, 3, 2])}


def _assert_table(table, expected):
    assert list(table) == list(SCHEMA.names)
    for name, values in expected.items():
        assert table[name].tolist() == values.tolist(), name
    assert table["age"].dtype == np.int64 and table["smoker"].dtype == np.int64
    assert table["dose"].dtype == np.float64


def test_a_csv_file_loads_in_schema_order(tmp_path):
    path = tmp_path / "silo.csv"
    path.write_text("grade,site,smoker,dose,age\n" + "\n".join(
        ",".join(reversed(line.split(","))) for line in CSV.splitlines()[1:]) + "\n")
    table, report = load_table(path, SCHEMA)
    _assert_table(table, _expected_table())
    assert report.rows == 3 and report.clipped == 0


def test_an_npy_file_takes_the_schema_s_column_order(tmp_path):
    schema = Schema.loads('[[columns]]\nname = "a"\ntype = "continuous"\nlow = -1\nhigh = 1\n'
                          '[[columns]]\nname = "b"\ntype = "binary"\n')
    np.save(tmp_path / "silo.npy", np.array([[0.25, 1.0], [-0.5, 0.0]]))
    table, _ = load_table(tmp_path / "silo.npy", schema)
    assert table["a"].tolist() == [0.25, -0.5] and table["b"].tolist() == [1, 0]


def test_an_npy_file_with_the_wrong_column_count_is_refused(tmp_path):
    np.save(tmp_path / "silo.npy", np.zeros((3, 4)))
    with pytest.raises(TableError, match=r"4 columns where the schema has 5"):
        load_table(tmp_path / "silo.npy", SCHEMA)


def test_an_npy_file_of_objects_is_never_unpickled(tmp_path):
    np.save(tmp_path / "silo.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(TableError, match="never unpickled"):
        load_table(tmp_path / "silo.npy", SCHEMA)


def test_a_parquet_file_loads(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    expected = _expected_table()
    pq.write_table(pyarrow.table({k: v.tolist() for k, v in expected.items()}),
                   tmp_path / "silo.parquet")
    table, _ = load_table(tmp_path / "silo.parquet", SCHEMA)
    _assert_table(table, expected)


@pytest.mark.parametrize("suffix", [".csv", ".npy", ".parquet"])
def test_write_table_round_trips(tmp_path, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    table, _ = check_table(_expected_table(), SCHEMA)
    write_table(table, tmp_path / f"out{suffix}")
    again, _ = load_table(tmp_path / f"out{suffix}", SCHEMA)
    _assert_table(again, _expected_table())


def test_out_of_bounds_values_are_clipped_and_counted():
    raw = _expected_table() | {"age": np.array(["-3", "150", "101"]),
                               "dose": np.array(["5.5", "-0.1", "2"])}
    table, report = check_table(raw, SCHEMA)
    assert table["age"].tolist() == [0, 100, 100]
    assert table["dose"].tolist() == [5.0, 0.0, 2.0]
    assert report.clipped_low == {"age": 1, "dose": 1}
    assert report.clipped_high == {"age": 2, "dose": 1}
    assert report.clipped == 5


# -- every bad table is refused by name ---------------------------------------------------------

def _with(**changes):
    return _expected_table() | {k: np.array(v, dtype=object) for k, v in changes.items()}


@pytest.mark.parametrize(("raw", "named"), [
    ({k: v for k, v in _expected_table().items() if k != "dose"}, r"lacks .*'dose'"),
    (_expected_table() | {"notes": np.array(["a", "b", "c"])}, r"column\(s\) 'notes' that"),
    (_with(dose=["1.0", "high", "2"]), r"column 'dose' row 2 holds 'high', which is not a number"),
    (_with(age=["1", "", "2"]), r"column 'age' row 2 is empty"),
    (_with(dose=["1.0", "2", "nan"]), r"column 'dose' row 3 holds NaN"),
    (_with(dose=[1.0, np.nan, 2.0]), r"column 'dose' row 2 holds NaN"),
    (_with(dose=["inf", "2", "1"]), r"column 'dose' row 1 holds an infinite value"),
    (_with(age=["1", "2.5", "2"]), r"column 'age' row 2 holds '2.5'.*whole numbers"),
    (_with(smoker=["0", "1", "2"]), r"column 'smoker' row 3 holds '2'.*only 0 and 1"),
    (_with(smoker=["0", "yes", "1"]), r"column 'smoker' row 2 holds 'yes'"),
    (_with(site=["north", "west", "south"]), r"column 'site' row 2 holds 'west'.*categories"),
    (_with(site=["north", "south", None]), r"column 'site' row 3 is empty"),
    (_with(grade=["1", "4", "2"]), r"column 'grade' row 2 holds '4'.*categories \[1, 2, 3\]"),
    (_with(grade=["1", "two", "2"]), r"column 'grade' row 2 holds 'two', which is not a number"),
    (_expected_table() | {"age": np.array([1, 2])}, r"different lengths"),
    ({k: v[:0] for k, v in _expected_table().items()}, r"holds no rows"),
])
def test_a_bad_table_is_refused_by_name(raw, named):
    with pytest.raises(TableError, match=named):
        check_table(raw, SCHEMA, source="silo.csv")


def test_a_csv_file_s_bad_cell_is_named_as_written(tmp_path):
    path = tmp_path / "silo.csv"
    path.write_text(CSV.replace("4.25", "x"))
    with pytest.raises(TableError, match=r"silo.csv': column 'dose' row 2 holds 'x', which"):
        load_table(path, SCHEMA)


def test_numeric_categories_match_however_the_number_is_spelled():
    table, _ = check_table(_with(grade=["1.0", " 3", "2"]), SCHEMA)
    assert table["grade"].tolist() == [1, 3, 2]


@pytest.mark.parametrize(("text", "named"), [
    ("", r"is empty"),
    ("age,dose\n1,2,3\n", r"line 2 has 3 cells where the header has 2"),
    ("age,age\n1,2\n", r"names column 'age' twice"),
])
def test_a_malformed_csv_file_is_refused_by_name(tmp_path, text, named):
    path = tmp_path / "silo.csv"
    path.write_text(text)
    with pytest.raises(TableError, match=named):
        read_columns(path)


def test_an_unknown_suffix_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(TableError, match=r"unknown data file suffix '.xlsx'"):
        read_columns(tmp_path / "silo.xlsx")
    with pytest.raises(TableError, match=r"no data file at .*absent.csv"):
        read_columns(tmp_path / "absent.csv")


def test_an_npy_file_that_is_not_two_dimensional_is_refused(tmp_path):
    np.save(tmp_path / "silo.npy", np.zeros(5))
    with pytest.raises(TableError, match=r"shape \(5,\); a table is 2-D"):
        read_columns(tmp_path / "silo.npy")


# -- images ---------------------------------------------------------------------------------------

def _save(folder, name, pixels, mode):
    Image.fromarray(pixels, mode=mode).save(folder / name)


def test_an_image_folder_loads_scaled_with_labels_from_names(tmp_path):
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 14  # H=2, W=3, C=3
    _save(tmp_path, "1_b.png", rgb, "RGB")
    _save(tmp_path, "0_a.png", 255 - rgb, "RGB")
    _save(tmp_path, "10_c.png", rgb, "RGB")
    (tmp_path / "notes.txt").write_text("not an image")
    images = load_image_folder(tmp_path, labels_from_names=True)
    assert images.files == ("0_a.png", "10_c.png", "1_b.png")
    assert images.x.shape == (3, 3, 2, 3) and images.x.dtype.is_floating_point
    expected = rgb.transpose(2, 0, 1).astype(np.float32) / 127.5 - 1
    np.testing.assert_allclose(images.x[2].numpy(), expected, atol=1e-6)
    assert float(images.x.min()) >= -1 and float(images.x.max()) <= 1
    assert images.classes == ("0", "1", "10")  # numeric order, not "0" < "10" < "1"
    assert images.labels.tolist() == [0, 2, 1]


def test_grayscale_images_have_one_channel_and_labels_from_a_csv(tmp_path):
    gray = np.array([[0, 255], [128, 64]], dtype=np.uint8)
    _save(tmp_path, "a.png", gray, "L")
    _save(tmp_path, "b.jpg", gray, "L")
    labels = tmp_path / "labels.csv"
    labels.write_text("file,label\nb.jpg,cat\na.png,dog\n")
    images = load_image_folder(tmp_path, labels_csv=labels)
    assert images.x.shape == (2, 1, 2, 2)
    assert images.x[0, 0, 0].tolist() == [-1.0, 1.0]  # PNG is lossless
    assert images.classes == ("cat", "dog") and images.labels.tolist() == [1, 0]


def test_an_unlabelled_folder_has_no_labels(tmp_path):
    _save(tmp_path, "a.png", np.zeros((2, 2), dtype=np.uint8), "L")
    images = load_image_folder(tmp_path)
    assert images.labels is None and images.classes == ()


@pytest.mark.parametrize(("setup", "kwargs", "named"), [
    (lambda d: None, {}, r"holds no image file"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                _save(d, "b.png", np.zeros((3, 2), np.uint8), "L")), {},
     r"image 'b.png' has shape \(1, 3, 2\).*'a.png' has \(1, 2, 2\)"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                _save(d, "b.png", np.zeros((2, 2, 3), np.uint8), "RGB")), {},
     r"image 'b.png' has shape \(3, 2, 2\)"),
    (lambda d: _save(d, "plain.png", np.zeros((2, 2), np.uint8), "L"),
     {"labels_from_names": True}, r"image 'plain.png' has no label prefix"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                (d / "l.csv").write_text("file,label\n")), {"labels_csv": "l.csv"},
     r"image 'a.png' has no label in"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                (d / "l.csv").write_text("file,label\na.png,x\nz.png,y\n")),
     {"labels_csv": "l.csv"}, r"names 'z.png', which is not an image"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                (d / "l.csv").write_text("file,label\na.png,x\na.png,y\n")),
     {"labels_csv": "l.csv"}, r"names 'a.png' twice"),
    (lambda d: (_save(d, "a.png", np.zeros((2, 2), np.uint8), "L"),
                (d / "l.csv").write_text("name,label\na.png,x\n")),
     {"labels_csv": "l.csv"}, r"needs exactly file,label"),
    (lambda d: _save(d, "a_1.png", np.zeros((2, 2), np.uint8), "L"),
     {"labels_from_names": True, "labels_csv": "l.csv"}, r"not both"),
])
def test_a_bad_image_folder_is_refused_by_name(tmp_path, setup, kwargs, named):
    folder = tmp_path / "images"
    folder.mkdir()
    setup(folder)
    if "labels_csv" in kwargs:
        kwargs = kwargs | {"labels_csv": folder / kwargs["labels_csv"]}
    with pytest.raises(TableError, match=named):
        load_image_folder(folder, **kwargs)


def test_a_missing_image_folder_is_named(tmp_path):
    with pytest.raises(TableError, match=r"no image folder at .*absent"):
        load_image_folder(tmp_path / "absent")
