"""Measured tables written into docs (secureffm/reporting.py).

Truths used: the file's text before and after, and statistics by hand.
"""

from __future__ import annotations

import math

from secureffm.reporting import markdown_table, mean_std, write_block


def test_a_block_is_replaced_and_the_prose_around_it_kept(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\nintro\n<!-- w2:begin -->\nold\n<!-- w2:end -->\noutro\n")
    write_block(doc, "w2", "| a | b |")
    assert doc.read_text() == "# R\n\nintro\n<!-- w2:begin -->\n| a | b |\n<!-- w2:end -->\noutro\n"
    write_block(doc, "w2", "new")  # again: one block, not two
    assert doc.read_text().count("<!-- w2:begin -->") == 1 and "| a | b |" not in doc.read_text()


def test_a_missing_block_is_appended_and_a_missing_file_created(tmp_path):
    doc = tmp_path / "results.md"
    write_block(doc, "one", "first", title="# Title")
    assert doc.read_text() == "# Title\n\n<!-- one:begin -->\nfirst\n<!-- one:end -->\n"
    write_block(doc, "two", "second")
    assert doc.read_text().endswith("<!-- one:end -->\n\n<!-- two:begin -->\nsecond\n"
                                    "<!-- two:end -->\n")
    assert "first" in doc.read_text()


def test_mean_and_sample_standard_deviation():
    mean, std = mean_std([1.0, 2.0, 4.0])
    assert mean == 7 / 3
    assert math.isclose(std, math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2)
                                       / 2))
    assert mean_std([5.0]) == (5.0, 0.0)


def test_markdown_table_writes_a_header_a_rule_and_one_line_per_row():
    text = markdown_table(["a", "b"], [[1, "x|y"], [2.5, ""]])
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x\\|y |", "| 2.5 |  |"]
