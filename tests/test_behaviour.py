"""Behaviour is unchanged by the message-boundary refactor (issue 15).

Issue 15 moves the message boundary (methods -> a typed Channel -> protocol stages -> a
Transport that only moves signed bytes) and promises that behaviour does not change: under
``insecure_deterministic``, a seeded short run of every method and protocol gives the same
metrics and the same sequence of logged deliveries (round, phase, kind, sender, recipient,
size, stages, origin) and events (round, phase, event, party) as before. Each case of
tests/behaviour_cases.py (FFM-vanilla/LOT/GOT and the centralized baselines; GOT under every
protocol, or the refusal where a protocol cannot protect it; secagg dropout, a lost shares
delivery and rejected uploads; DCFM-A/B and its baselines, DCFM-B sealed and DP-sealed; FedWAD
distance and pairwise, plaintext and private) is run afresh and compared with
tests/fixtures/behaviour.json, recorded from main before the refactor: messages exactly,
metrics to a relative 1e-6. Signatures, hashes, seq, prev and detail strings may change and are
not compared.

A deliberate change of behaviour re-records the fixture (``python
tests/fixtures/record_behaviour.py``) in the commit that makes it, and says why.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.behaviour_cases import CASES, observe

FIXTURE = Path(__file__).parent / "fixtures" / "behaviour.json"
RECORDED = json.loads(FIXTURE.read_text())["cases"]
REL = 1e-6
ABS = 1e-12  # for metrics recorded as 0.0


def _first_difference(seen: list, expected: list) -> str:
    for index, (x, y) in enumerate(zip(seen, expected, strict=False)):
        if x != y:
            return f"record {index}: got {x}, recorded {y}"
    return f"got {len(seen)} records, recorded {len(expected)}"


def _same(seen, recorded) -> bool:
    """Numbers to a relative :data:`REL`; flags, None and "nan" exactly."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if number(seen) and number(recorded):
        return math.isclose(seen, recorded, rel_tol=REL, abs_tol=ABS)
    return type(seen) is type(recorded) and seen == recorded


def _compare_metrics(seen: dict, expected: dict, name: str) -> None:
    missing, extra = sorted(expected.keys() - seen.keys()), sorted(seen.keys() - expected.keys())
    assert not missing and not extra, f"{name}: metrics missing {missing}, new {extra}"
    wrong = {key: (seen[key], value) for key, value in expected.items()
             if not _same(seen[key], value)}
    assert not wrong, f"{name}: metrics changed (got, recorded): {wrong}"


def test_the_fixture_holds_every_case_and_no_other():
    assert list(RECORDED) == [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_seeded_run_does_what_it_did_before_the_refactor(case, tmp_path):
    recorded = RECORDED[case.name]
    seen = observe(case, tmp_path)
    if "refused" in recorded:
        assert seen == {"refused": recorded["refused"]}
        return
    assert "refused" not in seen, f"{case.name} is now refused: {seen.get('refused')}"
    assert seen["messages"] == recorded["messages"], (
        f"{case.name}: the message log changed, "
        f"{_first_difference(seen['messages'], recorded['messages'])}")
    if recorded["metrics"] is not None:
        _compare_metrics(seen["metrics"], recorded["metrics"], case.name)
    else:  # noisy beyond the seed (recorded["why"]): only what no noise enters
        stable = recorded["stable_metrics"]
        _compare_metrics({k: seen["metrics"].get(k) for k in stable}, stable, case.name)
