"""The resolved privacy values methods receive (secureffm/privacy/settings.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from secureffm.privacy.settings import DPSettings, GeodesicPrivacy, NoiseGeometry
from secureffm.protocols.protocol import load_protocol


def test_noise_geometry_sizes_the_sum_by_the_largest_client_and_shares_it_among_the_honest():
    geometry = NoiseGeometry({"a": (3.0, 9.0), "b": (4.0, 12.0)}, honest=2)
    assert geometry.sum_variance(2.0) == pytest.approx((2.0 * 4.0) ** 2)
    assert geometry.share_variance(2.0) == pytest.approx(64.0 / 2)
    # honest shares alone carry the sum's variance
    assert 2 * geometry.share_variance(1.5) == pytest.approx(geometry.sum_variance(1.5))
    assert math.isclose(NoiseGeometry({"a": (1.0, 1.0)}, 1).share_variance(3.0), 9.0)


def test_geodesic_privacy_is_what_the_randomized_t_stage_says():
    privacy = load_protocol("fedwad-private").geodesic_privacy()
    stage = load_protocol("fedwad-private").stage_for("randomized-t", "measure")
    assert privacy == GeodesicPrivacy(stage.t_low, stage.t_high, stage.noise_std)
    assert load_protocol("plaintext").geodesic_privacy() is None


def test_settings_are_frozen_values():
    settings = DPSettings(clip=1.0, delta=1e-5, target_epsilon=8.0, noise_multiplier=None,
                          accountant="prv")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.clip = 2.0  # type: ignore[misc]
    assert settings.noise == "local" and settings.colluders == 0
