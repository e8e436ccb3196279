"""CKKS parameters (secureffm/protocols/ckks_params.py): the security table, the decodable range
and the approximation error bound.

Truths used: the HE security standard's Table 1 as printed (homomorphicencryption.org, 128-bit
classical), SEAL's own refusal of parameters beyond it (through TenSEAL, which knows nothing
of our table), and sums computed in float64 from the same inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from secureffm.errors import ProtocolError
from secureffm.protocols.ckks import decrypt, encrypt, new_context
from secureffm.protocols.ckks_params import MAX_BITS_128, CKKSParams

SHIPPED = {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40, 40], "scale_bits": 60}


def params(**changes) -> CKKSParams:
    return CKKSParams.from_table({**SHIPPED, **changes}, "spec.toml (stage 'ckks')")


def test_the_table_is_the_standards_128_bit_column():
    assert MAX_BITS_128 == {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}


@pytest.mark.parametrize("degree, at_limit, beyond", [
    (2048, [27, 27], [27, 28]),
    (4096, [60, 49], [60, 50]),
    (8192, [60, 60, 60, 38], [60, 60, 60, 39]),
    (16384, [60] * 6 + [58, 20], [60] * 6 + [59, 20]),
])
def test_the_limit_is_where_seal_itself_refuses(degree, at_limit, beyond):
    """Accepted at the table's limit, refused one bit above with the limit in the message, and
    SEAL draws the same line."""
    scale = 10
    accepted = params(poly_modulus_degree=degree, coeff_mod_bit_sizes=at_limit, scale_bits=scale)
    assert sum(accepted.coeff_mod_bit_sizes) == MAX_BITS_128[degree]
    ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=at_limit, n_threads=1,
               encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC)
    with pytest.raises(ProtocolError, match=rf"stage 'ckks'.*total {sum(beyond)} bits.*at most "
                                            rf"{MAX_BITS_128[degree]} bits at poly_modulus_"
                                            rf"degree = {degree}"):
        params(poly_modulus_degree=degree, coeff_mod_bit_sizes=beyond, scale_bits=scale)
    with pytest.raises(ValueError, match="encryption parameters are not set correctly"):
        ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=beyond, n_threads=1,
                   encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC)


@pytest.mark.parametrize("change, fragment", [
    ({"poly_modulus_degree": 6000}, "poly_modulus_degree = 6000; give one of 1024"),
    ({"poly_modulus_degree": 65536}, "give one of .*32768 .the HE security standard"),
    ({"coeff_mod_bit_sizes": [60]}, "at least two prime sizes"),
    ({"coeff_mod_bit_sizes": [61, 40]}, "20 to 60 bits"),
    ({"coeff_mod_bit_sizes": "60,40"}, "at least two prime sizes"),
    ({"scale_bits": 88}, "scale_bits = 88; give an integer from 1 to 87"),
    ({"scale_bits": 0}, "scale_bits = 0"),
    ({"scale_bits": 40.0}, "scale_bits = 40.0"),
])
def test_bad_parameters_are_refused_by_name(change, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        params(**change)


def test_the_shipped_parameters():
    p = params()
    assert (p.slots, p.data_bits, p.scale) == (4096, 100, 2.0**60)
    assert (p.decodable, p.sum_limit, p.input_limit(10)) == (2.0**37, 2.0**36, 2.0**36 / 10)
    assert [p.ciphertexts(d) for d in (1, 4096, 4097, 10**6)] == [1, 1, 2, 245]


@pytest.mark.parametrize("inputs, magnitude", [(1, 1e-3), (2, 8.0), (10, 8.0), (10, 2.0**14)])
def test_an_encrypted_sum_lies_within_the_error_bound(inputs, magnitude):
    p = params()
    context = new_context(p)
    rng = np.random.default_rng(inputs)
    xs = [rng.uniform(-magnitude, magnitude, 5000) / inputs for _ in range(inputs)]
    vectors = [encrypt(context, x, p) for x in xs]
    total = vectors[0]
    for more in vectors[1:]:
        total = [a + b for a, b in zip(total, more, strict=True)]
    error = np.abs(decrypt(context, total, 5000) - np.sum(xs, axis=0)).max()
    bound = p.error_bound(inputs, magnitude)
    assert error <= bound
    assert bound < 2e-6 * inputs + 1e-6 * magnitude  # not vacuous: below float32 noise


@pytest.mark.parametrize("inputs", [1, 3])
def test_the_flooding_noise_is_2_to_the_20_times_a_bound_the_errors_norm_meets(inputs):
    """flood_sigma / 2^20 bounds the Euclidean norm of a sum's error over its slots, measured
    at scale 2^40 (where float64 resolves it), and is within 10 sqrt(n) of it (the bound takes
    every error coefficient at SEAL's largest, 21); at the shipped scale the noise is 1.1e-7
    per input, times sqrt(decryptors)."""
    p = params(coeff_mod_bit_sizes=[60, 40], scale_bits=40)
    context = new_context(p)
    rng = np.random.default_rng(inputs)
    xs = [rng.uniform(-2, 2, p.slots) for _ in range(inputs)]
    total = encrypt(context, xs[0], p)
    for x in xs[1:]:
        total = [a + b for a, b in zip(total, encrypt(context, x, p), strict=True)]
    norm = np.linalg.norm(decrypt(context, total, p.slots) - np.sum(xs, axis=0))
    bound = p.flood_sigma(inputs, 1) / 2.0**20
    assert norm <= bound < 10 * np.sqrt(inputs) * norm
    assert p.flood_sigma(inputs, 4) == 2 * p.flood_sigma(inputs, 1)
    assert 1.1e-7 < params().flood_sigma(1, 1) < 1.2e-7


def test_a_sum_beyond_the_decodable_range_comes_back_wrong():
    """Why ``sum_limit`` exists: a sum of encryptions, each fine on its own, wraps silently
    once its coefficients pass q / 2; below ``sum_limit`` it never does."""
    p = params(coeff_mod_bit_sizes=[50, 40], scale_bits=30)  # decodable: 2^18
    context = new_context(p)
    z = np.ones(p.slots)  # every slot equal: the constant coefficient is Delta * z, the most

    def summed(copies: int, each: float) -> np.ndarray:
        one = encrypt(context, each * z, p)[0]
        total = one
        for _ in range(copies - 1):
            total = total + one
        return decrypt(context, [total], p.slots)

    inside = summed(4, p.sum_limit / 4)
    assert np.abs(inside - p.sum_limit * z).max() <= p.error_bound(4, p.sum_limit)
    outside = summed(16, 4 * p.decodable / 16)  # each input decodes on its own
    assert np.abs(outside - 4 * p.decodable * z).max() > p.decodable
