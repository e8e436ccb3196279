"""``secureffm audit RUN_DIR --threat-model NAME``: each claim PASSes on a real run that keeps
it and FAILs on a real run (or a folder) built to break it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant

from secureffm.audit.claims import FAIL, NOT_COVERED, PASS, audit_claims
from secureffm.audit.report import EPSILON_PLOT, REPORT_FILE
from secureffm.audit.threat import load_adversary
from secureffm.audit.verify import pin_run
from secureffm.cli import main as cli_main
from secureffm.config import RunConfig
from secureffm.errors import ConfigError
from secureffm.federation import Party
from secureffm.federation.faults import load_threat_model
from secureffm.privacy.ledger import charged_entries
from secureffm.privacy.skellam import SkellamStep, skellam_epsilon
from secureffm.protocols import load_protocol
from secureffm.protocols.wire import bytes_payload
from secureffm.runs import run
from secureffm.specs import shipped

MODELS = ("honest-but-curious-server", "malicious-server", "colluding-clients",
          "eavesdropper", "folder-writer")
SPLIT_MODEL = """name = "split-broadcast"
description = "another model to client-2 in round 2"

[adversary]
parties = ["server"]
behaviour = "malicious"

[[faults]]
action = "split_broadcast"
party = "server"
phase = "broadcast"
recipient = "client-2"
rounds = [2]
"""


def _run(out: Path, **changes) -> Path:
    """Two rounds on small shards, payloads kept; secret streams from the OS (an
    insecure-deterministic run passes no privacy claim)."""
    values = dict(rounds=2, shard_size=200, batch_size=32, candidates=32, eval_samples=100,
                  nfe=(1,), trajectories=10, progress=False, device="cpu", partition="iid",
                  insecure_deterministic=False, keep_payloads=True, out=str(out))
    values.update(changes)
    return run(RunConfig(**values)).out


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> Path:
    """FFM-GOT under dp-secagg-distributed (Skellam shares sized for 0 colluders), 4 clients:
    gradient and dual_update aggregates, each charged."""
    return _run(tmp_path_factory.mktemp("claims") / "distributed", method="got",
                protocol="dp-secagg-distributed", clients=4, potential_every=1)


@pytest.fixture(scope="module")
def local_noise(tmp_path_factory) -> Path:
    """FFM-vanilla under dp (local Gaussian noise, no aggregation protocol), 3 clients; a
    large noise multiplier keeps privacy.json's PRV accountant quick."""
    return _run(tmp_path_factory.mktemp("claims") / "local", method="vanilla", protocol="dp",
                clients=3, noise_multiplier=4.0)


@pytest.fixture(scope="module")
def plaintext(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("claims") / "plaintext", method="vanilla",
                protocol="plaintext", clients=3)


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def _verdicts(run_dir: Path, model: str, **kwargs) -> dict:
    report = audit_claims(run_dir, load_adversary(model), **kwargs)
    return {v.claim: v for v in report.verdicts}


def _edit(run_dir: Path, edit) -> None:
    """Rewrite messages.jsonl, each record passed through ``edit`` (None drops it)."""
    path = run_dir / "messages.jsonl"
    records = [edit(json.loads(line)) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n"
                            for r in records if r is not None))


def test_a_distributed_noise_run_keeps_every_claim_against_an_honest_but_curious_server(
        distributed, capsys):
    report = audit_claims(distributed, load_adversary("honest-but-curious-server"))
    assert [(v.claim, v.status) for v in report.verdicts] == [
        ("intact", PASS), ("hidden", PASS), ("epsilon", PASS), ("broadcast", PASS),
        ("parameters", PASS)]
    stated = json.loads((distributed / "privacy.json").read_text())["clients"]
    assert sorted(report.epsilon) == ["client-1", "client-2", "client-3", "client-4"]
    for client, row in report.epsilon.items():  # recomputed from the log, equal to the run's
        assert row["total"] == pytest.approx(stated[client]["rdp"]["total"], rel=1e-9)
        assert row["gradient"] == pytest.approx(stated[client]["rdp"]["by_kind"]["gradient"])
        assert row["dual_update"] > 0 and row["total"] <= report.target
    assert cli_main(["audit", str(distributed), "--threat-model",
                     "honest-but-curious-server"]) == 0
    assert "PASS: every client received the same broadcast" in capsys.readouterr().out
    text = (distributed / REPORT_FILE).read_text()
    assert "| the log is intact | **PASS** |" in text and EPSILON_PLOT in text
    assert (distributed / EPSILON_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model, reader", [("honest-but-curious-server", "the server"),
                                           ("eavesdropper", "eavesdropper on the wire"),
                                           ("folder-writer", "folder writer")])
def test_plaintext_updates_reach_the_adversary_readable(plaintext, model, reader, capsys):
    """Adversary: an honest-but-curious server, an eavesdropper and a folder writer (payloads
    kept), each reading a plaintext run's uploads."""
    verdicts = _verdicts(plaintext, model)
    hidden = verdicts["hidden"]
    assert hidden.status == FAIL and hidden.reason == "6 of 6 reached it readable"
    uploads = [r for r in map(json.loads, (plaintext / "messages.jsonl").read_text().splitlines())
               if r["phase"] == "upload"]
    assert f"record {uploads[0]['seq']}: round 1 gradient of client-1" in hidden.evidence[1]
    assert reader in hidden.evidence[1]
    assert verdicts["epsilon"].status == NOT_COVERED  # no DP, no charged records
    assert cli_main(["audit", str(plaintext), "--threat-model", model]) == 1
    assert "FAIL: no client's gradient" in capsys.readouterr().out
    log = str(plaintext / "messages.jsonl")  # the folder named by its log (DESIGN.md's form)
    assert cli_main(["audit", log, "--threat-model", model]) == 1
    assert "FAIL: no client's gradient" in capsys.readouterr().out
    assert cli_main(["audit", "--verify", log]) == 0


def test_stages_relabelled_as_masked_do_not_hide_a_clear_payload(plaintext, tmp_path):
    """Adversary: a folder writer who relabels the plaintext uploads as masked (stages
    ["secagg"]) so the logged stages claim they were hidden. The signatures break, and the
    kept payloads still show float gradients."""
    copy = _copy(plaintext, tmp_path / "relabelled")
    _edit(copy, lambda r: {**r, "stages": ["secagg"]} if r["phase"] == "upload" else r)
    verdicts = _verdicts(copy, "honest-but-curious-server")
    assert verdicts["intact"].status == FAIL and "signature" in verdicts["intact"].reason
    assert verdicts["hidden"].status == FAIL
    assert "holds floating-point field(s) gradient: readable" in verdicts["hidden"].evidence[1]


def _weaken(record: dict) -> dict:
    """The first charged record's noise for client-1 cut a thousandfold (Skellam variance)."""
    if record.get("event") == "charged" and record["round"] == 1 and (
            record["of_kind"] == "gradient"):
        entry = record["charged"]["client-1"]
        record["charged"]["client-1"] = {**entry, "variance": entry["variance"] / 1000}
    return record


def test_a_ledger_edited_to_exceed_the_target_fails_the_log_and_the_budget(distributed,
                                                                           tmp_path):
    """Adversary: whoever can write the run folder (or the server, re-signing nothing) edits a
    charged record so that client-1 ran with a thousandth of its noise variance. The log no
    longer verifies, and the epsilon claim reports the value the edited schedule spends,
    recomputed from the log, not privacy.json's."""
    copy = _copy(distributed, tmp_path / "edited")
    _edit(copy, _weaken)
    verdicts = _verdicts(copy, "honest-but-curious-server")
    assert verdicts["intact"].status == FAIL and "signature" in verdicts["intact"].reason
    records = [json.loads(line) for line in (copy / "messages.jsonl").read_text().splitlines()]
    charged = [r for r in records if r.get("event") == "charged"]
    steps = [SkellamStep(e.sample_rate, e.l2, e.l1, e.variance, e.steps)
             for r in charged for e in charged_entries(r) if e.client == "client-1"]
    spent = skellam_epsilon(steps, charged[0]["delta"])
    target = charged[0]["target_epsilon"]
    stated = json.loads((copy / "privacy.json").read_text())["clients"]["client-1"]["rdp"]
    assert spent > target >= stated["total"]
    epsilon = verdicts["epsilon"]
    assert epsilon.status == FAIL
    assert epsilon.reason == f"1 client(s) exceed the target {target:g}: client-1 spent {spent:.4g}"


def _opacus_epsilon(run_dir: Path, client: str) -> tuple[float, float]:
    """epsilon of ``client``'s charged Gaussian schedule, straight from Opacus' RDP
    accountant, and the target, read from the log as it stands."""
    records = [json.loads(line) for line in (run_dir / "messages.jsonl").read_text().splitlines()]
    charged = [r for r in records if r.get("event") == "charged"]
    accountant = RDPAccountant()
    accountant.history = [(e.noise_multiplier, e.sample_rate, e.steps) for r in charged
                          for e in charged_entries(r) if e.client == client]
    return accountant.get_epsilon(charged[0]["delta"]), charged[0]["target_epsilon"]


def test_local_noise_epsilon_is_opacus_on_the_logged_schedule_and_an_edit_shows(local_noise,
                                                                                tmp_path):
    """Adversary: whoever edits client-2's round-1 charged record down to noise multiplier
    0.1. Before the edit the audit's epsilon is Opacus' on the logged schedule and within the
    target; after it, the value Opacus gives the edited schedule, over the target. DP alone
    hides no update from the server."""
    verdicts = _verdicts(local_noise, "honest-but-curious-server")
    spent, target = _opacus_epsilon(local_noise, "client-2")
    assert verdicts["epsilon"].status == PASS and f"client-2: gradient {spent:.4g}" in " ".join(
        verdicts["epsilon"].evidence)
    assert verdicts["hidden"].status == FAIL and "stages ['dp']" in verdicts["hidden"].evidence[1]
    assert _verdicts(local_noise, "eavesdropper")["hidden"].status == FAIL
    assert verdicts["parameters"].status == NOT_COVERED  # local noise, no aggregation stage
    copy = _copy(local_noise, tmp_path / "edited")

    def weaken(record: dict) -> dict:
        if record.get("event") == "charged" and record["round"] == 1:
            record["charged"]["client-2"]["noise_multiplier"] = 0.1
        return record

    _edit(copy, weaken)
    spent, target = _opacus_epsilon(copy, "client-2")
    assert spent > target
    epsilon = _verdicts(copy, "honest-but-curious-server")["epsilon"]
    assert epsilon.status == FAIL
    assert epsilon.reason == f"1 client(s) exceed the target {target:g}: client-2 spent {spent:.4g}"


def test_a_deleted_charged_record_leaves_inputs_charged_to_no_one(distributed, tmp_path):
    """Adversary: the server's key holder drops a round's charged record to understate the
    ledger (and re-closes the log; here unsigned, so the log fails too): the masked inputs of
    that round are then charged by no record."""
    copy = _copy(distributed, tmp_path / "uncharged")
    _edit(copy, lambda r: None if r.get("event") == "charged" and r["round"] == 2 and (
        r["of_kind"] == "gradient") else r)
    verdicts = _verdicts(copy, "honest-but-curious-server")
    assert verdicts["intact"].status == FAIL
    epsilon = verdicts["epsilon"]
    assert epsilon.status == FAIL
    assert epsilon.reason == "4 client input(s) were charged to no one: the ledger understates"
    assert "client-1's round-2 gradient input is in no charged record" in " ".join(
        epsilon.evidence)


def test_an_insecure_deterministic_run_passes_no_privacy_claim(tmp_path, capsys):
    """Adversary: an honest-but-curious server holding config.toml, whose seed replays every
    secret stream of an --insecure-deterministic run (DP noise included). Before this the
    audit passed its epsilon and hidden claims and only an evidence line said INSECURE."""
    out = _run(tmp_path / "insecure", method="vanilla", protocol="dp-secagg", clients=3,
               noise_multiplier=4.0, insecure_deterministic=True)
    verdicts = _verdicts(out, "honest-but-curious-server")
    epsilon, hidden = verdicts["epsilon"], verdicts["hidden"]
    assert epsilon.status == FAIL and "insecure_deterministic = true" in epsilon.reason
    assert "no epsilon holds" in epsilon.reason
    assert epsilon.evidence[0].startswith("as judged without that: PASS: at most")
    assert hidden.status == NOT_COVERED and "insecure_deterministic = true" in hidden.reason
    assert verdicts["intact"].status == PASS  # the log itself is sound
    assert cli_main(["audit", str(out), "--threat-model", "honest-but-curious-server"]) == 1
    assert "FAIL: every client's epsilon" in capsys.readouterr().out
    sealed = _folder(tmp_path / "sealed", [
        _message(0, "model", "client-1", "server", ["sealed"]),
        _message(1, "model", "server", "client-2", ["sealed"], "relay", origin="client-1")])
    with (sealed / "config.toml").open("a") as handle:
        handle.write("insecure_deterministic = true\n")
    verdicts = _verdicts(sealed, "honest-but-curious-server")
    assert verdicts["hidden"].status == NOT_COVERED  # it would PASS: sealed to the peers
    assert verdicts["epsilon"].status == NOT_COVERED  # no DP ran: nothing to fail


def test_another_broadcast_to_one_client_fails_the_broadcast_claim(tmp_path, capsys):
    """Adversary: a malicious server that sends client-2 another model in round 2 (the
    engine's split_broadcast deviation), to isolate its update in the next sum."""
    model = tmp_path / "split-broadcast.toml"
    model.write_text(SPLIT_MODEL)
    out = _run(tmp_path / "split", method="vanilla", protocol="plaintext", clients=3,
               threat_model=str(model))
    verdicts = _verdicts(out, str(model))
    broadcast = verdicts["broadcast"]
    assert broadcast.status == FAIL
    assert broadcast.reason == ("1 broadcast(s) differ between clients, first the round-2 "
                                "global_model")
    lone = [line for line in broadcast.evidence if "client-2" in line]
    assert len(lone) == 1 and "round 2 global_model" in lone[0] and "client-1" not in lone[0]
    assert verdicts["intact"].status == FAIL  # the verifier's broadcast rule agrees
    assert cli_main(["audit", str(out), "--threat-model", str(model)]) == 1


def test_distributed_noise_sized_for_fewer_colluders_than_assumed_fails(distributed):
    """Adversary: the server with one colluding client, which knows its own noise share; the
    run's distributed noise was sized for no colluder, so the sum carries less noise than the
    accounting assumed. The threshold (3 of 4 shares) still leaves 2 honest inputs."""
    parameters = _verdicts(distributed, "colluding-clients")["parameters"]
    assert parameters.status == FAIL
    assert parameters.reason == "distributed noise sized for 0 colluder(s), >= 1"
    assert any(line.startswith("met: secagg threshold 0.6: 3 of 4 shares")
               for line in parameters.evidence)
    assert any("server-signed charged record" in line for line in parameters.evidence)


def test_a_folder_writer_needs_a_pin_for_the_log_claim(distributed, tmp_path):
    """Adversary: a folder writer, who could rebuild an unpinned log under keys of its own:
    without a pin the intact claim is not covered (exit 0: nothing failed); with the head
    pinned apart it passes."""
    unpinned = _verdicts(distributed, "folder-writer")["intact"]
    assert unpinned.status == NOT_COVERED and "--expect-head" in unpinned.reason
    assert cli_main(["audit", str(distributed), "--threat-model", "folder-writer"]) == 0
    head = pin_run(distributed).head
    assert cli_main(["audit", str(distributed), "--threat-model", "folder-writer",
                     "--expect-head", head]) == 0
    pinned = _verdicts(distributed, "folder-writer", pin=pin_run(distributed))["intact"]
    assert pinned.status == PASS and "head" in pinned.reason


def test_the_five_threat_models_ship_with_an_adversary_and_the_fault_plans_still_load():
    assert set(MODELS) <= set(shipped("threat_models"))
    for name in MODELS:
        load_adversary(name)
    assert load_adversary("colluding-clients").colluding_clients == 1
    assert load_adversary("malicious-server").malicious
    assert len(load_threat_model("malicious-server").faults) == 5
    for name in set(shipped("threat_models")) - set(MODELS):
        load_threat_model(name)
        with pytest.raises(ConfigError, match="no \\[adversary\\] table"):
            load_adversary(name)


@pytest.mark.parametrize("table, fragment", [
    ('parties = ["router"]', "parties = ['router']"),
    ('parties = ["clients"]', "colluding_clients = 0"),
    ('parties = ["server"]\ncolluding_clients = -1', "colluding_clients = -1"),
    ('parties = ["server"]\nbehaviour = "nosy"', "behaviour = 'nosy'"),
    ('parties = ["server"]\nsees = 1', "unknown key 'sees'"),
])
def test_a_bad_adversary_table_is_refused_by_name(tmp_path, table, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\n\n[adversary]\n{table}\n')
    with pytest.raises(ConfigError, match=fragment.replace("[", "\\[").replace("]", "\\]")):
        load_adversary(str(path))


def test_the_audit_refuses_options_that_do_not_fit(distributed, capsys):
    assert cli_main(["audit", "--verify", str(distributed), "--threat-model",
                     "eavesdropper"]) == 2
    assert "RUN_DIR --threat-model NAME" in capsys.readouterr().err
    assert cli_main(["audit", str(distributed), "--threat-model", "nope"]) == 2
    assert "unknown threat model 'nope'" in capsys.readouterr().err
    assert cli_main(["audit", str(distributed / "nothing"), "--threat-model",
                     "eavesdropper"]) == 2
    assert "is missing" in capsys.readouterr().err


# -- who reads what, and what the parameters must meet, on folders written by hand ------------

def _folder(path: Path, records: list[dict], protocol: str = "plaintext",
            payloads: bytes = b"", clients: int = 2) -> Path:
    """A folder with ``records`` as its log (unsigned: the intact claim fails, and the others
    read the records as written), a config.toml naming ``protocol``, parties.json with the
    server and ``clients`` clients, and ``payloads`` as payloads.bin."""
    path.mkdir()
    (path / "messages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "config.toml").write_text(f"protocol = {json.dumps(protocol)}\n")
    parties = [Party("server"), *(Party(f"client-{i}") for i in range(1, clients + 1))]
    (path / "parties.json").write_text(json.dumps({
        p.id: {"seal": p.sealing.public.hex(), "sign": p.identity.public.hex()}
        for p in parties}))
    if payloads:
        (path / "payloads.bin").write_bytes(payloads)
    return path


def _message(seq: int, kind: str, sender: str, recipient: str, stages: list[str],
             phase: str = "upload", **extra) -> dict:
    return {"seq": seq, "round": 1, "phase": phase, "kind": kind, "sender": sender,
            "recipient": recipient, "stages": stages, "bytes": 0, "sha256": "0" * 64, **extra}


@pytest.mark.parametrize("records, model, reader", [
    ([_message(0, "gradient", "client-1", "server", ["ckks"])], "honest-but-curious-server",
     None),
    ([_message(0, "gradient", "client-1", "server", ["ckks"])], "colluding-clients",
     "server and its colluding client"),
    ([_message(0, "model", "client-1", "server", ["dp", "sealed"])],
     "honest-but-curious-server", "server"),
    ([_message(0, "model", "client-1", "server", ["sealed"]),
      _message(1, "model", "server", "client-2", ["sealed"], "relay", origin="client-1")],
     "honest-but-curious-server", None),
    ([_message(0, "model", "client-1", "server", ["sealed"]),
      _message(1, "model", "server", "client-2", ["sealed"], "relay", origin="client-1")],
     "colluding-clients", "colluding client client-2"),
    ([_message(0, "gradient", "client-1", "server", ["dp", "secagg"], "masked_input")],
     "colluding-clients", None),
])
def test_who_reads_a_message_follows_its_stages(tmp_path, records, model, reader):
    """Adversaries: an honest-but-curious server (alone, or with a colluding client, which
    holds the CKKS key every client holds and receives relayed models)."""
    hidden = _verdicts(_folder(tmp_path / "run", records), model)["hidden"]
    if reader is None:
        assert hidden.status == PASS, hidden.evidence
    else:
        assert hidden.status == FAIL and hidden.evidence[1].endswith(f"read by the {reader}")


@pytest.mark.parametrize("clients, model, table, unmet", [
    (2, "colluding-clients", "", "of which 1 are honest when 1 collude"),
    (4, "malicious-server", 'adversary = "semi-honest"', "secagg adversary = 'semi-honest'"),
    (10, "two-colluders", "neighbours = 2", "secagg neighbours 2: each client masks with 2,"),
    (2000, "honest-but-curious-server", "", "quantizer: "),
])
def test_secure_aggregation_parameters_unmet_by_the_adversary_fail(tmp_path, clients, model,
                                                                   table, unmet):
    """Adversaries: the server with one colluding client (too few honest inputs in a sum),
    with two (as many as a client's neighbours), a malicious server against the semi-honest variant,
    and sums that wrap the quantizer's modulus."""
    spec = (Path(__file__).parents[2] / "protocols" / "secagg.toml").read_text()
    if table:
        key = table.split(" = ")[0]
        spec = "\n".join(table if line.startswith(f"{key} ") else line
                         for line in spec.splitlines())
    (tmp_path / "spec.toml").write_text(spec)
    if model == "two-colluders":
        model = str(tmp_path / "two.toml")
        Path(model).write_text('name = "two"\n[adversary]\nparties = ["server", "clients"]\n'
                               "colluding_clients = 2\n")
    folder = _folder(tmp_path / "run", [], str(tmp_path / "spec.toml"), clients=clients)
    verdict = _verdicts(folder, model)["parameters"]
    assert verdict.status == FAIL
    assert any(line.startswith("NOT MET: ") and unmet in line for line in verdict.evidence)


def test_parameters_the_clients_signed_must_be_the_configs(tmp_path):
    """Adversary: a folder writer who edits config.toml to name a protocol with a higher
    threshold than the run used; the keys messages (payloads kept) carry what the clients
    signed, and differ."""
    stage = load_protocol("secagg").aggregator("gradient")
    signed = bytes_payload({"params": stage.parameters().replace(b"0.6", b"0.5")})
    keys = _message(0, "gradient", "server", "client-1", ["secagg"], "keys", offset=0,
                    **{"bytes": len(signed)})
    folder = _folder(tmp_path / "run", [keys], "secagg", signed, clients=3)
    verdict = _verdicts(folder, "honest-but-curious-server")["parameters"]
    assert verdict.status == FAIL and verdict.reason.startswith("differs: the log's keys")
