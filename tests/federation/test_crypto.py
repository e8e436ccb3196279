"""Key agreement, sealing and signatures (secureffm/federation/crypto.py).

Truths used: the Diffie-Hellman test vector of RFC 7748 (section 6.1), HKDF written out from
RFC 5869 with the standard library's HMAC, and AES-GCM's tag size (16 bytes).
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secureffm.errors import ProtocolError
from secureffm.federation.crypto import (
    Identity,
    agree,
    new_key_pair,
    open_sealed,
    private_bytes,
    private_from_bytes,
    public_bytes,
    seal,
    verify_signature,
)

# RFC 7748, 6.1: Alice's and Bob's keys and their shared secret.
ALICE_PRIVATE = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
ALICE_PUBLIC = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
BOB_PRIVATE = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"
BOB_PUBLIC = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
SHARED = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
# Points of small order (RFC 7748 section 7; Bernstein's list): 0, 1, an order-8 point, and
# p - 1 and p encoded little-endian.
LOW_ORDER = ["00" * 32, "01" + "00" * 31,
             "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
             "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
             "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"]
NONCE = bytes(range(12))


def _hkdf_sha256(secret: bytes, info: bytes) -> bytes:
    """RFC 5869 with no salt (HashLen zero bytes) and 32 bytes of output (one block)."""
    prk = hmac.new(bytes(32), secret, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def test_agree_is_hkdf_of_the_rfc_7748_shared_secret_on_both_sides():
    alice = private_from_bytes(bytes.fromhex(ALICE_PRIVATE))
    bob = private_from_bytes(bytes.fromhex(BOB_PRIVATE))
    assert public_bytes(alice).hex() == ALICE_PUBLIC and public_bytes(bob).hex() == BOB_PUBLIC
    expected = _hkdf_sha256(bytes.fromhex(SHARED), b"secureffm/mask")
    assert agree(alice, bytes.fromhex(BOB_PUBLIC), b"mask") == expected
    assert agree(bob, bytes.fromhex(ALICE_PUBLIC), b"mask") == expected
    assert agree(alice, bytes.fromhex(BOB_PUBLIC), b"channel") != expected  # purpose separates


def test_fresh_pairs_agree_pairwise_and_a_third_party_gets_another_key():
    a, b, c = new_key_pair(), new_key_pair(), new_key_pair()
    assert len(a.public) == 32 and a.public == public_bytes(a.private)
    assert agree(a.private, b.public, b"x") == agree(b.private, a.public, b"x")
    assert agree(c.private, b.public, b"x") != agree(a.private, b.public, b"x")


def test_a_private_key_survives_its_byte_form():
    """What a client Shamir-shares restores the same key (the same agreements)."""
    a, b = new_key_pair(), new_key_pair()
    restored = private_from_bytes(private_bytes(a.private))
    assert len(private_bytes(a.private)) == 32
    assert agree(restored, b.public, b"x") == agree(a.private, b.public, b"x")


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_and_malformed_public_keys_are_refused(point):
    """A peer that sends a small-order point would force a known all-zero shared secret."""
    with pytest.raises(ProtocolError, match="invalid X25519 public key"):
        agree(new_key_pair().private, bytes.fromhex(point), b"mask")


def test_a_public_key_of_the_wrong_length_is_refused():
    with pytest.raises(ProtocolError, match="invalid X25519 public key"):
        agree(new_key_pair().private, bytes(31), b"mask")


def test_seal_is_aes_gcm_with_the_nonce_in_front_and_opens_only_with_key_and_context():
    key = bytes(range(32))
    sealed = seal(key, b"shares of client-2", b"round 3", NONCE)
    assert sealed[:12] == NONCE and len(sealed) == 12 + len(b"shares of client-2") + 16
    assert AESGCM(key).decrypt(NONCE, sealed[12:], b"round 3") == b"shares of client-2"
    assert open_sealed(key, sealed, b"round 3") == b"shares of client-2"
    for bad_key, context, data in [(bytes(32), b"round 3", sealed),
                                   (key, b"round 4", sealed),
                                   (key, b"round 3", sealed[:-1] + bytes([sealed[-1] ^ 1])),
                                   (key, b"round 3", sealed[:5] + b"\x00" + sealed[6:])]:
        with pytest.raises(ProtocolError, match="failed authentication"):
            open_sealed(bad_key, data, context)


def test_signatures_verify_only_for_the_signer_and_the_exact_bytes():
    alice, mallory = Identity(), Identity()
    signature = alice.sign(b"record 7")
    assert len(alice.public) == 32 and len(signature) == 64
    assert verify_signature(alice.public, signature, b"record 7")
    assert not verify_signature(mallory.public, signature, b"record 7")
    assert not verify_signature(alice.public, signature, b"record 8")
    assert not verify_signature(alice.public, bytes([signature[0] ^ 1]) + signature[1:],
                                b"record 7")
    assert not verify_signature(bytes(31), signature, b"record 7")  # no exception either


def test_an_identity_built_from_a_key_signs_with_that_key():
    private = Ed25519PrivateKey.from_private_bytes(bytes(32))
    identity = Identity(private)
    private.public_key().verify(identity.sign(b"m"), b"m")  # raises if not this key's
    assert verify_signature(identity.public, private.sign(b"m"), b"m")
