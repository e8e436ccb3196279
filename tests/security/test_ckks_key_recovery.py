"""Li and Micciancio's key recovery (EUROCRYPT 2021) against the ``ckks`` stage's decryptions.

Adversary: the honest-but-curious server. It follows the protocol, keeps its log, and holds
only public things: the public context (parameters) and SEAL's public code. A decryptor's
reply is the real part of each slot of Dec(c) = c0 + c1 s (mod q), decoded; SEAL's encoder
turns 2 Delta times those reals back into m + m* (m* (X) = m(X^-1)) exactly when they are
exact. In SEAL's NTT order (index i holds the value at w^(2 brv(i) + 1)) the involution *
pairs index i with N - 1 - i, so every ciphertext gives, for each pair (i, j = N - 1 - i),

    c1[i] s[i] + c1[j] s[j] = T[i] - c0[i] - c0[j]   (mod q),   T = NTT(m + m*),

and two ciphertexts with different c1 (two rounds' sums: the server built both) are a 2 x 2
system per pair: the whole secret key, and with it every upload in the log. Flooding each
decrypted slot with Gaussian noise far above the error
(:meth:`~secureffm.protocols.ckks_params.CKKSParams.flood_sigma`) leaves the server T plus noise,
and the system gives nothing like the key.

Truths used: the clients' secret key (its NTT residues, read from a client's context) and the
victim's own update.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
import tenseal.sealapi as seal
import torch

from secureffm.federation import Client, MessageLog
from secureffm.federation.message import deserialize_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.ckks import CKKSStage, decrypt, read_ciphertexts
from secureffm.runs.scaffold import open_channel

D = 4096  # one full ciphertext per round: every slot decrypted
WEIGHTS = dict.fromkeys(("client-1", "client-2", "client-3"), 1.0)  # he takes no other
# The shipped `he` parameters until the fix: one 60-bit data prime, scale 2^40. Decryptions of
# these are exact enough for the attack (the control below shows it).
EXACT_ENOUGH = {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40], "scale_bits": 40}


def _updates(round_: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(round_)
    return {c: rng.uniform(-2, 2, D).astype(np.float32) for c in WEIGHTS}


def _run(folder: Path, spec: dict | None):
    """Two rounds of ``he`` (or of a spec with ``spec``'s parameters), payloads logged."""
    if spec is None:
        protocol = load_protocol("he")
    else:
        lines = ['name = "he-exact"', "", "[[stages]]", 'stage = "ckks"',
                 'protects = ["gradient"]'] + [f"{k} = {json.dumps(v)}" for k, v in spec.items()]
        (folder / "spec.toml").write_text("\n".join(lines) + "\n")
        protocol = load_protocol(str(folder / "spec.toml"))
    clients = [Client(c, torch.zeros(1, 2), torch.Generator().manual_seed(i))
               for i, c in enumerate(WEIGHTS)]
    channel = open_channel(protocol, clients, MessageLog(folder / "messages.jsonl",
                                                         keep_payloads=True))
    for round_ in (1, 2):
        xs = _updates(round_)
        result = channel.aggregate(round_, "gradient", lambda c, xs=xs: {"g": xs[c.id]}, WEIGHTS,
                                   {"g": ((D,), np.dtype(np.float32))})
        assert result.included == list(WEIGHTS)
    channel.close()
    return channel, protocol.stages[0].params


def _logged(folder: Path, phase: str, round_: int) -> bytes:
    records = [json.loads(x) for x in (folder / "messages.jsonl").read_text().splitlines()]
    blob = (folder / "payloads.bin").read_bytes()
    [r] = [r for r in records if r["phase"] == phase and r["round"] == round_]
    return blob[r["offset"]:r["offset"] + r["bytes"]]


# -- the attack: public code and the server's view only -------------------------------------------

class _Seal:
    """SEAL's encoder and parsing for the public parameters of ``context`` (no key)."""

    def __init__(self, context: ts.Context):
        parms = context.seal_context().data.key_context_data().parms()
        self.n = parms.poly_modulus_degree()
        self.primes = [m.value() for m in parms.coeff_modulus()]
        self.q = self.primes[0]  # s is ternary: its residues mod one prime give it all
        ours = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
        ours.set_poly_modulus_degree(self.n)
        ours.set_coeff_modulus([seal.Modulus(p) for p in self.primes])
        self.context = seal.SEALContext(ours, True, seal.SEC_LEVEL_TYPE.TC128)
        self.encoder = seal.CKKSEncoder(self.context)

    def parts(self, vector: ts.CKKSVector) -> tuple[np.ndarray, np.ndarray]:
        """(c0, c1) mod q in SEAL's NTT form, through SEAL's own serialization."""
        with tempfile.NamedTemporaryFile() as f:
            vector.ciphertext()[0].save(f.name)
            ciphertext = seal.Ciphertext()
            ciphertext.load(self.context, f.name)
        data = ciphertext.dyn_array()
        words = np.array([data.at(i) for i in range(2 * self.n)], dtype=object)
        return words[:self.n], words[self.n:]

    def symmetrized(self, reals: np.ndarray, scale: float) -> np.ndarray:
        """NTT(m + m*) mod q from the decrypted reals Re(m(zeta))/Delta of every slot."""
        plain = seal.Plaintext()
        self.encoder.encode(list(reals), self.context.first_parms_id(), 2 * scale, plain)
        return np.array([plain.data(i) for i in range(self.n)], dtype=object)


def recover_key(server_context: ts.Context, queries: list[tuple[bytes, np.ndarray]], params,
                ) -> np.ndarray:
    """The secret key's NTT residues mod the first prime, [N] Python ints, from two (summed
    ciphertexts the server sent, the reals a decryptor returned) pairs."""
    sl = _Seal(server_context)
    q, pair = sl.q, np.arange(sl.n)[::-1]
    rows = []
    for data, reals in queries:
        [vector] = read_ciphertexts(server_context, data, 1, params, "server")
        c0, c1 = sl.parts(vector)
        t = sl.symmetrized(reals, params.scale)
        rows.append((c1, c1[pair], (t - c0 - c0[pair]) % q))
    (a, b, u), (c, d, w) = rows
    det = (a * d - b * c) % q
    inverse = np.array([pow(int(x), -1, q) for x in det], dtype=object)
    return (u * d - b * w) * inverse % q


def _key_residues(context: ts.Context, n: int) -> np.ndarray:
    key = context.secret_key().data.data()
    return np.array([key.data(i) for i in range(n)], dtype=object)


def _attack(folder: Path, channel, params, exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """(recovered, true) key residues; the decrypted reals are the logged replies, or (the
    control, ``exact``) the same ciphertexts decrypted exactly with the clients' key."""
    server = channel.server.memory["ckks"]["context"]
    key = channel.clients[0].memory["ckks"]["context"]
    queries = []
    for round_ in (1, 2):
        data = _logged(folder, "he_sum", round_)
        if exact:
            reals = decrypt(key, read_ciphertexts(key, data, 1, params, "server"), D)
        else:
            reals = deserialize_payload(_logged(folder, "he_decrypted", round_))["sum"]
        queries.append((data, reals))
    true = _key_residues(key, params.poly_modulus_degree)
    return recover_key(server, queries, params), true


@pytest.fixture(scope="module")
def exact_enough_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("he-exact")
    return (folder, *_run(folder, EXACT_ENOUGH))


def test_from_exact_decryptions_the_server_recovers_the_shared_key(exact_enough_run):
    """The control: the attack works. Fed exact decryptions of the two sums it logged (what
    the decryptor returned before flooding), the server solves for the key the clients share,
    every residue of it."""
    folder, channel, params = exact_enough_run
    recovered, true = _attack(folder, channel, params, exact=True)
    assert np.array_equal(recovered, true)


def test_flooded_decryptions_do_not_give_the_server_the_key(exact_enough_run):
    """The protocol's replies, at the same parameters, flooded by the decryptor: the same
    attack matches the key in no more residues than chance (a residue is a uniform 60-bit
    number when the system is solved with noise)."""
    folder, channel, params = exact_enough_run
    recovered, true = _attack(folder, channel, params, exact=False)
    assert np.count_nonzero(recovered == true) <= 2


def test_the_shipped_he_does_not_give_the_server_the_key(tmp_path):
    """The same attack against the shipped ``he`` protocol's two logged rounds."""
    channel, params = _run(tmp_path, None)
    recovered, true = _attack(tmp_path, channel, params, exact=False)
    assert np.count_nonzero(recovered == true) <= 2


def test_the_flooded_sum_still_is_the_weighted_sum(exact_enough_run):
    """What the flooding costs: the logged sum of round 2 is within 8 flood deviations of the
    exact weighted sum of the clients' inputs."""
    folder, _, params = exact_enough_run
    scale = CKKSStage.scales(WEIGHTS)
    exact = sum(scale[c] * x.astype(np.float64) for c, x in _updates(2).items())
    got = deserialize_payload(_logged(folder, "he_decrypted", 2))["sum"]
    sigma = params.flood_sigma(len(WEIGHTS), 1)
    assert np.abs(got - exact).max() <= 8 * sigma + params.error_bound(3, 12.0)
