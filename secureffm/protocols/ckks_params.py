"""CKKS parameters of the ``ckks`` stage: the security limits they must meet, the range of
values a sum may take, and the approximation error of an encrypted sum.

Security: HomomorphicEncryption.org's Homomorphic Encryption Security Standard (Albrecht et al.,
2018, https://homomorphicencryption.org/standard/), Table 1, classical 128-bit security for a
ternary secret and error of standard deviation 3.2: at polynomial degree N the total
coefficient modulus may have at most :data:`MAX_BITS_128` bits (27, 54, 109, 218, 438, 881 for
N = 2^10 ... 2^15). SEAL, under TenSEAL, enforces the same table; a spec is checked against it
when it is loaded, so a weaker one is refused with the limit in the message.

Values: a vector of up to N/2 reals is one ciphertext (its slots). The last prime of the
coefficient modulus is SEAL's special prime (key switching only); a fresh ciphertext lives
modulo the product q of the L others (``data_bits`` bits in all, so q >= 2^(data_bits - L)).
Slots z encode to coefficients of at most Delta * max|z| (Delta = 2^scale_bits), which decode
correctly while below q / 2: any sum with max|z| < 2^(data_bits - L - 1 - scale_bits) does.
``sum_limit`` is half that, leaving the noise a wide margin; each of n clients' inputs must
stay below ``sum_limit / n``. Past q / 2 a sum wraps silently (a test shows it).

Error: a symmetric encryption of z decrypts to z + (e + r) / Delta in the slots (Delta =
2^scale_bits), with e SEAL's error polynomial (centered binomial, |e_i| <= 21) and r the
rounding of the encoded coefficients (|r_i| <= 1/2). A slot is sum_i p_i zeta^i for a root of
unity zeta, so it moves by at most N * max_i |p_i|: at most N * 21.5 / Delta per input, and the
errors of n inputs add. Encoding and decoding run an FFT in double precision; ``error_bound``
adds 2 N log2(N) 2^-52 (magnitude + 1) for it, a loose allowance.

Flooding: CKKS is not IND-CPA-D (Li and Micciancio, EUROCRYPT 2021): the exact decryption of a
ciphertext someone else holds gives them the error, hence the secret key
(tests/security/test_ckks_key_recovery.py). A decryptor therefore adds to every slot it
returns Gaussian noise of standard deviation ``flood_sigma`` = 2^(lambda/2) sqrt(k) B, lambda =
:data:`FLOOD_SECURITY` = 40, k the decryptors, B a bound on the Euclidean norm of a
ciphertext's error over its N/2 real slots: a slot is a sum of N coefficients times roots of
unity, so by Parseval the slots' norm is at most sqrt(N/2) ||e||_2 <= N / sqrt(2) ||e||_inf,
with ||e||_inf <= n (21 + 1/2) for a sum of n fresh encryptions: B = n N (21 + 1/2) /
(sqrt(2) Delta). Against a view without the error (the exact sums plus the same noise), Q
flooded decryptions under one key have KL divergence at most Q k B^2 / (2 sigma^2) = Q 2^-41
nats and Renyi divergence of order a at most exp(a Q 2^-41): for a search problem such as key
recovery, success drops by at most that factor's power (1 - 1/a) (Bai et al., ASIACRYPT
2015); flooding by 2^(lambda/2) times the error is Li, Micciancio, Schultz and Sorrell's
(CRYPTO 2022) and OpenFHE's NOISE_FLOODING_DECRYPT's shape. The price is precision:
``flood_sigma`` per coordinate of the sum (1.1e-7 n at the shipped N = 8192, Delta = 2^60).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = ["MAX_BITS_128", "FLOOD_SECURITY", "CKKSParams"]

# Polynomial degree -> the largest total coefficient modulus (bits) for 128-bit security.
MAX_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
_STANDARD = ("the HE security standard (homomorphicencryption.org, Table 1: 128-bit classical "
             "security)")
_ERROR_MAX = 21  # SEAL's centered binomial error: |e_i| <= 21 (standard deviation 3.24)
_PRIME_BITS = (20, 60)  # what SEAL's CoeffModulus::Create accepts per prime
_MIN_HEADROOM_BITS = 10  # log2 of the smallest decodable range a spec may leave
FLOOD_SECURITY = 40  # lambda: flooding noise is 2^(lambda/2) times the error's bound


@dataclass(frozen=True)
class CKKSParams:
    """``poly_modulus_degree`` N, ``coeff_mod_bit_sizes`` (bits per prime, the special prime
    last), ``scale_bits`` (log2 of the encoding scale Delta)."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int

    @classmethod
    def from_table(cls, table: dict, where: str) -> CKKSParams:
        """Read and check ``poly_modulus_degree``, ``coeff_mod_bit_sizes`` and ``scale_bits``;
        a ProtocolError names the key and the limit it breaks."""
        degree = table["poly_modulus_degree"]
        if degree not in MAX_BITS_128 or isinstance(degree, bool):
            raise ProtocolError(f"{where}: poly_modulus_degree = {degree!r}; give one of "
                                f"{', '.join(map(str, MAX_BITS_128))} ({_STANDARD})")
        sizes = table["coeff_mod_bit_sizes"]
        if (not isinstance(sizes, list) or len(sizes) < 2 or not all(
                isinstance(b, int) and not isinstance(b, bool)
                and _PRIME_BITS[0] <= b <= _PRIME_BITS[1] for b in sizes)):
            raise ProtocolError(f"{where}: coeff_mod_bit_sizes = {sizes!r}; give at least two "
                                f"prime sizes of {_PRIME_BITS[0]} to {_PRIME_BITS[1]} bits "
                                "(the last is the special prime, for key switching)")
        limit = MAX_BITS_128[degree]
        if sum(sizes) > limit:
            raise ProtocolError(
                f"{where}: coeff_mod_bit_sizes = {sizes} total {sum(sizes)} bits, but "
                f"{_STANDARD} allows at most {limit} bits at poly_modulus_degree = {degree}; "
                "drop or shrink primes, or raise poly_modulus_degree")
        scale = table["scale_bits"]
        params = cls(degree, tuple(sizes), scale)
        most = params.data_bits - (len(sizes) - 1) - 1 - _MIN_HEADROOM_BITS
        if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= most:
            raise ProtocolError(
                f"{where}: scale_bits = {scale!r}; give an integer from 1 to {most}, so that "
                f"sums up to 2^{_MIN_HEADROOM_BITS} decode under the {params.data_bits}-bit data "
                "modulus (or raise the data primes)")
        return params

    @property
    def slots(self) -> int:
        """Reals per ciphertext: N / 2."""
        return self.poly_modulus_degree // 2

    @property
    def data_bits(self) -> int:
        """log2 of the modulus of a fresh ciphertext: every prime but the special one."""
        return sum(self.coeff_mod_bit_sizes[:-1])

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    @property
    def decodable(self) -> float:
        """Every sum with max|z| below 2^(data_bits - L - 1 - scale_bits) decodes, L the number
        of data primes."""
        primes = len(self.coeff_mod_bit_sizes) - 1
        return float(2 ** (self.data_bits - primes - 1 - self.scale_bits))

    @property
    def sum_limit(self) -> float:
        """The largest |sum| per coordinate this stage lets a sum reach: half the decodable
        range."""
        return self.decodable / 2

    def input_limit(self, clients: int) -> float:
        """The largest |coordinate| of one client's scaled input: sum_limit / clients."""
        return self.sum_limit / clients

    def ciphertexts(self, size: int) -> int:
        """Ciphertexts for a vector of ``size`` reals, every slot used: ceil(size / (N/2))."""
        return -(-size // self.slots)

    def error_bound(self, inputs: int, magnitude: float) -> float:
        """Bound on |decrypted sum - exact sum| per coordinate for a sum of ``inputs`` fresh
        encryptions whose values (inputs and sum) are at most ``magnitude`` in absolute value
        (see the module docstring)."""
        n = self.poly_modulus_degree
        noise = inputs * n * (_ERROR_MAX + 0.5) / self.scale
        return noise + 2 * n * math.log2(n) * 2.0**-52 * (magnitude + 1)

    def flood_sigma(self, inputs: int, decryptors: int) -> float:
        """Standard deviation of the Gaussian noise a decryptor adds to each slot of a sum of
        ``inputs`` fresh encryptions that ``decryptors`` decrypt: 2^(lambda/2) sqrt(decryptors)
        times the bound n N (21 + 1/2) / (sqrt(2) Delta) on the error's norm over the slots
        (see the module docstring)."""
        n = self.poly_modulus_degree
        bound = inputs * n * (_ERROR_MAX + 0.5) / (math.sqrt(2) * self.scale)
        return 2.0 ** (FLOOD_SECURITY / 2) * math.sqrt(decryptors) * bound
