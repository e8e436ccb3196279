"""A client's own journal (secureffm/federation/journal.py): chained, signed by the client,
holding its senders' signed headers; and the audit's check of journals against the server's log.

Adversaries: someone who edits, cuts or reorders a client's journal (the chain and the
client's signature catch it); a server that showed a client another message than it logged
(the audit's cross-check catches it). Truths used: Ed25519 verification with the pinned keys
and the run's log as written.
"""

from __future__ import annotations

import json

import pytest
import torch

from secureffm.audit.verify import JOURNALS_DIR, verify_run
from secureffm.errors import ConfigError
from secureffm.federation.journal import Journal, gather, verify_journal
from secureffm.federation.log import MessageLog
from secureffm.federation.message import SERVER
from secureffm.federation.parties import Registry, new_client, new_server


def _parties():
    server, client = new_server(), new_client("client-1", torch.zeros(2, 2))
    return server, client, Registry.of([server, client])


def _journal(tmp_path, lines: int = 3):
    server, client, registry = _parties()
    journal = Journal(tmp_path / "client-1.jsonl", client)
    for i in range(lines):
        journal.message("received", server.envelope(i, "broadcast", "global_model",
                                                     client.id, bytes([i])), seq=i)
    journal.note("event", client.event(1, "upload", "rejected", SERVER, "refused"))
    return journal, registry


def test_a_journal_kept_over_several_processes_verifies(tmp_path):
    journal, registry = _journal(tmp_path)
    # a later process opens the same file and continues the chain
    Journal(journal.path, journal.party).note("sent", {"sender": "client-1", "kind": "x"})
    lines = journal.path.read_text().splitlines()
    assert [json.loads(line)["n"] for line in lines] == [0, 1, 2, 3, 4]
    problems = verify_journal(journal.path, "client-1", registry)
    # the hand-made "sent" record above carries no sender signature: named, the rest holds
    assert problems == ["line 4: its x record is not signed by its sender client-1"]


def test_an_edited_cut_or_reordered_journal_is_caught(tmp_path):
    journal, registry = _journal(tmp_path)
    assert verify_journal(journal.path, "client-1", registry) == []
    lines = journal.path.read_text().splitlines()

    edited = json.loads(lines[1])
    edited["record"]["bytes"] = 99
    journal.path.write_text("\n".join([lines[0], json.dumps(edited), *lines[2:]]) + "\n")
    assert any("line 1" in p for p in verify_journal(journal.path, "client-1", registry))

    journal.path.write_text("\n".join([lines[0], *lines[2:]]) + "\n")  # one line cut
    assert any("does not follow" in p for p in verify_journal(journal.path, "client-1",
                                                               registry))

    journal.path.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    assert verify_journal(journal.path, "client-1", registry)


def test_the_audit_catches_a_server_that_logged_another_message_than_it_sent(tmp_path):
    """A server sends client-1 one model and logs another: the client's journal (the server's
    own signature over what it sent) contradicts the log, and the audit names it."""
    server, client, registry = _parties()
    run = tmp_path / "run"
    log = MessageLog(run / "messages.jsonl")
    log.register(registry)
    shown = server.envelope(1, "broadcast", "global_model", client.id, b"model A")
    logged = server.envelope(1, "broadcast", "global_model", client.id, b"model B")
    seq = log.append(logged)["seq"]
    log.close(server)
    journal = Journal(run / JOURNALS_DIR / "client-1.jsonl", client)
    journal.message("received", shown, seq)
    report = verify_run(run)
    assert not report.ok and "client-1 received a global_model message" in \
        report.first_bad.problem

    (run / JOURNALS_DIR / "client-1.jsonl").unlink()
    Journal(run / JOURNALS_DIR / "client-1.jsonl", client).message("received", logged, seq)
    report = verify_run(run)
    assert report.ok and "1 journal(s) verified" in " ".join(report.checks.values())


def test_gather_files_each_journal_under_its_signer_and_refuses_one_that_does_not_verify(
        tmp_path):
    """``secureffm flower-gather``: a node's journal, whatever its file is called, lands in the
    run's journals/ under the party whose key signed it. Refused by name, nothing copied: a
    journal signed by no party of the run (another run's), an edited one, the same client's
    journal twice, and one that would replace another journal of that client."""
    journal, registry = _journal(tmp_path)
    handed = tmp_path / "node-7" / "journal.jsonl"
    handed.parent.mkdir()
    handed.write_bytes(journal.path.read_bytes())
    target = tmp_path / "run" / JOURNALS_DIR
    assert gather([handed], target, registry) == {"client-1": target / "client-1.jsonl"}
    assert (target / "client-1.jsonl").read_bytes() == handed.read_bytes()

    other, _ = _journal(tmp_path / "other-run")  # the same ids, another run's keys
    with pytest.raises(ConfigError, match="signed by no party"):
        gather([other.path], tmp_path / "x", registry)
    lines = handed.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["record"]["bytes"] = 99
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join([lines[0], json.dumps(edited), *lines[2:]]) + "\n")
    with pytest.raises(ConfigError, match=r"client-1's journal\) does not verify: line 1"):
        gather([forged], tmp_path / "x", registry)
    with pytest.raises(ConfigError, match="both client-1's journal"):
        gather([handed, journal.path], tmp_path / "x", registry)
    Journal(handed, journal.party).note("event", journal.party.event(
        2, "upload", "rejected", SERVER, "refused"))  # the node's journal grew since
    with pytest.raises(ConfigError, match="holds another journal of client-1"):
        gather([handed], target, registry)
    assert not (tmp_path / "x").exists()
