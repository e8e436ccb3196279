"""A malicious secure-aggregation server, played at the message level (issue 16).

The adversary is the server party of a real federation (``open_channel`` on a shipped spec,
real crypto, a real signed log). It may:

- rewrite any message it sends: :class:`MaliciousServer` wraps the server ``Party.envelope``,
  so a tampered payload is signed with the server's own key and passes every transport check
  (it is the server's genuine message);
- send extra messages in its own name, through a :class:`~secureffm.protocols.link.Link`
  (:meth:`MaliciousServer.send`);
- read every envelope delivered to it, as it crossed the transport (it wraps
  ``Transport.send``; the bytes count even when its own receipt checks refuse them: a
  malicious server ignores its own checks), and keep key pairs of its own.

It never holds a client's private key. What it rebuilds it rebuilds from its view alone, with
the public parameters (threshold, quantizer, weights, client order) and the protocol's public
labels. :class:`ServerView` turns that view into its best reconstruction of one client's
input; ``test_the_reconstruction_recovers_any_input_from_legitimately_given_shares`` checks it
on shares handed over legitimately, so that an attack test cannot pass or fail for a bug here.

Everything that is not an attack outcome (the round could not be played, the log does not
verify) raises :class:`HarnessError`, never ``AssertionError``: the attack tests are
``xfail(raises=AssertionError)``, so a broken harness fails them loudly instead of passing for
an expected failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import secureffm.protocols.key_batch as key_batch
from secureffm.audit.verify import verify_run
from secureffm.errors import ProtocolError
from secureffm.federation import SERVER, Aggregate, Client, MessageLog, deserialize_payload
from secureffm.federation.crypto import agree, private_from_bytes, public_bytes
from secureffm.federation.faults import FaultPlan
from secureffm.federation.message import Envelope, serialize_payload
from secureffm.protocols import ProtectedChannel, load_protocol
from secureffm.protocols.link import Link
from secureffm.protocols.prg import expand_seed
from secureffm.protocols.secagg.common import MASK_LABEL
from secureffm.protocols.shamir import SHARE_BYTES, Share, decode, share_from_bytes
from secureffm.runs.scaffold import open_channel

KIND = "gradient"
D = 50  # coordinates per input
LEAK_STEPS = 4.0  # a reconstruction within this many quantization steps recovers the input

Tamper = Callable[[bytes, str], bytes]  # (payload as the honest server would send, recipient)


class HarnessError(Exception):
    """The harness could not play the attack (not an attack outcome)."""


def require(condition: bool, what: str) -> None:
    if not condition:
        raise HarnessError(what)


def ids(n: int) -> list[str]:
    return [f"client-{i}" for i in range(1, n + 1)]


# -- payload fields -----------------------------------------------------------------------------

def byte_fields(data: bytes) -> dict[str, bytes]:
    """The byte-string fields of a payload (keys, sealed shares, unmask replies)."""
    return {k: v.tobytes() for k, v in deserialize_payload(data).items()
            if v.dtype == np.uint8 and v.ndim == 1}


def edit_bytes(data: bytes, change: Callable[[dict[str, bytes]], None]) -> bytes:
    """``data`` with its byte-string fields edited in place by ``change``; any other field
    (one the honest code may add) is kept as it was."""
    arrays = deserialize_payload(data)
    fields = byte_fields(data)
    change(fields)
    for name in set(arrays) - set(fields):
        if arrays[name].dtype == np.uint8 and arrays[name].ndim == 1:
            del arrays[name]  # ``change`` removed it
    arrays.update({k: np.frombuffer(v, dtype=np.uint8) for k, v in fields.items()})
    return serialize_payload(arrays)


def request_of(data: bytes) -> dict:
    """The JSON body of an unmask request (``survivors``, ``dropped``, and whatever else)."""
    return json.loads(byte_fields(data)["json"])


def with_request(data: bytes, change: Callable[[dict], dict]) -> bytes:
    """``data``, an unmask request, with its JSON body replaced by ``change(body)``; every
    other field of the payload is kept as the honest server sent it."""
    def edit(fields: dict[str, bytes]) -> None:
        fields["json"] = json.dumps(change(json.loads(fields["json"])), sort_keys=True).encode()
    return edit_bytes(data, edit)


def edit_request(change: Callable[[dict, str], dict | None]) -> Tamper:
    """A tamper rewriting the unmask request to each recipient as ``change(body, recipient)``
    says (None: leave that recipient's request alone)."""
    def tamper(data: bytes, recipient: str) -> bytes:
        new = change(request_of(data), recipient)
        return data if new is None else with_request(data, lambda _: new)
    return tamper


def revealed(data: bytes) -> dict[tuple[str, str], Share]:
    """(which, peer) -> share of an unmask reply (``b:<peer>`` / ``s:<peer>`` fields; any
    other field is ignored)."""
    out = {}
    for name, blob in byte_fields(data).items():
        which, colon, peer = name.partition(":")
        if colon and which in ("b", "s") and len(blob) == SHARE_BYTES:
            out[which, peer] = share_from_bytes(blob)
    return out


# -- the adversary ------------------------------------------------------------------------------

class MaliciousServer:
    """The federation's server party turned adversary (see the module docstring).

    ``tamper[phase](data, recipient)`` rewrites what it sends at that phase; ``inbox`` holds
    every envelope that reached it, in order; ``outbox`` every envelope it sent.
    """

    def __init__(self, channel: ProtectedChannel):
        self.channel = channel
        self.tamper: dict[str, Tamper] = {}
        self.inbox: list[Envelope] = []
        self.outbox: list[Envelope] = []
        self._extra = False
        server, transport = channel.server, channel.transport
        honest_envelope, honest_send = server.envelope, transport.send

        def envelope(round_, phase, kind, recipient, data, stages=(), origin="",
                 digest=None):  # digest dropped: the honest envelope hashes what is sent
            change = None if self._extra else self.tamper.get(phase)
            if change is not None:
                data = change(data, recipient)
            sent = honest_envelope(round_, phase, kind, recipient, data, stages, origin)
            self.outbox.append(sent)
            return sent

        def send(envelope_):
            if envelope_.recipient == SERVER:
                self.inbox.append(envelope_)
            return honest_send(envelope_)

        server.envelope = envelope
        transport.send = send

    def received(self, phase: str) -> list[tuple[str, bytes]]:
        """(sender, bytes) of every message of ``phase`` that reached the server."""
        return [(e.sender, e.data) for e in self.inbox if e.phase == phase]

    def first_from_each(self, phase: str) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for sender, data in self.received(phase):
            out.setdefault(sender, data)
        return out

    def sent(self, phase: str, recipient: str) -> bytes:
        """The bytes the server (last) sent ``recipient`` at ``phase``."""
        found = [e.data for e in self.outbox if e.phase == phase and e.recipient == recipient]
        require(bool(found), f"the server sent {recipient} nothing at {phase}")
        return found[-1]

    def link(self, round_: int, kind: str = KIND) -> Link:
        protocol, channel = self.channel.protocol, self.channel
        stage = protocol.aggregator(kind)
        return Link(channel.transport, channel.parties, channel.clients, round_, kind,
                    (*protocol.client_stages(kind), stage.name))

    def send(self, round_: int, phase: str, recipient: str, data: bytes, origin: str = "",
             kind: str = KIND) -> bytes | None:
        """An extra message in the server's name (untampered); the bytes its recipient
        accepted, or None."""
        self._extra = True
        try:
            return self.link(round_, kind).send(phase, SERVER, recipient, data, origin)
        finally:
            self._extra = False


# -- one federation -----------------------------------------------------------------------------

@dataclass
class Federation:
    """n clients, each with a distinct known input, and a server that may turn adversary."""

    tmp_path: Path
    channel: ProtectedChannel
    log: MessageLog
    server: MaliciousServer
    updates: dict[str, np.ndarray]
    weights: dict[str, float]
    result: Aggregate | None = None
    closed: bool = field(default=False)

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.channel.clients]

    @property
    def stage(self):
        return self.channel.protocol.aggregator(KIND)

    def aggregate(self, round_: int = 1,
                  compute: Callable[[Client], dict] | None = None) -> Aggregate:
        compute = compute or (lambda c: {KIND: self.updates[c.id]})
        self.result = self.channel.aggregate(round_, KIND, compute, self.weights,
                                             {KIND: ((D,), np.dtype(np.float32))})
        return self.result

    def close_and_verify(self) -> None:
        """Close the log; it must verify (integrity and protocol rules), attack or not."""
        self.channel.close()
        self.closed = True
        report = verify_run(self.tmp_path)
        require(report.ok, f"the log does not verify: {report.summary()}")

    def events(self, event: str | None = None) -> list[dict]:
        return [e for e in self.log.events if event is None or e["event"] == event]

    def client_refusals(self) -> list[dict]:
        """``rejected`` events signed by a client: a client refused something."""
        return [e for e in self.events("rejected") if e["sender"] in self.ids]

    def view(self) -> ServerView:
        return ServerView.of(self)


def federation(tmp_path: Path, n: int = 5, protocol: str = "secagg",
               keep_payloads: bool = False) -> Federation:
    """A federation of ``n`` clients on the shipped ``protocol`` spec; client i's input is a
    distinct vector in [-1, 1]^D, its weight 1 + i % 3. ``keep_payloads``: the log keeps
    payloads.bin (the audit's rules that read payloads then run)."""
    clients = [Client(f"client-{i}", torch.zeros(1, 2), torch.Generator())
               for i in range(1, n + 1)]
    log = MessageLog(tmp_path / "messages.jsonl", keep_payloads=keep_payloads)
    channel = open_channel(load_protocol(protocol), clients, log, FaultPlan("test", ()))
    rng = np.random.default_rng(2024)
    updates = {c.id: rng.uniform(-1, 1, D).astype(np.float32) for c in clients}
    weights = dict.fromkeys((c.id for c in clients), 1.0)  # secure aggregation takes no other
    return Federation(tmp_path, channel, log, MaliciousServer(channel), updates, weights)


# -- what the server rebuilds from its view -----------------------------------------------------

@dataclass
class ServerView:
    """What the server holds after an aggregation, and its reconstruction of one input.

    ``advertised``: client -> its advertised fields (c_pk, s_pk, b_commit); ``masked``: client
    -> the masked input y it received (uint64); ``dealers``: the clients whose shares it
    routed (each masks with every other one of them: full graph); ``t``: shares needed.
    """

    ids: list[str]
    advertised: dict[str, dict[str, bytes]]
    masked: dict[str, np.ndarray]
    dealers: list[str]
    t: int
    quantizer: object
    scale: dict[str, float]

    @classmethod
    def of(cls, fed: Federation) -> ServerView:
        stage, server = fed.stage, fed.server
        require(stage.neighbours == 0, "the reconstruction assumes the full graph")
        advertised = {u: byte_fields(data)
                      for u, data in server.first_from_each("advertise_keys").items()}
        masked = {u: deserialize_payload(data)["y"].astype(np.uint64)
                  for u, data in server.first_from_each("masked_input").items()}
        dealers = [u for u in fed.ids if u in server.first_from_each("share_keys")]
        return cls(fed.ids, advertised, masked, dealers,
                   stage.shares_needed(stage.group_size(len(fed.ids))), stage.quantizer,
                   stage.scales(fed.weights))

    # -- secrets ---------------------------------------------------------------------------

    def seed_of(self, u: str, shares: list[Share]) -> bytes | None:
        """u's self-mask seed b_u from ``shares`` (checked against u's commitment), or None."""
        commit = self.advertised[u]["b_commit"]
        return self._rebuild(shares, lambda b: key_batch.commit(b)
                             == commit)

    def mask_key_of(self, u: str, shares: list[Share]) -> bytes | None:
        """u's mask secret key s_sk from ``shares`` (checked against u's s_pk), or None."""
        s_pk = self.advertised[u]["s_pk"]
        return self._rebuild(shares, lambda s: public_bytes(private_from_bytes(s)) == s_pk)

    def _rebuild(self, shares: list[Share], check: Callable[[bytes], bool]) -> bytes | None:
        try:
            found = decode(shares, self.t, lambda v: v < 2**256 and check(v.to_bytes(32, "big")))
        except ProtocolError:  # fewer than t shares, or none that rebuild the checked secret
            return None
        return found.secret.to_bytes(32, "big")

    # -- the input -------------------------------------------------------------------------

    def pair_seeds_from_own_key(self, u: str, s_sk: bytes) -> dict[str, bytes]:
        """u's pairwise mask seeds, from u's own mask key."""
        key = private_from_bytes(s_sk)
        return {v: agree(key, self.advertised[v]["s_pk"], MASK_LABEL)
                for v in self.dealers if v != u}

    def pair_seeds_from_peer_keys(self, u: str, keys: dict[str, bytes]) -> dict[str, bytes]:
        """u's pairwise mask seeds, from its peers' mask keys (each peer's the same seed)."""
        return {v: agree(private_from_bytes(s_sk), self.advertised[u]["s_pk"], MASK_LABEL)
                for v, s_sk in keys.items()}

    def input_of(self, u: str, seed: bytes | None, pair_seeds: dict[str, bytes] | None,
                 peers: list[str] | None = None) -> np.ndarray | None:
        """u's input (update units) from its masked input, its self-mask seed and its pairwise
        seeds with every peer it masked with (``peers``: by default every other dealer, as
        an honest server routes them); None when a secret is missing or the result is not a
        quantized vector (some mask did not come off)."""
        peers = [v for v in self.dealers if v != u] if peers is None else peers
        if seed is None or pair_seeds is None or sorted(pair_seeds) != sorted(peers):
            return None
        q, y = self.quantizer, self.masked[u]
        size, bits, order = y.size, self.quantizer.bits, {c: i for i, c in enumerate(self.ids)}
        y = q.sub_mod(y, expand_seed(seed, size, bits))
        for v in peers:  # u added PRG(s_uv) if it precedes v, else subtracted it
            mask = expand_seed(pair_seeds[v], size, bits)
            y = q.sub_mod(y, mask) if order[u] < order[v] else q.add_mod(y, mask)
        try:
            scaled = q.dequantize_sum(y, 1)
        except ProtocolError:
            return None
        return scaled / self.scale[u]

    def steps_off(self, u: str, recovered: np.ndarray | None, truth: np.ndarray) -> float:
        """How many quantization steps of u's scaled input the reconstruction is off (inf when
        there is none)."""
        if recovered is None:
            return float("inf")
        error = np.abs(recovered - truth.astype(np.float64)).max()
        return float(error * self.scale[u] / self.quantizer.step)


def shares_in_replies(replies: list[tuple[str, bytes]], which: str,
                      peer: str) -> list[Share]:
    """Every share of ``peer``'s secret ``which`` ("b" or "s") in unmask replies."""
    return [share for _, data in replies for (w, p), share in revealed(data).items()
            if (w, p) == (which, peer)]
