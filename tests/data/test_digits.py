import numpy as np
import pytest

from secureffm.data.digits import CLUSTER_PAIRS, class_pair_split, load_digit_arrays
from secureffm.errors import DataError


def test_digits_scaled_to_unit_interval():
    x, y = load_digit_arrays()
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert x.min() == 0.0 and x.max() == 1.0
    assert set(np.unique(y)) == set(range(10))


@pytest.mark.parametrize("structure", ["clusters", "random"])
def test_split_holds_two_classes_per_client_and_uses_each_row_once(structure):
    shards = class_pair_split(structure, clients=20, seed=3)
    assert len(shards) == 20
    x, _ = load_digit_arrays()
    rows = np.concatenate([s.x_train for s in shards] + [s.x_test for s in shards])
    # No digit image is dealt twice (images are unique up to a few exact duplicates).
    assert len(np.unique(rows, axis=0)) >= len(rows) - 5
    assert len(rows) <= len(x)
    for shard in shards:
        assert len(shard.classes) == 2
        assert set(np.unique(shard.y_train)) == set(shard.classes)
        assert set(np.unique(shard.y_test)) <= set(shard.classes)
        assert len(shard.y_test) >= 2


def test_clusters_split_plants_five_groups_of_at_least_two():
    shards = class_pair_split("clusters", clients=20, seed=0)
    pairs = [s.classes for s in shards]
    assert set(pairs) == set(CLUSTER_PAIRS)
    assert min(pairs.count(pair) for pair in CLUSTER_PAIRS) >= 2


def test_split_is_seeded():
    a = class_pair_split("random", clients=20, seed=5)
    b = class_pair_split("random", clients=20, seed=5)
    c = class_pair_split("random", clients=20, seed=6)
    assert all(np.array_equal(s.x_train, t.x_train) for s, t in zip(a, b, strict=True))
    assert [s.classes for s in a] != [s.classes for s in c]


def test_bad_split_requests_are_data_errors():
    with pytest.raises(DataError, match="structure"):
        class_pair_split("stripes")
    with pytest.raises(DataError, match="clients >= 10"):
        class_pair_split("clusters", clients=6)
    with pytest.raises(DataError, match="test_fraction"):
        class_pair_split("random", test_fraction=1.5)
    with pytest.raises(DataError, match="fewer clients"):
        class_pair_split("clusters", clients=400)
