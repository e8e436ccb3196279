"""A client's state between two messages as bytes (secureffm/federation/snapshot.py).

The property that matters: a client rebuilt in a fresh process from the snapshot draws exactly
what the original would have drawn next, from every stream it carries. Truths used: the
original client itself (its next draws, taken after the snapshot), torch and numpy generators,
and the real sealed stage (its counters and a replayed copy after a restore).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from secureffm.errors import MessageError, ProtocolError
from secureffm.federation.message import SERVER, serialize_payload
from secureffm.federation.parties import Client, Registry, new_client, new_server
from secureffm.federation.snapshot import client_state, pack, restore_client, unpack
from secureffm.protocols import load_protocol
from secureffm.protocols.link import broadcast_digest, record_broadcast

DATA = torch.arange(40, dtype=torch.float32).reshape(20, 2)


def used_client() -> Client:
    """A client (OS-entropy streams) that has trained, rounded and accepted broadcasts for a
    while: every stream has moved off its start. Its node built its protocol first, as a
    node does, which registers the memory its stages keep (federation/memory.py)."""
    load_protocol("plaintext")
    client = new_client("client-1", DATA)
    client.state["noise"] = torch.Generator().manual_seed(int(torch.randint(2**62, (1,))))
    client.state["steps"] = 7
    client.state["lr"] = 0.125
    client.state["name"] = "got"
    client.state["model"] = torch.nn.Linear(2, 2)  # objects the method rebuilds: not carried
    for _ in range(3):
        client.minibatch(5)
        torch.randn(4, generator=client.state["noise"])
        client.protocol_rng.random(9)
    for round_, kind in [(1, "model"), (1, "potential"), (2, "model")]:
        data = serialize_payload({"w": np.full(3, round_, np.float32)})
        record_broadcast(client, round_, kind, hashlib.sha256(data).hexdigest())
    client.inbox["model"] = {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                             "b": np.array([1, 2], dtype=np.int64)}
    client.inbox["potential"] = {"phi": np.ones(4, dtype=np.float64)}
    return client


def rebuilt() -> Client:
    """The same client as a fresh process builds it (new entropy) with its method's objects
    already set up, before the snapshot is restored."""
    client = new_client("client-1", DATA)
    client.state["noise"] = torch.Generator()
    client.state["model"] = torch.nn.Linear(2, 2)
    return client


def next_draws(client: Client) -> dict:
    return {"batch": client.minibatch_rows(10).tolist(),
            "noise": torch.randn(5, generator=client.state["noise"]).tolist(),
            "protocol": client.protocol_rng.random(5).tolist(),
            "examples": client.example_uniforms(("gradient", 3), torch.arange(4), 2).tolist(),
            "dp": torch.randn(3, generator=client.streams.torch("dp")).tolist()}


def test_a_restored_client_draws_exactly_what_the_original_draws_next():
    original = used_client()
    frame = pack(*client_state(original))
    copy = rebuilt()
    assert next_draws(copy) != next_draws(rebuilt())  # fresh entropy: different streams
    copy = rebuilt()
    restore_client(copy, *unpack(frame))
    assert copy.streams.key == original.streams.key
    assert next_draws(copy) == next_draws(original)
    assert next_draws(copy) == next_draws(original)  # and stay in step


def test_plain_values_broadcast_memory_and_inbox_come_back():
    original = used_client()
    copy = rebuilt()
    restore_client(copy, *unpack(pack(*client_state(original))))
    for key in ("steps", "lr", "name"):
        assert copy.state[key] == original.state[key] and type(copy.state[key]) is type(
            original.state[key])
    assert copy.memory["broadcasts"] == original.memory["broadcasts"]
    for round_ in (1, 2, 3):
        assert broadcast_digest(copy, round_) == broadcast_digest(original, round_)
    assert set(copy.inbox) == set(original.inbox)
    for kind, payload in original.inbox.items():
        assert set(copy.inbox[kind]) == set(payload)
        for name, array in payload.items():
            assert copy.inbox[kind][name].dtype == array.dtype
            np.testing.assert_array_equal(copy.inbox[kind][name], array)


def test_a_restored_client_links_its_next_message_to_the_last_one_it_signed():
    """The audit authenticates a client's record through the link its next record carries
    (docs/log-format.md); a client restarted from its saved state keeps that link."""
    original = used_client()
    original.envelope(1, "upload", "gradient", SERVER, b"x")
    copy = rebuilt()
    restore_client(copy, *unpack(pack(*client_state(original))))
    assert copy.last == original.last != ""
    assert (copy.envelope(2, "upload", "gradient", SERVER, b"y").header()
            == original.envelope(2, "upload", "gradient", SERVER, b"y").header())


def test_method_objects_are_not_carried():
    original = used_client()
    header, arrays = client_state(original)
    assert "model" not in header["state"] and not any("model" in k for k in arrays
                                                      if k.startswith("state/"))
    copy = rebuilt()
    model = copy.state["model"]
    restore_client(copy, header, arrays)
    assert copy.state["model"] is model  # the rebuilt one stays; the method reloads it


def test_sealed_counters_and_gathered_copies_come_back_and_replays_stay_refused():
    """Adversary: a relay that replays a sealed message to a client restarted from its saved
    state. The sealed stage's counters (the next one to send, the last accepted per sender)
    must survive, or the restarted client would accept the copy again and reuse counters."""
    client, peer, server = used_client(), new_client("client-2", torch.zeros(3, 2)), new_server()
    registry = Registry.of([server, client, peer])
    sealer = load_protocol("sealed").sealer("model")
    sealer.seal(client, registry, {"w": np.zeros(2, np.float32)}, "model", 1, "upload", [SERVER])
    sent = sealer.seal(peer, registry, {"w": np.ones(2, np.float32)}, "model", 2, "relay",
                       ["client-1"])
    model = sealer.open(client, registry, sent, "model", 2, "relay", "client-2")
    client.keep_gathered(2, "model", "client-2", model)
    copy = rebuilt()
    restore_client(copy, *unpack(pack(*client_state(client))))
    assert copy.memory["sealed"] == client.memory["sealed"] == {
        "next": 1, "accepted": {"client-2": 0}}
    np.testing.assert_array_equal(copy.peers(2, "model")["client-2"]["w"], np.ones(2))
    assert copy.peers(1, "model") == {}
    with pytest.raises(ProtocolError, match="replayed or out of order"):
        sealer.open(copy, registry, sent, "model", 2, "relay", "client-2")


@pytest.mark.parametrize("frame", [b"", b"\x00", b"garbage", b"\x00\x00\x00\x02{}",
                                   b"\x00\x00\x00\x02{}not safetensors",
                                   b"\xff\xff\xff\xff" + b"x" * 50])
def test_unpacking_garbage_is_a_message_error(frame):
    with pytest.raises(MessageError, match="saved client state does not decode"):
        unpack(frame)


def test_a_state_that_does_not_fit_the_client_is_a_message_error():
    header, arrays = client_state(used_client())
    bad_generator = dict(arrays, generator=np.zeros(3, np.uint8))
    with pytest.raises(MessageError, match="client-1's saved state does not fit it"):
        restore_client(rebuilt(), header, bad_generator)
    with pytest.raises(MessageError, match="does not fit"):
        restore_client(rebuilt(), {k: v for k, v in header.items() if k != "streams_key"},
                       arrays)
    no_noise = new_client("client-1", DATA)  # its method did not set up "noise"
    with pytest.raises(MessageError, match="does not fit"):
        restore_client(no_noise, header, arrays)


# -- kept objects: a client's own trained model, optimizer and EMA --------------------------

def _trained_linear() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.95))


def _adam_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, i: int) -> None:
    x = torch.linspace(-1, 1, 12).reshape(4, 3) * (i + 1)
    optimizer.zero_grad()
    model(x).pow(2).sum().backward()
    optimizer.step()


def test_kept_module_and_optimizer_continue_bitwise_after_a_restore():
    """A model and its Adam state (moments, step counts, hyper-parameters) restored in place
    into freshly made objects take the same next steps, bit for bit."""
    model, optimizer = _trained_linear()
    for i in range(3):
        _adam_step(model, optimizer, i)
    original = new_client("client-1", DATA)
    original.kept.update(model=model, optimizer=optimizer)
    frame = pack(*client_state(original))
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)  # every value differs
    copy = rebuilt()
    copy.kept.update(model=fresh, optimizer=fresh_optimizer)
    restore_client(copy, *unpack(frame))
    assert copy.kept["model"] is fresh and copy.kept["optimizer"] is fresh_optimizer
    for i in range(3, 6):
        _adam_step(model, optimizer, i)
        _adam_step(fresh, fresh_optimizer, i)
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value)
    assert fresh_optimizer.param_groups[0]["betas"] == (0.8, 0.95)


def _dcfm_client(program, labels: torch.Tensor, data: torch.Tensor):
    client = new_client("client-1", data)
    client.state["labels"] = labels
    program.setup(client)
    return client


def test_a_restored_dcfm_client_trains_on_exactly_as_the_original():
    """A DP-trained DCFM expert with an EMA (its weights, EMA, Adam state, and its secret DP
    stream, which must continue and never restart) restored into a client rebuilt with fresh
    entropy publishes after another round exactly what the original publishes."""
    from secureffm.federation.channel import Task
    from secureffm.methods.dcfm import DCFMClient, DCFMSettings, Masking
    from secureffm.privacy.settings import DPSettings

    g = torch.Generator().manual_seed(5)
    data = torch.randn(60, 2, generator=g)
    labels = torch.randint(2, (60, 2), generator=g)
    settings = DCFMSettings("dcfm-a", (2,), (2, 2), 60.0, 16, 1e-2, 0.9, 16, Masking(), 1.0,
                            local_steps=3, dcfm_rounds=2, dcfm_steps=3, fedflow_rounds=0,
                            fedflow_local_steps=0, seed=0)
    dp = DPSettings(clip=1.0, delta=1e-5, target_epsilon=None, noise_multiplier=1.0,
                    accountant="rdp")
    program = DCFMClient(settings, dp, ["client-1"], torch.device("cpu"))
    original = _dcfm_client(program, labels, data)
    program(original, Task("dcfm.publish", {"rounds": 0}))
    frame = pack(*client_state(original))
    copy = _dcfm_client(program, labels, data)
    restore_client(copy, *unpack(frame))
    after = [program(c, Task("dcfm.publish", {"rounds": 2})) for c in (original, copy)]
    assert set(after[0]) == set(after[1])
    for name, array in after[0].items():
        assert np.array_equal(after[1][name], array), name
    assert copy.state["dcfm_a_loss"] == original.state["dcfm_a_loss"]
    assert torch.equal(copy.state["dp_rng"].get_state(), original.state["dp_rng"].get_state())
    # and the DP stream carried matters: restarted, it draws other noise and another batch
    fresh = _dcfm_client(program, labels, data)
    header, arrays = unpack(frame)
    restore_client(fresh, header, arrays)
    fresh.state["dp_rng"].manual_seed(0)
    other = program(fresh, Task("dcfm.publish", {"rounds": 2}))
    assert not np.array_equal(other["param/net.0.weight"], after[0]["param/net.0.weight"])


def test_kept_objects_that_do_not_match_the_rebuilt_client_are_a_message_error():
    model, optimizer = _trained_linear()
    original = new_client("client-1", DATA)
    original.kept.update(model=model, optimizer=optimizer)
    header, arrays = client_state(original)
    copy = rebuilt()
    copy.kept["model"] = torch.nn.Linear(3, 2)  # its program made no optimizer
    with pytest.raises(MessageError, match="keeps"):
        restore_client(copy, header, arrays)
    copy = rebuilt()
    copy.kept.update(model=torch.nn.Linear(5, 2), optimizer=optimizer)  # another shape
    with pytest.raises(MessageError, match="does not fit"):
        restore_client(copy, header, arrays)


def test_a_kept_object_whose_state_holds_something_else_is_refused():
    class Odd:
        def state_dict(self):
            return {"callback": print}

        def load_state_dict(self, state):
            pass

    client = new_client("client-1", DATA)
    client.kept["odd"] = Odd()
    with pytest.raises(ProtocolError, match="kept/odd/callback"):
        client_state(client)
