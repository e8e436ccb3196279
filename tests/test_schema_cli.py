"""``secureffm schema infer FILE``: a draft schema for its owner to review, with the warning that
bounds and categories taken from the data disclose it.

Truths used: the file's own min, max and distinct values written by hand.
"""

from __future__ import annotations

from secureffm.cli import main
from secureffm.data.schema import Column, Schema

CSV = "age,dose,smoker\n34,1.5,0\n61,4.25,1\n29,0.5,1\n"


def test_schema_infer_prints_a_draft_and_the_disclosure_warning(tmp_path, capsys):
    path = tmp_path / "silo.csv"
    path.write_text(CSV)
    assert main(["schema", "infer", str(path), "--max-categories", "2"]) == 0
    out, err = capsys.readouterr()
    schema = Schema.loads(out)
    assert schema.columns == (Column("age", "integer", low=29, high=61),
                              Column("dose", "continuous", low=0.5, high=4.25),
                              Column("smoker", "binary"))
    assert "disclose" in err and "Review it" in err and "widen each bound" in err


def test_schema_infer_writes_the_file_with_the_warning_as_a_comment(tmp_path, capsys):
    path, out = tmp_path / "silo.csv", tmp_path / "schema.toml"
    path.write_text(CSV)
    assert main(["schema", "infer", str(path), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# ") and "disclose" in text.split("[[columns]]")[0]
    assert Schema.load(out).names == ("age", "dose", "smoker")
    assert str(out) in capsys.readouterr().err


def test_schema_infer_refuses_to_overwrite_a_schema(tmp_path, capsys):
    path, out = tmp_path / "silo.csv", tmp_path / "schema.toml"
    path.write_text(CSV)
    out.write_text("kept")
    assert main(["schema", "infer", str(path), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "kept"


def test_schema_infer_names_a_file_it_cannot_read(tmp_path, capsys):
    assert main(["schema", "infer", str(tmp_path / "silo.xlsx")]) == 2
    assert "unknown data file suffix '.xlsx'" in capsys.readouterr().err
