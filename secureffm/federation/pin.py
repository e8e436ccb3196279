"""A run's keys and pin: reading ``parties.json``, fingerprints, and pins kept apart.

``parties.json`` maps each party to its public keys, ``{"sign": hex, "seal": hex}``: the
Ed25519 key that verifies its log records and the X25519 key others seal messages to (``seal``
is absent for a party that seals nothing, such as a centralized run's single party). A party's
fingerprint is the sha256 (hex) of its entry as canonical JSON (sorted keys, compact).

A pin, ``{"head": ..., "parties_sha256": ..., "fingerprints": {party: ...}}``, is what a user
keeps apart from the run folder: the head (sha256 of the closing line, which the hash chain ties
to every record and to parties.json) and the keys. Anyone who can write the run folder can
regenerate every key and re-sign a rebuilt log that verifies on its own; compared with a pin
taken before they could, the rebuild shows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import SecureFFMError
from .message import is_hex

__all__ = ["PartyKeys", "RunPin", "parse_parties", "load_parties", "load_pin", "pin_of",
           "sha256_hex", "is_hex"]

_PIN_FIELDS = {"head", "parties_sha256", "fingerprints"}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class PartyKeys:
    """One party's public keys: ``sign`` (Ed25519, 32 bytes), ``seal`` (X25519, 32 bytes or
    None)."""

    sign: bytes
    seal: bytes | None

    def entry(self) -> dict[str, str]:
        """The party's entry in parties.json."""
        keys = {"sign": self.sign.hex()}
        if self.seal is not None:
            keys["seal"] = self.seal.hex()
        return keys

    @property
    def fingerprint(self) -> str:
        """sha256 (hex) of :meth:`entry` as canonical JSON."""
        return sha256_hex(json.dumps(self.entry(), sort_keys=True, separators=(",", ":")).encode())


@dataclass(frozen=True)
class RunPin:
    """What was pinned apart from the run folder; None where nothing was.

    ``head``: sha256 of the closing line; ``parties_sha256``: sha256 of parties.json as written;
    ``fingerprints``: party -> :attr:`PartyKeys.fingerprint`.
    """

    head: str | None = None
    parties_sha256: str | None = None
    fingerprints: dict[str, str] | None = None

    def as_dict(self) -> dict:
        """The pin file's JSON object."""
        return {"head": self.head, "parties_sha256": self.parties_sha256,
                "fingerprints": self.fingerprints}

    def key_differences(self, parties: dict[str, PartyKeys], parties_text: bytes) -> str | None:
        """None when ``parties`` (read from ``parties_text``) match the pin, else how they
        differ: parties added, removed, or whose keys changed."""
        if self.fingerprints is not None:
            added = sorted(set(parties) - set(self.fingerprints))
            removed = sorted(set(self.fingerprints) - set(parties))
            changed = sorted(p for p in set(parties) & set(self.fingerprints)
                             if parties[p].fingerprint != self.fingerprints[p])
            problems = ([f"parties added: {', '.join(added)}"] if added else []) + (
                [f"parties removed: {', '.join(removed)}"] if removed else []) + [
                f"party {p}'s keys differ from the pinned ones" for p in changed]
            if problems:
                return "; ".join(problems)
        if self.parties_sha256 is not None and sha256_hex(parties_text) != self.parties_sha256:
            return "parties.json was rewritten: its sha256 differs from the pinned one"
        return None


def parse_parties(text: bytes, where: str) -> dict[str, PartyKeys]:
    """Party -> keys from the bytes of a parties.json; SecureFFMError naming ``where`` when
    they are not in that format."""
    try:
        parties = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SecureFFMError(f"{where} is not valid JSON: {err}") from None
    if not isinstance(parties, dict):
        raise SecureFFMError(f"{where} must map party id -> {{\"sign\": hex, \"seal\": hex}}")
    return {party: _party_keys(party, keys, where) for party, keys in parties.items()}


def _party_keys(party: str, keys: object, where: str) -> PartyKeys:
    if (not isinstance(keys, dict) or not is_hex(keys.get("sign"), 64)
            or not set(keys) <= {"sign", "seal"}
            or ("seal" in keys and not is_hex(keys["seal"], 64))):
        raise SecureFFMError(f"{where}: the keys of {party!r} must be {{\"sign\": 64 hex digits "
                             "(Ed25519 public key), \"seal\": 64 hex digits (X25519 public key, "
                             "optional)}")
    seal = keys.get("seal")
    return PartyKeys(bytes.fromhex(keys["sign"]), None if seal is None else bytes.fromhex(seal))


def load_parties(path: Path) -> tuple[dict[str, PartyKeys], bytes]:
    """A run's parties.json: party -> keys, and the file's bytes (the chain starts from them)."""
    if not path.is_file():
        raise SecureFFMError(f"{path} is missing: a run folder needs {path.name} (the "
                             "parties' public keys) beside messages.jsonl")
    text = path.read_bytes()
    return parse_parties(text, str(path)), text


def pin_of(run_dir: Path, head: str) -> RunPin:
    """The pin of the run in ``run_dir`` whose log ``head`` its writer returned on closing."""
    parties, text = load_parties(Path(run_dir) / "parties.json")
    return RunPin(head, sha256_hex(text), {p: k.fingerprint for p, k in parties.items()})


def load_pin(path: str | Path) -> RunPin:
    """A pin file written by ``secureffm audit --pin``, or a copy of a run's parties.json (which
    pins the keys only)."""
    path = Path(path)
    if not path.is_file():
        raise SecureFFMError(f"{path} is missing: give the pin file (secureffm audit --pin) or "
                             "the copy of parties.json that was kept apart from the run")
    text = path.read_bytes()
    try:
        value = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SecureFFMError(f"{path} is not valid JSON: {err}") from None
    if isinstance(value, dict) and set(value) == _PIN_FIELDS:
        return _pin_from_json(value, str(path))
    parties = parse_parties(text, f"{path} (neither a pin file nor a parties.json copy)")
    return RunPin(fingerprints={p: k.fingerprint for p, k in parties.items()})


def _pin_from_json(value: dict, where: str) -> RunPin:
    fingerprints = value["fingerprints"]
    if not (is_hex(value["head"], 64) and is_hex(value["parties_sha256"], 64)
            and isinstance(fingerprints, dict)
            and all(is_hex(f, 64) for f in fingerprints.values())):
        raise SecureFFMError(f"{where}: a pin needs head and parties_sha256 as 64 hex digits "
                             "and fingerprints mapping party -> 64 hex digits; write it with "
                             "secureffm audit --pin RUN_DIR")
    return RunPin(value["head"], value["parties_sha256"], dict(fingerprints))
