"""A client's state between two messages, as bytes (an engine that runs each message in a
fresh process keeps them for the client, on the client's own node, never at the server).

What a client carries over: its secret-stream key, its training generator and protocol stream,
the link to the last record it signed (so that its next message links to it),
each entry of its memory (what its protocol's stages keep: every entry through the codec its
stage registered, :mod:`.memory`; an entry without one is refused by name), its inbox, the
peers' payloads it gathered, the plain values
(and lists of them) and generators of its method's state (objects in ``client.state`` are
not: the method's program rebuilds them, or reloads them from the broadcasts, before the values
are restored), and the
state dicts of the objects in ``client.kept`` (a client's own trained model, optimizer, EMA),
loaded in place into the objects the rebuilt program made. Encoded as one frame: a JSON header
and a safetensors blob of the arrays; no pickle.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

from ..errors import MessageError, ProtocolError
from .memory import memory_codec
from .parties import Client

__all__ = ["client_state", "restore_client", "pack", "unpack", "encode_tree", "decode_tree"]

_PLAIN = (bool, int, float, str, type(None))


def _generator_state(generator: torch.Generator) -> np.ndarray:
    return generator.get_state().numpy().copy()


def encode_tree(value, name: str, arrays: dict[str, np.ndarray]):
    """A state dict (nested dicts, lists and tuples of tensors and plain values) as JSON, its
    tensors moved to ``arrays`` under ``name``/path. Dict keys keep their type (an optimizer's
    state is keyed by parameter index), so a dict is a list of [key, value] pairs."""
    if isinstance(value, torch.Tensor):
        arrays[name] = value.detach().cpu().numpy().copy()
        return {"tensor": name}
    if isinstance(value, dict):
        if any(not isinstance(k, (str, int)) for k in value):
            raise ProtocolError(f"{name}: a kept object's state dict has a key that is neither "
                                "a string nor an integer")
        return {"dict": [[k, encode_tree(v, f"{name}/{k}", arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [encode_tree(v, f"{name}/{i}", arrays) for i, v in enumerate(value)]
        return {"tuple" if isinstance(value, tuple) else "list": items}
    if isinstance(value, _PLAIN):
        return {"value": value}
    raise ProtocolError(f"{name}: a kept object's state dict holds a {type(value).__name__}, "
                        "which a snapshot does not carry (tensors and plain values only)")


def decode_tree(table: dict, arrays: dict[str, np.ndarray]):
    """The inverse of :func:`encode_tree`."""
    if "tensor" in table:
        return torch.from_numpy(arrays[table["tensor"]].copy())
    if "dict" in table:
        return {key: decode_tree(item, arrays) for key, item in table["dict"]}
    if "tuple" in table:
        return tuple(decode_tree(item, arrays) for item in table["tuple"])
    if "list" in table:
        return [decode_tree(item, arrays) for item in table["list"]]
    return table["value"]


def client_state(client: Client) -> tuple[dict, dict[str, np.ndarray]]:
    """``client``'s carried state: (JSON header, named arrays)."""
    unknown = sorted(key for key in client.memory if memory_codec(key) is None)
    if unknown:
        raise ProtocolError(f"{client.id} keeps {unknown[0]!r} in its memory, which no stage "
                            "registered a codec for (federation.memory), so it cannot leave "
                            "the in-process engine")
    arrays = {"generator": _generator_state(client.generator)}
    memory = {}
    for key, value in client.memory.items():
        memory[key], saved = memory_codec(key).save(value)
        arrays.update({f"memory/{key}/{name}": array for name, array in saved.items()})
    state = {}
    for key, value in client.state.items():
        if isinstance(value, torch.Generator):
            arrays[f"state/{key}"] = _generator_state(value)
            state[key] = {"generator": True}
        elif isinstance(value, _PLAIN) or (isinstance(value, list)
                                           and all(isinstance(v, _PLAIN) for v in value)):
            state[key] = {"value": value}
    kept = {key: encode_tree(value.state_dict(), f"kept/{key}", arrays)
            for key, value in client.kept.items()}
    for kind, payload in client.inbox.items():
        for name, array in payload.items():
            arrays[f"inbox/{kind}/{name}"] = array
    for kind, (_, held) in client.gathered.items():
        for author, payload in held.items():
            for name, array in payload.items():
                arrays[f"gathered/{kind}/{author}/{name}"] = array
    header = {"streams_key": client.streams.key.hex(),
              "protocol_rng": client.protocol_rng.bit_generator.state,
              "memory": memory,
              "gathered": {kind: round_ for kind, (round_, _) in client.gathered.items()},
              "last": client.last, "state": state, "kept": kept}
    return header, arrays


def restore_client(client: Client, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Put :func:`client_state`'s output back into ``client``, whose method objects are
    already rebuilt (its generators' states, plain values and kept objects' state dicts are
    set in place)."""
    try:
        object.__setattr__(client.streams, "key", bytes.fromhex(header["streams_key"]))
        client.generator.set_state(torch.from_numpy(arrays["generator"]))
        client.protocol_rng.bit_generator.state = header["protocol_rng"]
        for key, table in header["memory"].items():
            codec = memory_codec(key)
            if codec is None:
                raise ValueError(f"it keeps {key!r} in its memory, which no stage of this "
                                 "process registered")
            prefix = f"memory/{key}/"
            client.memory[key] = codec.load(table, {name[len(prefix):]: array for name, array
                                                    in arrays.items() if name.startswith(prefix)})
        client.gathered = {kind: (int(round_), {}) for kind, round_ in header["gathered"].items()}
        client.last = str(header["last"])
        for key, entry in header["state"].items():
            if "generator" in entry:
                client.state[key].set_state(torch.from_numpy(arrays[f"state/{key}"]))
            else:
                client.state[key] = entry["value"]
        if set(header["kept"]) != set(client.kept):
            raise ValueError(f"it keeps {sorted(header['kept'])}, the rebuilt client "
                             f"{sorted(client.kept)}")
        for key, table in header["kept"].items():
            client.kept[key].load_state_dict(decode_tree(table, arrays))
        for name, array in arrays.items():
            if name.startswith("inbox/"):
                _, kind, field = name.split("/", 2)
                client.inbox.setdefault(kind, {})[field] = array
            elif name.startswith("gathered/"):
                _, kind, author, field = name.split("/", 3)
                client.gathered[kind][1].setdefault(author, {})[field] = array
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise MessageError(f"{client.id}'s saved state does not fit it: {err}") from None


def pack(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """One frame: 4-byte length, JSON header, safetensors blob."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return len(head).to_bytes(4, "big") + head + save_arrays(
        {k: np.ascontiguousarray(v) for k, v in arrays.items()})


def unpack(frame: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    size = int.from_bytes(frame[:4], "big")
    try:
        return json.loads(frame[4:4 + size]), dict(load_arrays(frame[4 + size:]))
    except Exception as err:  # noqa: BLE001 - any decoding failure means the same thing
        raise MessageError(f"a saved client state does not decode: {err}") from None
