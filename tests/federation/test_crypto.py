"""Key agreement, sealing and signatures (secureffm/federation/crypto.py).

Truths used: the Diffie-Hellman test vector of RFC 7748 (section 6.1), HKDF written out from
RFC 5869 with the standard library's HMAC, AES-GCM's tag size (16 bytes), and for Ed25519
(RFC 8032) cryptography's OpenSSL verifier and forgeries built from the group order L and
libsodium's base-point multiplication.
"""

from __future__ import annotations

import hashlib
import hmac
from unittest.mock import patch

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import crypto_scalarmult_ed25519_base_noclamp

from secureffm.errors import ProtocolError
from secureffm.federation import crypto
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
    verify_signatures,
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
# Ed25519's group order, and its points of small order (libsodium's blocklist: the identity
# 01 00..00, the order-2 point, two encodings of an order-4 point, the order-8 points and their
# encodings with the sign bit set).
L = 2**252 + 27742317777372353535851937790883648493
IDENTITY = bytes([1]) + bytes(31)
SMALL_ORDER_ED25519 = [
    IDENTITY.hex(), "ec" + "ff" * 30 + "7f", "00" * 32, "00" * 31 + "80",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85"]


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


@settings(max_examples=100, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), data=st.binary(max_size=400))
def test_libsodium_signing_gives_openssls_signature_bytes(seed, data):
    """Identity signs with libsodium; Ed25519 is deterministic (RFC 8032), so the bytes must be
    those cryptography's OpenSSL signer makes from the same key: an independent reference."""
    private = Ed25519PrivateKey.from_private_bytes(seed)
    assert Identity(private).sign(data) == private.sign(data)


def _openssl_verifies(public: bytes, signature: bytes, data: bytes) -> bool:
    """cryptography's (OpenSSL's) verdict, the reference verify_signature is checked against."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def _tampered(data: bytes, bit: int) -> bytes:
    """``data`` with bit ``bit`` (taken modulo its length in bits) flipped."""
    bit %= 8 * len(data)
    return data[:bit // 8] + bytes([data[bit // 8] ^ (1 << bit % 8)]) + data[bit // 8 + 1:]


@settings(max_examples=150, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), data=st.binary(max_size=300),
       part=st.sampled_from(["message", "signature", "key"]), bit=st.integers(0, 2**16))
def test_signatures_of_our_signer_verify_and_a_flipped_bit_fails_as_with_openssl(seed, data,
                                                                                 part, bit):
    """Each valid signature of Identity verifies; one flipped bit in the message, signature or
    key fails; OpenSSL gives the same verdict on both."""
    identity = Identity(Ed25519PrivateKey.from_private_bytes(seed))
    signature = identity.sign(data)
    assert verify_signature(identity.public, signature, data)
    assert _openssl_verifies(identity.public, signature, data)
    inputs = {"key": identity.public, "signature": signature, "message": data}
    if part == "message" and not data:
        inputs["message"] = b"\x00"  # the empty message has no bit to flip: add a byte
    else:
        inputs[part] = _tampered(inputs[part], bit)
    tampered = (inputs["key"], inputs["signature"], inputs["message"])
    assert not verify_signature(*tampered)
    assert not _openssl_verifies(*tampered)


@settings(max_examples=25, deadline=None)
@given(verdicts=st.lists(st.sampled_from(["valid", "message", "signature", "key", "short"]),
                         max_size=300), cpus=st.integers(1, 6))
def test_a_batch_gives_each_signature_openssls_verdict_in_order(verdicts, cpus):
    """verify_signatures splits a large batch over threads: each answer must be that item's
    own (OpenSSL's verdict), in order, whatever the batch's size, the CPUs and where the bad
    ones sit."""
    signers = [Identity() for _ in range(3)]
    items = []
    for i, kind in enumerate(verdicts):
        signer, data = signers[i % 3], f"record {i}".encode()
        public, signature = signer.public, signer.sign(data)
        if kind == "message":
            data += b"!"
        elif kind == "signature":
            signature = _tampered(signature, i)
        elif kind == "key":
            public = signers[(i + 1) % 3].public
        elif kind == "short":
            signature = signature[:63]
        items.append((public, signature, data))
    with patch.object(crypto, "_usable_cpus", lambda: cpus):
        assert verify_signatures(items) == [kind == "valid" for kind in verdicts]
    assert [kind == "valid" for kind in verdicts] == [_openssl_verifies(*i) for i in items]


def test_a_non_canonical_s_fails():
    """S + L is S modulo the group order, so [S + L]B = [S]B: a verifier that does not require
    S < L accepts this second signature of the same message (malleability)."""
    identity = Identity()
    signature = identity.sign(b"record 7")
    s = int.from_bytes(signature[32:], "little")
    malleated = signature[:32] + (s + L).to_bytes(32, "little")
    assert malleated != signature
    assert not verify_signature(identity.public, malleated, b"record 7")


@pytest.mark.parametrize("point", SMALL_ORDER_ED25519)
def test_a_small_order_public_key_fails(point):
    """A small-order key A makes [k]A vanish when its order divides k = H(R || A || M) mod L;
    then R = [s]B with S = s satisfies [S]B = R + [k]A without any private key. The message is
    searched until the order (a divisor of 8) divides k."""
    public = bytes.fromhex(point)
    s = (123456789).to_bytes(32, "little")
    r = crypto_scalarmult_ed25519_base_noclamp(s)
    message = next(m for m in (b"forged %d" % i for i in range(1000))
                   if int.from_bytes(hashlib.sha512(r + public + m).digest(), "little") % L % 8
                   == 0)
    assert not verify_signature(public, r + s, message)


def test_the_identity_key_forgery_is_universal_under_openssl_and_fails_here():
    """Under the identity point every k vanishes: R = [s]B, S = s passes OpenSSL's cofactorless
    check for any message (what verify_signature used before libsodium), and fails here."""
    s = (987654321).to_bytes(32, "little")
    forged = crypto_scalarmult_ed25519_base_noclamp(s) + s
    for message in (b"record 7", b"any other record"):
        assert _openssl_verifies(IDENTITY, forged, message)
        assert not verify_signature(IDENTITY, forged, message)


def test_a_small_order_r_fails_though_the_key_holder_made_it():
    """R = identity and S = k a mod L (a: the signer's secret scalar) satisfies [S]B = R + [k]A;
    OpenSSL accepts it, libsodium refuses small-order R. Our signer never makes one (its R is
    [r]B for a hash r)."""
    seed = bytes(range(32))
    identity = Identity(Ed25519PrivateKey.from_private_bytes(seed))
    a = bytearray(hashlib.sha512(seed).digest()[:32])
    a[0] &= 248
    a[31] = (a[31] & 127) | 64
    k = int.from_bytes(hashlib.sha512(IDENTITY + identity.public + b"m").digest(), "little")
    signature = IDENTITY + (k * int.from_bytes(a, "little") % L).to_bytes(32, "little")
    assert _openssl_verifies(identity.public, signature, b"m")
    assert not verify_signature(identity.public, signature, b"m")


@pytest.mark.parametrize("cut", [-1, 1])
def test_a_signature_one_byte_short_or_long_fails_though_its_bytes_verify(cut):
    """The signature and message moved by one byte at their border concatenate to the signed
    bytes libsodium opens (signature || message): only the length check refuses them."""
    identity = Identity()
    signed = identity.sign(b"record 7") + b"record 7"
    assert not verify_signature(identity.public, signed[:64 + cut], signed[64 + cut:])


@pytest.mark.parametrize("public", ["key + 1 byte", "key - 1 byte", "empty"])
def test_a_key_of_the_wrong_length_returns_false_without_raising(public):
    """A 33-byte key whose first 32 bytes are the signer's (what libsodium reads) fails too."""
    identity = Identity()
    signature = identity.sign(b"m")
    key = {"key + 1 byte": identity.public + b"\x00", "key - 1 byte": identity.public[:31],
           "empty": b""}[public]
    assert not verify_signature(key, signature, b"m")
