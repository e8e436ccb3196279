"""``he`` (the ckks stage) against the server and against a client colluding with it.

Adversaries:

- the honest-but-curious server, alone: it keeps its view (its Party memory and everything it
  logged: messages.jsonl and payloads.bin) and tries to read an upload. It holds only the
  public context (parameters, no key), so decryption fails; no secret key is anywhere in what
  it holds, in any form the tests can find (SEAL's serialized key, a context that holds it).
- the server colluding with one client: the client hands over its secret context, and the
  pair decrypts another client's upload from the server's view. The key is shared, so this
  succeeds: the documented limit of ``he`` (docs/protocols.md), shown here.
- a server that deviates: it sends a decryptor one client's upload in place of the sum and
  gets it decrypted; also a documented limit, shown here.

Truths used: the victim's own update (the value the attack recovers, to the CKKS error
bound), SEAL's serialized secret key as a byte string (from TenSEAL's ``SecretKey.save``),
and the object graph reachable from the server (tests/security/test_party_keys.py's walk).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
import torch

from secureffm.federation import SERVER, Client, MessageLog
from secureffm.federation.message import deserialize_payload as read_payload
from secureffm.protocols import load_protocol
from secureffm.protocols.ckks import CKKSStage, decrypt, new_context, read_ciphertexts
from secureffm.runs.scaffold import open_channel
from tests.security.test_party_keys import reachable

D = 5000
WEIGHTS = dict.fromkeys(("client-1", "client-2", "client-3"), 1.0)  # he takes no other


def _updates() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {c: rng.uniform(-2, 2, D).astype(np.float32) for c in WEIGHTS}


@pytest.fixture(scope="module")
def he_run(tmp_path_factory):
    """Two aggregations under the shipped ``he`` protocol, OS-entropy keys, payloads kept."""
    folder = tmp_path_factory.mktemp("he")
    clients = [Client(c, torch.zeros(1, 2), torch.Generator().manual_seed(i))
               for i, c in enumerate(WEIGHTS)]
    protocol = load_protocol("he")
    channel = open_channel(protocol, clients, MessageLog(folder / "messages.jsonl",
                                                         keep_payloads=True))
    xs = _updates()
    for round_ in (1, 2):
        result = channel.aggregate(round_, "gradient", lambda c: {"g": xs[c.id]}, WEIGHTS,
                                   {"g": ((D,), np.dtype(np.float32))})
        assert result.included == list(WEIGHTS)
    channel.close()
    return channel, folder, protocol.stages[0].params


def _server_view(folder: Path) -> tuple[list[dict], bytes]:
    records = [json.loads(x) for x in (folder / "messages.jsonl").read_text().splitlines()]
    return records, (folder / "payloads.bin").read_bytes()


def _upload_of(folder: Path, victim: str, round_: int) -> bytes:
    records, blob = _server_view(folder)
    record = next(r for r in records if r["phase"] == "upload" and r["sender"] == victim
                  and r["round"] == round_)
    return blob[record["offset"]:record["offset"] + record["bytes"]]


def _secret_key_bytes(context: ts.Context, tmp_path: Path) -> bytes:
    """SEAL's serialized secret key: what a secret-key context carries (verified below)."""
    path = tmp_path / "sk.bin"
    context.secret_key().data.save(str(path))
    return path.read_bytes()


def _holds_key(server, files: list[Path], key: bytes) -> list[str]:
    """Where the secret key shows in the server's state: a reachable byte string (or array)
    holding a 64-byte piece of its serialized form, a reachable context that holds a secret
    key, or a logged file holding a piece."""
    pieces = [key[i:i + 64] for i in (0, len(key) // 2, len(key) - 64)]
    found = []
    for obj in reachable(server):
        if isinstance(obj, ts.Context) and obj.is_private():
            found.append("a secret-key context in the server's memory")
        data = obj.tobytes() if isinstance(obj, np.ndarray) else obj
        if isinstance(data, (bytes, bytearray)) and any(p in data for p in pieces):
            found.append(f"a {type(obj).__name__} in the server's memory")
    for path in files:
        if any(p in path.read_bytes() for p in pieces):
            found.append(path.name)
    return found


# -- the server alone ----------------------------------------------------------------------------

def test_the_server_alone_cannot_decrypt_an_upload(he_run):
    channel, folder, params = he_run
    server_context = channel.server.memory["ckks"]["context"]
    assert not server_context.is_private()
    upload = _upload_of(folder, "client-2", 2)
    vectors = read_ciphertexts(server_context, upload, params.ciphertexts(D), params,
                               "client-2")
    with pytest.raises(ValueError, match="doesn't hold a secret_key"):
        vectors[0].decrypt()
    with pytest.raises(ValueError, match="doesn.t hold a Secret key"):
        decrypt(server_context, vectors, D)
    # a key of its own makes the ciphertexts parse and decrypt, to nothing like the update
    guess = decrypt(new_context(params), read_ciphertexts(new_context(params), upload,
                                                          params.ciphertexts(D), params, "c"), D)
    x = CKKSStage.scales(WEIGHTS)["client-2"] * _updates()["client-2"]
    assert np.abs(guess - x).max() > 1e3


def test_the_servers_state_and_log_never_hold_the_secret_key(he_run, tmp_path):
    channel, folder, _ = he_run
    client_context = channel.clients[1].memory["ckks"]["context"]
    key = _secret_key_bytes(client_context, tmp_path)
    files = [folder / "messages.jsonl", folder / "payloads.bin"]
    assert _holds_key(channel.server, files, key) == []
    records, _ = _server_view(folder)
    public = [r for r in records if r["phase"] == "he_keys" and r["recipient"] == SERVER]
    assert len(public) == 1  # what the server kept: the public context, and the sealed part


def test_the_search_finds_a_secret_key_planted_where_the_server_reaches(he_run, tmp_path):
    """The check above can fail: a server that kept the secret context, as bytes or as a
    context, or logged it, is caught."""
    channel, folder, _ = he_run
    context = channel.clients[0].memory["ckks"]["context"]
    key = _secret_key_bytes(context, tmp_path)
    secret = context.serialize(save_secret_key=True)
    assert key in secret  # the serialized context carries SEAL's serialized key as is
    memory = channel.server.memory
    memory["cache"] = [{"blob": np.frombuffer(secret, dtype=np.uint8)}]
    assert _holds_key(channel.server, [], key) == ["a ndarray in the server's memory"]
    memory["cache"] = (ts.context_from(secret),)
    assert _holds_key(channel.server, [], key) == ["a secret-key context in the server's memory"]
    del memory["cache"]
    leaked = tmp_path / "payloads.bin"
    leaked.write_bytes(b"x" * 10 + secret)
    assert _holds_key(channel.server, [leaked], key) == ["payloads.bin"]


# -- a client colluding with the server ----------------------------------------------------------

def test_a_client_colluding_with_the_server_decrypts_another_clients_upload(he_run):
    """The documented limit: client-1 gives the server its secret context; together they read
    client-3's upload of round 2 from the server's log, to the CKKS error bound."""
    channel, folder, params = he_run
    colluder = ts.context_from(
        channel.clients[0].memory["ckks"]["context"].serialize(save_secret_key=True))
    upload = _upload_of(folder, "client-3", 2)
    vectors = read_ciphertexts(colluder, upload, params.ciphertexts(D), params, "client-3")
    recovered = decrypt(colluder, vectors, D)
    scale = CKKSStage.scales(WEIGHTS)["client-3"]  # public: from the public weights
    victim = _updates()["client-3"].astype(np.float64)
    assert np.abs(recovered / scale - victim).max() <= params.error_bound(1, 2 * scale) / scale


def test_a_deviating_server_gets_one_upload_decrypted_in_place_of_the_sum(tmp_path):
    """The documented limit against a server that deviates: in round 1 it sends the decryptor
    client-3's upload (taken from its own log) as the summed ciphertexts; the decryptor cannot
    tell one ciphertext from a sum and returns client-3's scaled update, in the clear but for
    its flooding noise, which the server logs as the decrypted sum. ``he`` assumes a server
    that follows the protocol (docs/protocols.md); secagg's malicious-server variant is the
    protocol for this one."""
    clients = [Client(c, torch.zeros(1, 2), torch.Generator().manual_seed(i))
               for i, c in enumerate(WEIGHTS)]
    protocol = load_protocol("he")
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl",
                                                         keep_payloads=True))
    honest = channel.server.envelope

    def envelope(round_, phase, kind, recipient, data, stages=(), origin="",
                 digest=None):  # digest dropped: the honest envelope hashes what is sent
        if phase == "he_sum":
            data = _upload_of(tmp_path, "client-3", round_)
        return honest(round_, phase, kind, recipient, data, stages, origin)

    channel.server.envelope = envelope
    xs = _updates()
    channel.aggregate(1, "gradient", lambda c: {"g": xs[c.id]}, WEIGHTS,
                      {"g": ((D,), np.dtype(np.float32))})
    channel.close()
    records, blob = _server_view(tmp_path)
    [reply] = [r for r in records if r["phase"] == "he_decrypted"]
    plain = read_payload(blob[reply["offset"]:reply["offset"] + reply["bytes"]])["sum"]
    params = protocol.stages[0].params
    scale = CKKSStage.scales(WEIGHTS)["client-3"]
    victim = xs["client-3"].astype(np.float64)
    noise = 8 * params.flood_sigma(len(WEIGHTS), 1)  # the decryptor's flooding, 8 deviations
    assert np.abs(plain / scale - victim).max() <= (params.error_bound(1, 2 * scale)
                                                    + noise) / scale


def test_a_server_that_names_itself_a_recipient_does_not_get_the_key(tmp_path):
    """Adversary: a deviating server at key set-up, asking the key holder (``ckks.keys``) to
    seal its secret context for [client-2, server]. Sealed that way (shown first, as the
    handler would without its check), the server opens its part and holds the secret key; the
    holder's handler refuses the recipient list in its own signed event and sends nothing."""
    from secureffm.federation.exchange import Request
    from secureffm.protocols.ckks import load_context, secret_context
    from secureffm.protocols.sealed import SealedStage

    clients = [Client(c, torch.zeros(1, 2), torch.Generator()) for c in WEIGHTS]
    protocol = load_protocol("he")
    channel = open_channel(protocol, clients, MessageLog(tmp_path / "messages.jsonl"))
    stage, holder = protocol.aggregator("gradient"), channel.parties["client-1"]
    sealer, registry = SealedStage(("gradient",)), channel.transport.registry
    secret = np.frombuffer(secret_context(new_context(stage.params)), dtype=np.uint8)
    sealed = sealer.seal(holder, registry, {"context": secret}, "gradient", 1, "he_keys",
                         ["client-2", SERVER])
    opened = sealer.open(channel.server, registry, sealer.relay(sealed, SERVER, "client-1"),
                         "gradient", 1, "he_keys", "client-1")
    assert load_context(opened["context"].tobytes(), stage.params, True, "client-1") \
        .has_secret_key()  # the attack, unchecked

    reply = channel.endpoints["client-1"](Request(
        1, "gradient", "he_keys", "he_keys", "ckks.keys", ("ckks",), None,
        {"epoch": 0, "fresh": True, "recipients": ["client-2", SERVER]}), None)
    assert reply.envelope is None
    [event] = reply.events
    assert (event["event"], event["sender"], event["party"]) == ("rejected", "client-1", SERVER)
    assert "recipients must be distinct registered clients" in event["detail"]
