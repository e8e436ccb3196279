"""A silo's own table as its client holds it: the public holdout split, the checked and encoded
rows, the public pair a tabular run trains on (secureffm/data/silo.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secureffm.data.schema import Schema
from secureffm.data.silo import holdout_split, load_silo, standard_normal, table_pair
from secureffm.errors import DataError

# -- holdout_split -----------------------------------------------------------------------------

def test_holdout_split_is_disjoint_covers_every_row_and_follows_the_seed():
    train, held = holdout_split(50, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert sorted(train.tolist() + held.tolist()) == list(range(50))
    assert np.array_equal(holdout_split(50, 0.2, seed=3)[1], held)
    assert not np.array_equal(holdout_split(50, 0.2, seed=4)[1], held)


@pytest.mark.parametrize(("n", "fraction", "named"), [
    (50, 0.0, r"fraction 0.0 must lie strictly between 0 and 1"),
    (50, 1.0, r"fraction 1.0 must lie"),
    (2, 0.1, r"leaves 0 held-out and 2 training rows"),
    (3, 0.9, r"leaves 3 held-out and 0 training rows"),
])
def test_holdout_split_refuses_an_empty_part(n, fraction, named):
    with pytest.raises(DataError, match=named):
        holdout_split(n, fraction, seed=0)



# -- the public pair ---------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [1, 2, 5, 16])
def test_the_source_is_a_standard_normal_in_the_schemas_dimension(dim):
    source = standard_normal(dim)
    z, _ = source.sample(40_000, torch.Generator().manual_seed(0))
    assert z.shape == (40_000, dim)
    assert torch.allclose(z.mean(0), torch.zeros(dim), atol=0.03)
    assert torch.allclose(torch.cov(z.T).reshape(dim, dim), torch.eye(dim), atol=0.04)


SCHEMA = """
[[columns]]
name = "age"
type = "integer"
low = 0
high = 100

[[columns]]
name = "ward"
type = "categorical"
categories = ["a", "b", "c"]
"""


def test_no_party_can_sample_a_tabular_runs_target():
    pair = table_pair(Schema.loads(SCHEMA))
    assert pair.dim == 4 and pair.source.dim == 4
    with pytest.raises(DataError, match="clients' own data: no party can sample it"):
        pair.target.sample(3, torch.Generator())


def test_a_silo_reads_its_own_file_holds_out_rows_and_encodes_the_rest(tmp_path):
    path = tmp_path / "hospital.csv"
    rows = [(40 + i % 50, "abc"[i % 3]) for i in range(20)] + [(130, "a")]  # 130: clipped
    path.write_text("age,ward\n" + "".join(f"{a},{w}\n" for a, w in rows))
    silo = load_silo(path, Schema.loads(SCHEMA), holdout=0.25, seed=1)
    assert len(silo.holdout["age"]) == 5 and silo.x.shape == (16, 4)
    assert silo.report.clipped == 1
    together = sorted(silo.train["age"].tolist() + silo.holdout["age"].tolist())
    assert together == sorted([min(a, 100) for a, _ in rows])
    assert torch.all(silo.x[:, 1:].sum(1) == 1)  # one-hot ward


def test_a_silo_too_small_for_its_batch_is_refused_by_name(tmp_path):
    path = tmp_path / "small.csv"
    path.write_text("age,ward\n" + "".join(f"{i},a\n" for i in range(10)))
    with pytest.raises(DataError, match="keeps 8 training rows .* fewer than the batch size 64"):
        load_silo(path, Schema.loads(SCHEMA), holdout=0.2, seed=0, min_rows=64)
