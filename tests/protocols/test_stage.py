"""Every registered stage class implements the typed interface of its role
(secureffm/protocols/stage.py), and registration refuses a class without a valid role.

Truths used: the interface classes themselves (their annotated attributes and their methods'
signatures, read with ``typing.get_type_hints`` and ``inspect.signature``), so a change to the
interface that a stage does not follow fails here, by stage and member name. The channel calls
stage methods positionally, so parameter names must match in order, not only as a set.
"""

from __future__ import annotations

import inspect
import typing

import pytest

from secureffm.protocols import known_protocols, load_protocol
from secureffm.protocols.registry import ROLES, STAGES, register_stage
from secureffm.protocols.stage import AggregateStage, SealStage, Stage, StagedProtocol

INTERFACE = {"client": Stage, "aggregate": AggregateStage, "seal": SealStage}


def _registered() -> dict[str, type]:
    load_protocol("plaintext")  # registers the built-in stages
    return dict(STAGES)


def _methods(interface: type) -> list[str]:
    """The methods ``interface`` and the interfaces it extends declare."""
    names = []
    for base in interface.__mro__:
        if base in (Stage, AggregateStage, SealStage):
            names += [name for name, value in vars(base).items() if not name.startswith("_")
                      and (callable(value) or isinstance(value, classmethod))]
    return sorted(set(names))


def _conforms(value, hint) -> bool:
    """Whether ``value`` has the type ``hint`` (a class, or tuple[X, ...] / frozenset[X])."""
    origin = typing.get_origin(hint)
    if origin is None:
        return isinstance(value, hint)
    item = typing.get_args(hint)[0]
    return isinstance(value, origin) and all(isinstance(v, item) for v in value)


def _instances() -> dict[str, list]:
    """Stage name -> the stage objects every shipped protocol builds."""
    built: dict[str, list] = {}
    for name in known_protocols():
        for stage in load_protocol(name).stages:
            built.setdefault(stage.name, []).append(stage)
    return built


def test_the_interface_is_what_this_test_reads():
    """A guard on the reading itself: it finds the members the interface declares."""
    assert set(typing.get_type_hints(Stage)) == {"name", "role", "phases", "can_protect",
                                                 "protects", "memory", "client_actions",
                                                 "carries_distributed_noise", "joins_kinds"}
    assert set(typing.get_type_hints(AggregateStage)) - set(typing.get_type_hints(Stage)) == {
        "input_phase"}
    described = ["audit_parameters", "audit_rules", "claim", "exclusions", "readers"]
    assert _methods(Stage) == sorted(["from_table", "validate_for", *described])
    assert _methods(AggregateStage) == sorted(["aggregate", "from_table", "noise_geometry",
                                               "validate_for", *described])
    assert _methods(SealStage) == sorted(["from_table", "open", "relay", "seal",
                                               "validate_for", *described])
    assert set(INTERFACE) == set(ROLES)


def test_every_shipped_protocol_is_what_a_clients_handlers_read_of_it():
    """ClientEndpoint.protocol is typed StagedProtocol; each built protocol has its members."""
    assert all(isinstance(load_protocol(name), StagedProtocol) for name in known_protocols())


def test_the_builtin_stages_cover_every_role():
    roles = {cls.role for cls in _registered().values()}
    assert roles == set(ROLES)
    assert set(_registered()) >= {"dp", "randomized-t", "sealed", "secagg"}


@pytest.mark.parametrize("name", sorted(_registered()))
def test_a_registered_stage_class_has_the_attributes_of_the_interface(name):
    cls = _registered()[name]
    hints = typing.get_type_hints(INTERFACE[cls.role])
    assert cls.role in ROLES, f"{name}: role {cls.role!r}"
    assert cls.name == name and STAGES[name] is cls
    for attribute, hint in hints.items():
        if attribute == "protects":  # set per spec, on the instance
            continue
        assert hasattr(cls, attribute), f"stage {name!r} lacks {attribute!r}"
        if isinstance(getattr(cls, attribute), property):  # per spec (secagg's phases)
            continue
        assert _conforms(getattr(cls, attribute), hint), (name, attribute, hint)
    built = _instances().get(name)
    assert built, f"no shipped protocol builds stage {name!r}, so its instances go unchecked"
    for stage in built:
        for attribute, hint in hints.items():
            assert _conforms(getattr(stage, attribute), hint), (name, attribute, hint)
        assert stage.protects and set(stage.protects) <= cls.can_protect
        # a client's table holds its actions beside the base ones and other stages' (endpoint)
        assert all(action.startswith(f"{name}.") for action in stage.client_actions), name


@pytest.mark.parametrize("name", sorted(_registered()))
def test_a_registered_stage_class_has_the_methods_of_its_roles_interface(name):
    cls = _registered()[name]
    interface = INTERFACE[cls.role]
    for method in _methods(interface):
        assert callable(getattr(cls, method, None)), f"stage {name!r} lacks {method}()"
        want = inspect.signature(getattr(interface, method))
        got = inspect.signature(getattr(cls, method))
        assert list(got.parameters) == list(want.parameters), (
            f"{name}.{method}{got} does not take {interface.__name__}.{method}{want}")
        for param in want.parameters.values():  # what callers may leave out, they still may
            if param.default is not inspect.Parameter.empty:
                assert got.parameters[param.name].default == param.default, (name, method)
    assert isinstance(inspect.getattr_static(cls, "from_table"), classmethod), name


class _Valid:
    name, phases, can_protect = "valid-for-test", (), frozenset({"gradient"})


@pytest.mark.parametrize("role", [None, "", "server", "Client", "aggregator", ("client",)])
def test_a_class_without_a_valid_role_is_refused_and_not_registered(role):
    _registered()
    before = dict(STAGES)
    attributes = {} if role is None else {"role": role}
    cls = type("_Stage", (_Valid,), attributes)
    with pytest.raises(TypeError, match=r"stage class _Stage needs a role in \('client', "
                                        r"'aggregate', 'seal'\)"):
        register_stage(cls)
    assert STAGES == before and "valid-for-test" not in STAGES
