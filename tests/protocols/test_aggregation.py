"""Server-side aggregation as pure functions (secureffm/protocols/aggregation.py).

Truths used: numpy's weighted average in float64, and the template's shapes and dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest

from secureffm.errors import MessageError
from secureffm.protocols.aggregation import check_payload, flatten, unflatten, weighted_mean

TEMPLATE = {"w": ((2, 3), np.dtype(np.float32)), "b": ((3,), np.dtype(np.float32)),
            "count": ((1,), np.dtype(np.int64))}


def test_the_weighted_mean_equals_numpys_weighted_average():
    rng = np.random.default_rng(0)
    payloads = [{"w": rng.normal(size=(2, 3)).astype(np.float32),
                 "b": rng.normal(size=3).astype(np.float32)} for _ in range(4)]
    weights = [0.5, 3.0, 1.25, 0.25]  # not normalised: the mean divides by their sum
    mean = weighted_mean(list(zip(payloads, weights, strict=True)))
    for name in ("w", "b"):
        stacked = np.stack([p[name].astype(np.float64) for p in payloads])
        expected = np.average(stacked, axis=0, weights=weights)
        assert mean[name].dtype == np.float32
        np.testing.assert_allclose(mean[name], expected, rtol=1e-6)


def test_the_mean_is_taken_in_float64():
    """(2^25 + 2 * 1) / 3 = 11184811.33: summed in float32 the terms round to 11184812; the
    float64 mean, cast once, gives the nearest float32, 11184811."""
    big = {"x": np.array([2.0**25], dtype=np.float32)}
    one = {"x": np.array([1.0], dtype=np.float32)}
    mean = weighted_mean([(big, 1.0), (one, 2.0)])["x"]
    assert mean[0] == np.float32((2.0**25 + 2.0) / 3) == 11184811


def test_nothing_to_aggregate_is_a_message_error():
    with pytest.raises(MessageError, match="no contributions"):
        weighted_mean([])


@pytest.mark.parametrize("payload, fragment", [
    ({"w": np.zeros((2, 3), np.float32)}, r"client-5 sent fields \['w'\], expected \['b', "),
    ({"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32),
      "count": np.zeros(1, np.int64)}, "client-5 sent w with shape"),
    ({"w": np.zeros((2, 3), np.float64), "b": np.zeros(3, np.float32),
      "count": np.zeros(1, np.int64)}, "client-5 sent w with shape .* float64, expected"),
    ({"w": np.zeros((2, 3), np.float32), "b": np.array([0, np.inf, 0], np.float32),
      "count": np.zeros(1, np.int64)}, "client-5 sent b containing NaN or Inf"),
])
def test_a_payload_unlike_the_template_is_refused_naming_sender_and_field(payload, fragment):
    reference = {name: np.zeros(shape, dtype) for name, (shape, dtype) in TEMPLATE.items()}
    with pytest.raises(MessageError, match=fragment):
        check_payload("client-5", payload, reference)


def test_without_a_reference_only_finiteness_is_checked():
    check_payload("client-1", {"any": np.zeros((7,), np.float64),
                               "ids": np.array([1, 2], np.int64)}, None)
    with pytest.raises(MessageError, match="client-1 sent any containing NaN"):
        check_payload("client-1", {"any": np.array([np.nan])}, None)


def test_flatten_orders_fields_by_name_and_unflatten_restores_shapes_and_dtypes():
    payload = {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
               "b": np.array([10, 11, 12], np.float32), "count": np.array([7], np.int64)}
    vector = flatten(payload, TEMPLATE)
    assert vector.dtype == np.float64
    assert vector.tolist() == [10, 11, 12, 7, 0, 1, 2, 3, 4, 5]  # b, count, w
    back = unflatten(vector, TEMPLATE)
    for name, (shape, dtype) in TEMPLATE.items():
        assert back[name].shape == shape and back[name].dtype == dtype
        assert np.array_equal(back[name], payload[name])
