"""Key agreement, key derivation, authenticated encryption and signatures, from `cryptography`;
Ed25519 signing and verification from libsodium (PyNaCl).

- X25519 for mask-seed agreement and channel keys (fresh key pairs per aggregation).
- HKDF-SHA256 turns a shared secret into a 32-byte key, bound to a purpose label.
- AES-256-GCM encrypts Shamir shares between clients (the relaying server cannot read them).
- Ed25519 identities (keys made and stored by cryptography) sign every message record of the
  log with libsodium: Ed25519 signatures are deterministic, so they are the bytes cryptography
  would give, in about 0.7x the time (39 us against 55 us per header). Every signature is
  verified with libsodium, about 1.6x as fast as cryptography's OpenSSL (97 us against 159 us
  per verification, docs/benchmarks.md) and stricter: it also refuses small-order public keys
  and R points and non-canonical key encodings, besides the non-canonical S both refuse.
  :func:`verify_signatures` checks a large batch (an audit's) on the CPUs this process may
  use: libsodium's C call releases the GIL.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nacl.bindings import crypto_sign, crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError

from ..errors import ProtocolError

__all__ = [
    "KeyPair",
    "new_key_pair",
    "public_bytes",
    "private_bytes",
    "private_from_bytes",
    "agree",
    "seal",
    "open_sealed",
    "Identity",
    "verify_signature",
    "verify_signatures",
]

RAW = serialization.Encoding.Raw


class KeyPair:
    """An X25519 key pair; ``public`` is the 32-byte raw public key."""

    def __init__(self, private: X25519PrivateKey):
        self.private = private
        self.public = public_bytes(private)


def new_key_pair() -> KeyPair:
    return KeyPair(X25519PrivateKey.generate())


def public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)


def private_bytes(private: X25519PrivateKey) -> bytes:
    """The 32-byte raw private key (what a client Shamir-shares for dropout recovery)."""
    return private.private_bytes(RAW, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())


def private_from_bytes(data: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(data)


def agree(private: X25519PrivateKey, peer_public: bytes, purpose: bytes) -> bytes:
    """HKDF-SHA256(X25519(private, peer_public)) -> 32 bytes, domain-separated by ``purpose``.

    Both sides of a pair derive the same key.
    """
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as err:
        raise ProtocolError(f"invalid X25519 public key: {err}") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"secureffm/" + purpose).derive(shared)


def seal(key: bytes, plaintext: bytes, context: bytes, nonce: bytes) -> bytes:
    """AES-256-GCM encryption bound to ``context`` (associated data); 12-byte ``nonce``."""
    return nonce + AESGCM(key).encrypt(nonce, plaintext, context)


def open_sealed(key: bytes, sealed: bytes, context: bytes) -> bytes:
    """Inverse of :func:`seal`; a wrong key, context or altered ciphertext raises ProtocolError."""
    try:
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], context)
    except InvalidTag:
        raise ProtocolError("ciphertext failed authentication (wrong key, context or "
                            "tampered bytes)") from None


class Identity:
    """A party's long-term Ed25519 signing key; ``public`` is the 32-byte raw public key."""

    def __init__(self, private: Ed25519PrivateKey | None = None):
        self._private = private or Ed25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)
        seed = self._private.private_bytes(RAW, serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())
        self._sodium_key = crypto_sign_seed_keypair(seed)[1]  # seed || public, 64 bytes

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (libsodium's, as cryptography's)."""
        return crypto_sign(data, self._sodium_key)[:64]


def verify_signature(public: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` (64 bytes) is the Ed25519 signature of ``data`` by the 32-byte raw
    key ``public``; False for anything else, wrong lengths included (libsodium's
    ``crypto_sign_open``, whose C call reads 32 key bytes unchecked: the lengths come first).
    """
    if len(public) != 32 or len(signature) != 64:
        return False
    try:
        crypto_sign_open(signature + data, public)
    except BadSignatureError:
        return False
    return True


# A thread takes at least this many verifications (about 100 us each): below a few dozen the
# hand-off between threads costs what it saves (measured: batches of 5-90 ran no faster).
_PER_THREAD = 64
_MAX_THREADS = 8
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that made it, pool)


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _verifiers() -> ThreadPoolExecutor:
    """This process's helper threads (up to seven, started as needed; a forked child makes its
    own pool: threads do not survive a fork)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(_MAX_THREADS - 1, "ed25519-verify"))
    return _pool[1]


def _verify_each(items: Sequence[tuple[bytes, bytes, bytes]]) -> list[bool]:
    return [verify_signature(public, signature, data) for public, signature, data in items]


def verify_signatures(items: Sequence[tuple[bytes, bytes, bytes]]) -> list[bool]:
    """:func:`verify_signature` of each ``(public, signature, data)``, in order: the same
    answers, computed in contiguous chunks on up to eight threads (this one included) when the
    batch gives each at least 64 and the process may use more than one CPU."""
    threads = min(_usable_cpus(), _MAX_THREADS, len(items) // _PER_THREAD)
    if threads < 2:
        return _verify_each(items)
    bounds = [len(items) * i // threads for i in range(threads + 1)]
    chunks = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    pending = [_verifiers().submit(_verify_each, chunk) for chunk in chunks[1:]]
    verdicts = _verify_each(chunks[0])
    for future in pending:
        verdicts += future.result()
    return verdicts
