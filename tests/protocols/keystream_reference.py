"""An independent reference for the masks' keystream: AES-256 in counter mode written out as
AES-256-ECB encryptions of the big-endian counter blocks 0, 1, 2, ... (NIST SP 800-38A,
section 6.5), checked against the standard's own CTR test vector."""

from __future__ import annotations

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def aes_ctr_keystream(key: bytes, nbytes: int, counter: int = 0) -> bytes:
    """The first ``nbytes`` keystream bytes of AES-256-CTR under ``key`` from the 128-bit
    initial counter ``counter``."""
    blocks = -(-nbytes // 16)
    encrypt = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    counters = b"".join(((counter + i) % 2**128).to_bytes(16, "big") for i in range(blocks))
    return (encrypt.update(counters) + encrypt.finalize())[:nbytes]
