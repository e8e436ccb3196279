"""Requests and replies as bytes, for an engine that carries them between processes.

One frame: a 4-byte big-endian length, a JSON header, then the raw message bytes it names.
No pickle: a header holds JSON values only, and a :class:`~secureffm.federation.channel.Task`
travels as ``{"task": name, "args": ...}``. Anything malformed is a MessageError that names
what is wrong.
"""

from __future__ import annotations

import json

from ..errors import MessageError
from .channel import Task
from .exchange import Incoming, Reply, Request
from .message import Envelope, is_hex, is_link
from .parties import EMPTY_SHA256

__all__ = ["encode_request", "decode_request", "encode_reply", "decode_reply",
           "client_event_problem", "CLIENT_EVENTS"]

_HEADER = ("kind", "sender", "recipient", "round", "phase", "stages", "origin", "last")


def _frame(header: dict, data: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return len(head).to_bytes(4, "big") + head + data


def _unframe(frame: bytes, what: str) -> tuple[dict, bytes]:
    try:
        size = int.from_bytes(frame[:4], "big")
        header = json.loads(frame[4:4 + size])
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
    except (ValueError, UnicodeDecodeError) as err:
        raise MessageError(f"the {what} is not a secureffm frame: {err}") from None
    return header, frame[4 + size:]


def _envelope_json(envelope: Envelope) -> dict:
    return {**{k: getattr(envelope, k) for k in _HEADER}, "stages": list(envelope.stages),
            "sig": envelope.sig.hex(), "bytes": len(envelope.data)}


def _envelope(table: dict, data: bytes, what: str) -> Envelope:
    try:
        if table["bytes"] != len(data):
            raise ValueError(f"{len(data)} bytes follow, the header says {table['bytes']}")
        if table["last"] != "" and not is_link(table["last"]):
            raise ValueError(f"last {table['last']!r} is neither empty nor a sha256 in hex")
        return Envelope(str(table["kind"]), str(table["sender"]), str(table["recipient"]),
                        int(table["round"]), str(table["phase"]), data,
                        tuple(str(s) for s in table["stages"]), str(table["origin"]),
                        bytes.fromhex(table["sig"]), str(table["last"]))
    except (KeyError, TypeError, ValueError) as err:
        raise MessageError(f"the {what}'s envelope is malformed: {err}") from None


def _args_json(args: dict) -> dict:
    out = dict(args)
    compute = out.get("compute")
    if isinstance(compute, Task):
        out["compute"] = {"task": compute.name, "args": compute.args}
    elif compute is not None:
        raise MessageError("a client computation crosses processes only as a named Task; this "
                           "method computes on clients with an in-process function, so it runs "
                           "only on the in-process engine")
    return out


def _args(table: dict) -> dict:
    compute = table.get("compute")
    if compute is None:
        return table
    if not (isinstance(compute, dict) and isinstance(compute.get("task"), str)
            and isinstance(compute.get("args"), dict)):
        raise MessageError("the request's compute is not a named task")
    return {**table, "compute": Task(compute["task"], compute["args"])}


def encode_request(request: Request, incoming: Incoming | None,
                   broadcasts: tuple[Incoming, ...] = ()) -> bytes:
    """``request``, the server's message as it is sent (``incoming``: its log seq) and the
    broadcasts it carries; their bytes follow the header in that order (broadcasts first)."""
    header = {"round": request.round, "kind": request.kind, "phase": request.phase,
              "reply_phase": request.reply_phase, "action": request.action,
              "stages": list(request.stages), "args": _args_json(request.args),
              "broadcasts": [{**_envelope_json(b.envelope), "seq": b.seq} for b in broadcasts]}
    data = b"".join(b.data for b in broadcasts)
    if incoming is not None:
        header["envelope"] = _envelope_json(incoming.envelope)
        header["seq"] = incoming.seq
        data += incoming.data
    return _frame(header, data)


def decode_request(frame: bytes) -> tuple[Request, Incoming | None, tuple[Incoming, ...]]:
    """The inverse of :func:`encode_request`: (request, its message, its broadcasts)."""
    header, data = _unframe(frame, "request")
    try:
        carried, offset = [], 0
        for table in header["broadcasts"]:
            size = int(table["bytes"])
            envelope = _envelope(table, data[offset:offset + size], "request's broadcast")
            carried.append(Incoming(envelope, envelope.data, _seq(table["seq"])))
            offset += size
        data = data[offset:]
        envelope = (_envelope(header["envelope"], data, "request") if "envelope" in header
                    else None)
        request = Request(int(header["round"]), str(header["kind"]), str(header["phase"]),
                          str(header["reply_phase"]), str(header["action"]),
                          tuple(str(s) for s in header["stages"]), envelope,
                          _args(dict(header["args"])),
                          tuple(item.envelope for item in carried))
        incoming = None if envelope is None else Incoming(envelope, data, _seq(header["seq"]))
    except (KeyError, TypeError, ValueError) as err:
        raise MessageError(f"the request is malformed: {err}") from None
    return request, incoming, tuple(carried)


def _seq(value) -> int | None:
    return None if value is None else int(value)


def encode_reply(reply: Reply) -> bytes:
    header = {"events": list(reply.events)}
    if reply.envelope is None:
        return _frame(header, b"")
    return _frame({**header, "envelope": _envelope_json(reply.envelope)}, reply.envelope.data)


def decode_reply(frame: bytes, sender: str) -> Reply:
    """The inverse of :func:`encode_reply`; ``sender``: the client it came from, which every
    event and the envelope must name (another party's events are refused)."""
    header, data = _unframe(frame, f"reply of {sender}")
    events = header.get("events")
    if not isinstance(events, list) or not all(isinstance(e, dict) and e.get("sender") == sender
                                               for e in events):
        raise MessageError(f"the reply of {sender} carries events that are not its own")
    envelope = (_envelope(header["envelope"], data, f"reply of {sender}")
                if "envelope" in header else None)
    if envelope is not None and envelope.sender != sender:
        raise MessageError(f"the reply of {sender} carries a message of {envelope.sender}")
    return Reply(envelope, tuple(events))


CLIENT_EVENTS = ("rejected", "clipped")  # the events a client raises (Party.event)
# The fields of a client's event that have one value only, and the optional ones.
_FIXED = {"kind": "event", "recipient": "log", "stages": [], "bytes": 0, "sha256": EMPTY_SHA256}
_OPTIONAL = ("last", "refused")


def _count(value) -> bool:
    return type(value) is int and value >= 0


def client_event_problem(event: dict, round_: int, parties) -> str | None:
    """None when ``event`` (from a client's reply to a request of round ``round_``; its sender
    already checked) has exactly the shape :meth:`~secureffm.federation.parties.Party.event`
    gives a client's event, else which field is wrong. ``parties``: the registered party ids.

    Stricter than the audit's field checks, so that what passes here also passes there once
    the log places it: a malicious client cannot sign a record that crashes the server's log
    or makes an honest server's log fail its audit."""
    checks = {
        **{name: (lambda v, fixed=fixed: v == fixed and type(v) is type(fixed), repr(fixed))
           for name, fixed in _FIXED.items()},
        "round": (lambda v: type(v) is int and v == round_, f"{round_} (the request's round)"),
        "sender": (lambda v: type(v) is str, "a string"),  # the replying client's: decode_reply
        "phase": (lambda v: type(v) is str, "a string"),
        "event": (lambda v: v in CLIENT_EVENTS, f"one of {', '.join(CLIENT_EVENTS)}"),
        "party": (lambda v: type(v) is str and v in parties, "a registered party"),
        "detail": (lambda v: type(v) is str, "a string"),
        "sig": (lambda v: is_hex(v, 128), "128 lowercase hex digits"),
        "last": (is_link, "the sha256 of its previous record, in hex"),
        "refused": (_count, "a record's seq"),
    }
    for name, (valid, words) in checks.items():
        if name not in event:
            if name not in _OPTIONAL:
                return f"{name!r} is missing"
        elif not valid(event[name]):
            return f"{name!r} is {event[name]!r}, not {words}"
    for name in sorted(event.keys() - checks.keys()):
        return f"{name!r} is not a field of a client's event"
    return None
