"""Secure aggregation's rules for the audit (:class:`~secureffm.audit.rules.ProtocolRules`
runs them on every verified record, in log order, after its own), which the ``secagg`` stage
hands the audit (:meth:`~secureffm.protocols.secagg.SecAggStage.audit_rules`). The first broken
rule is named:

- secure aggregation (the phases of every variant, :mod:`.common`): a client takes
  part in an aggregation only after advertising keys in it (under ``setup = "once"``, from the
  round a ``keys_taken`` reply marks as a kind's key set-up on, in that set-up; its later
  rounds read the parameters and graph the set-up's ``keys`` message told each client), and
  the keys the server relays in ``keys`` are those each client advertised, and
  (malicious-server variant) every client was announced the same graph (seed and U1) and the
  same survivor set;
- secure aggregation, malicious-server variant (either set-up): a client that answered an
  unmask request was announced a survivor set (``consistency``), and held, in that request, a
  valid signature (with the signer's key of parties.json) from every survivor it names, over
  the statement the client itself would check
  (:func:`.common.survivor_statement`): the survivor set the server
  announced to it, the parameters and graph of its ``keys`` message (under ``setup = "once"``,
  its set-up's) and the broadcasts the
  log shows it accepted that round (every ``broadcast`` record to it, but those it refused by
  seq in a ``rejected`` event's ``refused``). A broadcast lost on the way leaves no record of
  the loss; its recipient then sees a view its peers did not sign and refuses to answer, so
  the rule never judges it.

The rules on relayed keys, one view and signatures read payloads; without payloads.bin they
are reported as not done, never as passed.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

from ...errors import MessageError
from ...federation.crypto import verify_signature
from ...federation.message import SERVER
from ..link import digest_of_broadcasts
from ..wire import fields_json, payload_bytes, payload_json
from .common import EPOCH_PHASES, MALICIOUS_PHASES, survivor_statement

__all__ = ["SecAggRules"]

_RELAYED_KEYS = "secagg: relayed keys equal the advertised ones"
_ONE_VIEW = "secagg: one graph and one survivor set announced to every client"
_SIGNED = "secagg: every answered unmask request held the survivors' signatures of its view"
_SET_UP_PHASES = ("advertise_keys", "keys", "share_keys", "shares", "keys_taken")
_PHASES = frozenset(MALICIOUS_PHASES + EPOCH_PHASES)  # every variant's

Keys = dict[str, bytes]  # "c_pk" / "s_pk" -> raw X25519 public key


class SecAggRules:
    """Feed :meth:`check` every record in log order. ``signing_keys``: party id -> its Ed25519
    public key, as in parties.json."""

    def __init__(self, signing_keys: Mapping[str, bytes]):
        self.signing_keys = dict(signing_keys)
        # (round, kind) -> client -> its advertised keys (None: payload not kept or unreadable)
        self._advertised: dict[tuple[int, str], dict[str, Keys | None]] = {}
        self._keys_checked = 0
        self._keys_unchecked = 0
        # (round, kind, what) -> (announcement, first recipient): the graph and survivor set
        self._announced: dict[tuple[int, str, str], tuple[bytes, str]] = {}
        self._views_checked = 0
        self._views_unchecked = 0
        # (round, client) -> [seq, kind, sha256] of each clear broadcast it took, in order
        self._taken: dict[tuple[int, str], list[tuple[int, str, str]]] = {}
        # (round, kind, client) -> what it was told: params, graph, signed, request
        self._told: dict[tuple[int, str, str], dict] = {}
        self._answers_checked = 0
        self._answers_unchecked = 0
        # kind -> round of its latest setup = "once" key set-up (a keys_taken reply seen)
        self._epochs: dict[str, int] = {}

    def check(self, record: dict, payload: bytes | None) -> str | None:
        """The first rule ``record`` breaks, or None; it also notes the broadcasts each client
        took (and those it refused), which an unmask answer's signatures cover."""
        if record["kind"] == "event":
            if (record["event"] == "rejected" and record["phase"] == "broadcast"
                    and "refused" in record):
                taken = self._taken.get((record["round"], record["sender"]), [])
                taken[:] = [entry for entry in taken if entry[0] != record["refused"]]
            return None
        if record["phase"] == "broadcast" and record["sender"] == SERVER:
            self._taken.setdefault((record["round"], record["recipient"]), []).append(
                (record["seq"], record["kind"], record["sha256"] if not record["stages"]
                 else ""))
        if record["phase"] in _PHASES:
            return self._secagg(record, payload)
        return None

    def status(self) -> dict[str, str]:
        """Each rule that read a record: what it checked, or why it was not done."""
        out = {}
        if self._keys_checked or self._keys_unchecked:
            out[_RELAYED_KEYS] = (
                f"done: {self._keys_checked} keys message(s) checked" if not self._keys_unchecked
                else f"NOT DONE for {self._keys_unchecked} keys message(s): payloads.bin was "
                "not kept (run with --keep-payloads), so the relayed keys cannot be compared")
        if self._views_checked or self._views_unchecked:
            out[_ONE_VIEW] = (
                f"done: {self._views_checked} announcement(s) compared"
                if not self._views_unchecked else
                f"NOT DONE for {self._views_unchecked} announcement(s): payloads.bin was not "
                "kept (run with --keep-payloads)")
        if self._answers_checked or self._answers_unchecked:
            out[_SIGNED] = (
                f"done: {self._answers_checked} answer(s) checked" if not self._answers_unchecked
                else f"NOT DONE for {self._answers_unchecked} answer(s): payloads.bin was not "
                "kept (run with --keep-payloads), or a broadcast was sealed")
        return out

    def _secagg(self, record: dict, payload: bytes | None) -> str | None:
        """Clients join an aggregation by advertising keys; the server relays them unchanged."""
        seq, phase = record["seq"], record["phase"]
        session = self._advertised.setdefault((record["round"], record["kind"]), {})
        if phase == "advertise_keys":
            session[record["sender"]] = _advertised_keys(payload)
            return None
        client = record["recipient"] if record["sender"] == SERVER else record["sender"]
        if phase == "keys_taken" and client in session:
            self._epochs[record["kind"]] = record["round"]  # a setup = "once" key set-up
        epoch = self._epochs.get(record["kind"])
        if client not in session and epoch is not None and phase not in _SET_UP_PHASES:
            session = self._advertised.get((epoch, record["kind"]), {})  # a round of the set-up
        if client not in session:
            return (f"record {seq}: {client} takes part in the round-{record['round']} "
                    f"{record['kind']} secure aggregation ({phase}) without advertising keys "
                    "in it")
        if phase in ("keys", "consistency"):  # read once for every rule below
            try:
                fields = None if payload is None else payload_bytes(payload, SERVER)
            except MessageError:
                return (f"record {seq}: the keys the server sent {client} are not a valid "
                        "payload" if phase == "keys" else
                        f"record {seq}: the server's {phase} message is unreadable")
            if phase == "keys":
                return (self._relayed_keys(seq, client, session, fields)
                        or self._one_view(record, fields, "graph")
                        or self._keys_told(record, fields))
            return (self._one_view(record, fields, "survivor set")
                    or self._told_survivors(record, fields))
        if phase == "unmask_request":
            self._tell(record, "request", payload)
        if phase == "unmask" and record["recipient"] == SERVER:
            return self._signed_view(record)
        return None

    def _one_view(self, record: dict, fields: dict[str, bytes] | None, what: str) -> str | None:
        """What the server announces in one aggregation (the graph's seed and U1 in ``keys``,
        the survivors in ``consistency``) is the same to every client (malicious-server
        variant; a semi-honest ``keys`` message announces no graph). ``fields``: the message's
        payload read, None when not kept."""
        if fields is None:
            self._views_unchecked += 1
            return None
        names = ("graph_seed", "u1") if what == "graph" else ("json",)
        if not all(name in fields for name in names):
            return None
        announced = b"|".join(fields[name] for name in names)
        key = (record["round"], record["kind"], what)
        first = self._announced.setdefault(key, (announced, record["recipient"]))
        self._views_checked += 1
        if first[0] != announced:
            return (f"record {record['seq']}: the server announced {record['recipient']} another "
                    f"{what} than {first[1]} in the round-{record['round']} {record['kind']} "
                    "secure aggregation (a split view)")
        return None

    def _tell(self, record: dict, what: str, value) -> None:
        """Note what the server told one client in this aggregation (None: not readable)."""
        key = (record["round"], record["kind"], record["recipient"])
        self._told.setdefault(key, {})[what] = value

    def _keys_told(self, record: dict, fields: dict[str, bytes] | None) -> None:
        """The parameters and graph digest of a malicious-variant ``keys`` message (its payload
        read, None when not kept)."""
        fields = fields or {}
        if "params" in fields and "graph_seed" in fields and "u1" in fields:
            self._tell(record, "params", fields["params"])
            self._tell(record, "graph",
                       hashlib.sha256(fields["graph_seed"] + fields["u1"]).digest())

    def _told_survivors(self, record: dict, fields: dict[str, bytes] | None) -> None:
        """The first survivor set announced to a client (the one it signs); ``fields``: the
        ``consistency`` message's payload read, None when not kept."""
        told = self._told.setdefault((record["round"], record["kind"], record["recipient"]), {})
        told["consistency"] = True  # the malicious-server variant
        if "signed" not in told and fields is not None:
            try:
                told["signed"] = fields_json(fields, SERVER)["survivors"]
            except (MessageError, TypeError, KeyError):
                told["signed"] = None
        return None

    def _signed_view(self, record: dict) -> str | None:
        """A client answered an unmask request: every survivor the request names signed what
        the log shows the client was told (the check the client makes before it answers)."""
        client, round_, kind = record["sender"], record["round"], record["kind"]
        told = self._told.get((round_, kind, client), {})
        if kind in self._epochs:  # setup = "once": its set-up told it the parameters and graph
            set_up = self._told.get((self._epochs[kind], kind, client), {})
            told = {**{k: set_up[k] for k in ("params", "graph") if k in set_up}, **told}
        if not told.get("consistency"):
            if told.get("params"):  # the malicious variant (a semi-honest keys has none)
                return (f"record {record['seq']}: {client} answered an unmask request in the "
                        f"round-{round_} {kind} secure aggregation (malicious-server variant) "
                        "without a survivor set announced to it to sign")
            return None  # the semi-honest variant: nothing signed
        if told.get("request") is None:
            self._answers_unchecked += 1
            return None
        try:
            request = payload_json(told["request"], SERVER)
        except MessageError:
            return (f"record {record['seq']}: {client} answered an unreadable unmask request")
        taken = self._taken.get((round_, client), [])
        if "signatures" not in request or any(not sha for _, _, sha in taken) or not all(
                told.get(what) for what in ("params", "graph", "signed")):
            self._answers_unchecked += 1
            return None
        broadcasts = digest_of_broadcasts([(kind_, sha) for _, kind_, sha in taken])
        statement = survivor_statement(round_, kind, told["signed"], told["params"],
                                       told["graph"], broadcasts)
        for w in request["survivors"]:
            signature = request["signatures"].get(w, "")
            if w not in told["signed"] or w not in self.signing_keys or not (
                    _verifies(self.signing_keys[w], signature, statement)):
                return (f"record {record['seq']}: {client} answered an unmask request in the "
                        f"round-{round_} {kind} secure aggregation without {w}'s valid signature "
                        "of the survivor set, parameters, graph and broadcasts the log shows "
                        f"{client} was told")
        self._answers_checked += 1
        return None

    def _relayed_keys(self, seq: int, client: str, session: dict[str, Keys | None],
                      relayed: dict[str, bytes] | None) -> str | None:
        """The keys of a ``keys`` message (its payload read, None when not kept) are those
        their owners advertised."""
        if relayed is None:
            self._keys_unchecked += 1
            return None
        for name, key in sorted(relayed.items()):
            key_kind, colon, peer = name.partition(":")
            if not colon:  # the announced graph (graph_seed, u1), not a relayed key
                continue
            if session.get(peer) is None or session[peer].get(key_kind) != key:
                return (f"record {seq}: the server relayed to {client} a {key_kind} for {peer} "
                        f"that {peer} did not advertise in this aggregation")
        self._keys_checked += 1
        return None


def _verifies(key: bytes, signature_hex, statement: bytes) -> bool:
    """Whether ``signature_hex`` (a relayed JSON value: anything) is ``key``'s signature of
    ``statement``, in hex."""
    try:
        signature = bytes.fromhex(signature_hex)
    except (TypeError, ValueError):
        return False
    return _verified(key, signature, statement)


@functools.lru_cache(maxsize=4096)
def _verified(key: bytes, signature: bytes, statement: bytes) -> bool:
    """:func:`verify_signature`, remembered: the server relays one survivor's signature of one
    view to each holder it asks."""
    return verify_signature(key, signature, statement)


def _advertised_keys(payload: bytes | None) -> Keys | None:
    """The keys in an advertise_keys payload, None when not kept or unreadable (the server
    rejects such a message, so it relays nothing of it)."""
    if payload is None:
        return None
    try:
        return payload_bytes(payload, SERVER)
    except MessageError:
        return None
