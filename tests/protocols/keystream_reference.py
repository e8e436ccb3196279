"""An independent reference for the masks' keystream: AES in counter mode written out as
AES-ECB encryptions of the big-endian counter blocks 0, 1, 2, ... (NIST SP 800-38A, section
6.5), checked against the standard's own CTR test vectors; a mask seed of 32 bytes keys
AES-128 with its first 16 bytes and starts the counter at its last 16."""

from __future__ import annotations

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def aes_ctr_keystream(key: bytes, nbytes: int, counter: int = 0) -> bytes:
    """The first ``nbytes`` keystream bytes of AES-CTR under ``key`` (16 bytes: AES-128, 32:
    AES-256) from the 128-bit initial counter ``counter``."""
    blocks = -(-nbytes // 16)
    encrypt = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    counters = b"".join(((counter + i) % 2**128).to_bytes(16, "big") for i in range(blocks))
    return (encrypt.update(counters) + encrypt.finalize())[:nbytes]


def mask_keystream(seed: bytes, nbytes: int) -> bytes:
    """The first ``nbytes`` bytes of a 32-byte mask seed's stream: AES-128-CTR keyed by the
    seed's first 16 bytes, the counter starting at its last 16 (big-endian)."""
    assert len(seed) == 32
    return aes_ctr_keystream(seed[:16], nbytes, int.from_bytes(seed[16:], "big"))
