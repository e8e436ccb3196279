"""A malicious server's deviations played from a threat model (secureffm/protocols/adversary.py)
and caught by the clients of the malicious-server variant of secure aggregation."""

from __future__ import annotations

import json
import re

import pytest

from secureffm.audit import verify_run
from secureffm.config import RunConfig
from secureffm.errors import ConfigError
from secureffm.federation.faults import ACTIONS, SERVER_DEVIATIONS, Fault, FaultPlan
from secureffm.protocols.adversary import DEVIATIONS
from secureffm.runs import run


def test_every_deviation_the_fault_engine_accepts_is_played():
    """Each is a rewrite of one message, except asking twice (extra requests)."""
    assert set(DEVIATIONS) | {"ask_twice"} == set(SERVER_DEVIATIONS) <= set(ACTIONS)


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> dict[int, list[dict]]:
    """Adversary: a malicious server playing threat_models/malicious-server.toml, one
    deviation per round (1: keys substituted towards client-2; 2: a split survivor view to
    client-3; 3: an invented survivor in client-1's request; 4: a zeroed model to client-2;
    5: client-1 and client-2 asked again with client-3 named dropped); round 6 is honest.
    Events by round."""
    out = tmp_path_factory.mktemp("malicious") / "run"
    run(RunConfig(method="vanilla", protocol="secagg", clients=3, partition="iid", rounds=6,
                  shard_size=200, batch_size=32, eval_samples=100, nfe=(1,), trajectories=10,
                  progress=False, device="cpu", threat_model="malicious-server",
                  out=str(out), insecure_deterministic=True))
    report = verify_run(out)  # the audit catches the one deviation the log shows
    assert not report.ok and "broadcast another global_model to client-2 in round 4" in (
        report.first_bad.problem), report.summary()
    by_round: dict[int, list[dict]] = {}
    for line in (out / "messages.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "event":
            by_round.setdefault(record["round"], []).append(record)
    return by_round


def _refusals(events: list[dict]) -> dict[str, str]:
    return {e["sender"]: e["detail"] for e in events if e["event"] == "rejected"}


def _outcome(events: list[dict]) -> str:
    return next(e["event"] for e in events if e["event"] in ("aggregated", "aborted"))


def test_substituted_keys_are_refused_by_their_recipient(events):
    refused = _refusals(events[1])
    assert list(refused) == ["client-2"]
    assert re.search(r"the keys of (client-\d) are not signed by \1's pinned identity",
                     refused["client-2"]), refused["client-2"]
    assert _outcome(events[1]) == "aggregated"  # over client-1 and client-3 only
    aggregated = next(e for e in events[1] if e["event"] == "aggregated")
    assert aggregated["included"] == ["client-1", "client-3"]


def test_a_split_survivor_view_makes_every_survivor_refuse_and_the_round_abort(events):
    refused = _refusals(events[2])
    assert set(refused) == {"client-1", "client-2", "client-3"}
    assert "are not those of the set it signed" in refused["client-3"]
    assert _outcome(events[2]) == "aborted"


def test_an_invented_survivor_is_refused(events):
    assert _refusals(events[3]) == {"client-1": _refusals(events[3])["client-1"]}
    assert "client-99, whom this client did not mask with" in _refusals(events[3])["client-1"]


def test_another_model_to_one_client_fails_the_consistency_signatures(events):
    refused = _refusals(events[4])
    assert set(refused) == {"client-1", "client-2", "client-3"}
    assert all("did not confirm the survivor set, parameters, graph and broadcasts" in why
               for why in refused.values())
    assert _outcome(events[4]) == "aborted"


def test_asking_twice_is_refused_and_the_victim_stays_masked(events):
    """The second request, naming client-3 dropped (its mask key would unmask its input) and
    client-3 as its author to evade the duplicate check, is refused by both recipients (an
    author outside the relay phase), and the round completes with client-3 counted."""
    refused = _refusals(events[5])
    assert set(refused) == {"client-1", "client-2"}
    assert all("names an author (client-3) in phase unmask_request" in why
               for why in refused.values())
    aggregated = next(e for e in events[5] if e["event"] == "aggregated")
    assert aggregated["included"] == ["client-1", "client-2", "client-3"]


def test_an_honest_round_after_the_deviations_completes(events):
    assert _refusals(events[6]) == {} and _outcome(events[6]) == "aggregated"


@pytest.mark.parametrize("fault, fragment", [
    (Fault("substitute_keys", "client-1", "keys"), "give party = 'server', phase = 'keys'"),
    (Fault("split_view", "server", "unmask_request"), "phase = 'consistency'"),
])
def test_a_deviation_off_its_phase_or_party_is_refused(fault, fragment):
    with pytest.raises(ConfigError, match=fragment):
        FaultPlan("bad", (fault,)).check_phases(
            ("broadcast", "keys", "consistency", "unmask_request"), ["client-1", "client-2"])
