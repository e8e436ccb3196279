"""Protocol rules a run's log must obey beyond integrity, checked record by record in order.

Integrity (chain, signatures) says who signed what; these rules say whether what was signed
is a run the protocols could have produced. The first broken rule is named:

- every ``recipient``, ``origin`` and event ``party`` is in parties.json, or ``"*"`` / ``"log"``;
  the one exception is a ``rejected`` event signed by the server, which may name the
  unregistered sender it refused;
- ``dropped``, ``aborted`` and ``aggregated`` events are signed by the server;
- the ``closed`` record is signed by the server (by the only party when parties.json has no
  server: a centralized run) and its ``records`` equals the records before it;
- every client in an ``aggregated`` event's ``included`` sent its input of that kind to the
  server in that round (in its aggregate stage's ``input_phase``, ``masked_input`` under
  secure aggregation, or ``upload``: :func:`secureffm.protocols.protocol.input_phases`); an
  input of a joint kind ("gradient+dual_update", one aggregation of both) counts for each part;
- the server's public broadcasts (:data:`PUBLIC_KINDS` in the clear, phase ``broadcast``) of one
  kind in one round carry the same bytes (sha256) to every client: a server that sends one
  client another model (to isolate its update in a sum) breaks it;
- and each registered stage's own rules (:meth:`~secureffm.protocols.stage.Stage.audit_rules`:
  secure aggregation's, :mod:`secureffm.protocols.secagg.rules`).

A rule that reads payloads is reported as not done without payloads.bin, never as passed.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..federation.joint import kind_parts
from ..federation.message import SERVER
from ..protocols.protocol import input_phases, stage_classes

__all__ = ["ProtocolRules", "PUBLIC_KINDS"]

# The server state every client gets alike through Channel.broadcast.
PUBLIC_KINDS = ("global_model", "global_potential")
_SERVER_EVENTS = ("dropped", "aborted", "aggregated")
_COUNTED = "aggregates: every counted client sent its input"


class ProtocolRules:
    """Feed :meth:`check` every verified record in log order; it returns the first broken rule.

    ``signing_keys``: party id -> its Ed25519 public key (32 bytes), as in parties.json.
    """

    def __init__(self, signing_keys: Mapping[str, bytes]):
        self.signing_keys = dict(signing_keys)
        self.parties = frozenset(signing_keys)
        self._input_phases = input_phases()
        self._inputs: dict[tuple[int, str], set[str]] = {}
        self._aggregates = 0
        # (round, kind) -> (sha256, first recipient) of the server's public broadcast
        self._broadcasts: dict[tuple[int, str], tuple[str, str]] = {}
        self._stages = [rules for cls in stage_classes()
                        if (rules := cls.audit_rules(self.signing_keys)) is not None]

    def check(self, record: dict, payload: bytes | None) -> str | None:
        """The first rule ``record`` breaks (a sentence naming it), or None.

        ``payload``: the record's payload bytes from payloads.bin, None when not kept.
        """
        if record["kind"] == "event":
            problem = self._named(record) or self._event(record)
        else:
            problem = self._named(record) or self._broadcast(record)
        for rules in self._stages:
            problem = problem or rules.check(record, payload)
        if problem is None and record["kind"] != "event" and (
                record["phase"] in self._input_phases and record["recipient"] == SERVER):
            for kind in kind_parts(record["kind"]):  # a joint input is each part's
                self._inputs.setdefault((record["round"], kind), set()).add(record["sender"])
        return problem

    def status(self) -> dict[str, str]:
        """Each rule that reads more than one record: what it checked, or why it was not
        done."""
        out = {_COUNTED: f"done: {self._aggregates} aggregated event(s) checked"}
        for rules in self._stages:
            out.update(rules.status())
        return out

    # -- one rule each -----------------------------------------------------------------------

    def _named(self, record: dict) -> str | None:
        """Every party a record names is registered."""
        seq = record["seq"]
        fields = [("recipient", record["recipient"])]
        if "origin" in record:
            fields.append(("origin", record["origin"]))
        if record["kind"] == "event" and not (record["event"] == "rejected"
                                              and record["sender"] == SERVER):
            fields.append(("party", record["party"]))
        for name, party in fields:
            if party not in self.parties and party not in ("*", "log"):
                return f"record {seq}: {name} {party!r} is not in parties.json"
        return None

    def _broadcast(self, record: dict) -> str | None:
        """A public broadcast of one kind in one round is the same bytes to every client."""
        if (record["phase"] != "broadcast" or record["kind"] not in PUBLIC_KINDS
                or record["sender"] != SERVER or record["stages"]):
            return None
        key = (record["round"], record["kind"])
        first = self._broadcasts.setdefault(key, (record["sha256"], record["recipient"]))
        if first[0] != record["sha256"]:
            return (f"record {record['seq']}: the server broadcast another {record['kind']} "
                    f"to {record['recipient']} in round {record['round']} than to {first[1]} "
                    "(a different model to one client can isolate its update in a sum)")
        return None

    def _event(self, record: dict) -> str | None:
        seq, event = record["seq"], record["event"]
        if event in _SERVER_EVENTS and record["sender"] != SERVER:
            return (f"record {seq}: a {event!r} event is the server's, but {record['sender']} "
                    "signed it")
        if event == "closed":
            return self._closed(record)
        if event == "aggregated":
            return self._aggregated(record)
        return None

    def _closed(self, record: dict) -> str | None:
        """The closing record is the server's (the single party's without a server) and counts
        the records before it."""
        seq = record["seq"]
        if SERVER in self.parties:
            closer = SERVER
        elif len(self.parties) == 1:
            closer = next(iter(self.parties))
        else:
            return (f"record {seq}: parties.json has no server but {len(self.parties)} parties; "
                    "only a single-party run closes its own log")
        if record["sender"] != closer:
            return (f"record {seq}: the closing record must be signed by {closer}, but "
                    f"{record['sender']} signed it")
        if record["records"] != seq:
            return (f"record {seq}: the closing record states {record['records']} records "
                    f"before it, but {seq} precede it")
        return None

    def _aggregated(self, record: dict) -> str | None:
        """Every counted client sent its input to this aggregation."""
        seq, round_, kind = record["seq"], record["round"], record["of_kind"]
        sent = self._inputs.pop((round_, kind), set())
        for client in record["included"]:
            if client not in sent:
                return (f"record {seq}: {client} is counted in the round-{round_} {kind} "
                        f"aggregate but sent no input to it "
                        f"({' or '.join(self._input_phases)})")
        self._aggregates += 1
        return None
