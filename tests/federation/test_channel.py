"""The typed `Channel` (secureffm/federation/channel.py) methods use, and `ProtectedChannel`
(secureffm/protocols/channel.py) satisfying it structurally: every method of the Protocol
exists on the implementation with the same parameters (names, kinds, defaults, order).

Truths used: `inspect.signature` and the Protocol class's own annotations.
"""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pytest
import torch

from secureffm.federation import Client, MessageLog
from secureffm.federation.channel import Aggregate, Channel
from secureffm.protocols import load_protocol
from secureffm.protocols.channel import ProtectedChannel
from secureffm.runs.scaffold import open_channel

# Every method a method may call; the test below also finds any added later.
EXPECTED = {"broadcast", "aggregate", "aggregate_many", "send", "all_gather", "noise_geometry",
            "equal_weights", "note", "close"}


def channel_methods() -> dict[str, typing.Callable]:
    return {name: member for name, member in vars(Channel).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def parameters(function) -> list[tuple[str, object, object]]:
    """Each parameter's name, kind and default (annotations are strings under
    ``from __future__ import annotations`` in both modules and compared apart)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_channel_protocol_lists_what_methods_may_do():
    assert set(channel_methods()) == EXPECTED
    assert typing.get_type_hints(Channel)["clients"] == list[Client]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_protected_channel_has_each_channel_method_with_the_same_parameters(name):
    implementation = getattr(ProtectedChannel, name, None)
    assert implementation is not None and inspect.isfunction(implementation), name
    assert parameters(implementation) == parameters(channel_methods()[name])
    assert (inspect.signature(implementation).return_annotation
            == inspect.signature(channel_methods()[name]).return_annotation)
    hints = typing.get_type_hints(implementation)
    assert hints == typing.get_type_hints(channel_methods()[name]), name


def test_every_channel_method_is_checked():
    assert set(channel_methods()) <= set(vars(ProtectedChannel))


def test_a_real_protected_channel_has_the_clients_attribute(tmp_path):
    clients = [Client(f"client-{i}", torch.zeros(2, 2), torch.Generator()) for i in (1, 2)]
    channel: Channel = open_channel(load_protocol("plaintext"), clients,
                                    MessageLog(tmp_path / "messages.jsonl"))
    assert isinstance(channel, ProtectedChannel) and channel.clients == clients
    result = channel.aggregate(1, "gradient", lambda c: {"g": np.ones(2, np.float32)},
                               {c.id: 0.5 for c in clients}, {"g": ((2,), np.dtype(np.float32))})
    assert isinstance(result, Aggregate) and result.included == ["client-1", "client-2"]


def test_the_parameter_check_catches_a_differing_signature():
    """The check is not vacuous: an implementation that renames or drops a parameter, or adds
    a default, differs."""

    class Renamed:
        def send(self, round_, phase, kind, sender, to, payload): ...

    class Defaulted:
        def broadcast(self, round_, kind, payload=None): ...

    assert parameters(Renamed.send) != parameters(channel_methods()["send"])
    assert parameters(Defaulted.broadcast) != parameters(channel_methods()["broadcast"])
