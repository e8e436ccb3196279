"""scripts/deploy_local.sh: docs/flower.md's deployment guide, executed as written.

The guide shows the script's commands verbatim (the lines between its "guide" markers), so
what the slow test runs is what an operator reads: a fresh FLWR_HOME whose only connection is
the user's SuperLink, TLS certificates made with ``cryptography``, SuperNode authentication on,
one keys folder per party, the SuperLink's health awaited before ``flwr run``, the log head
printed for the operator to pin, the journals gathered with one command, and the audit against
the pinned head. Before, the guide's ``printf`` into a FLWR_HOME that did not exist failed and
``flwr run app/ local`` then started a local simulation of its own, exiting 0.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "deploy_local.sh"
GUIDE = ROOT / "docs" / "flower.md"
TINY = ("--method got --protocol dp-secagg --partition iid --rounds 1 --shard-size 64 "
        "--batch-size 16 --hidden 16 --potential-hidden 16 --candidates 16 --eval-samples 200 "
        "--nfe 1 --trajectories 20 --device cpu --phase-timeout 300")


def guide_lines() -> str:
    """The script's lines between its markers: the guide's commands."""
    text = SCRIPT.read_text()
    return text.split("# --- guide begins ---\n", 1)[1].split("# --- guide ends ---\n", 1)[0]


def test_the_guide_shows_exactly_the_scripts_commands():
    assert f"```bash\n{guide_lines()}```" in GUIDE.read_text()


def test_flwr_refuses_a_connection_the_guides_config_does_not_name(tmp_path, monkeypatch):
    """Adversary: flwr's own fallback. Without a config.toml in FLWR_HOME, flwr writes a default
    whose ``local`` connection starts a simulation SuperLink of its own, and ``flwr run app/
    local`` then "succeeded" without the user's SuperLink. The guide's config names only
    ``deployment`` (the default, with the CA): asked for ``local``, flwr's reader of the
    connection (the one ``flwr run`` calls first) refuses it."""
    pytest.importorskip("flwr")
    import click
    from flwr.cli.flower_config import read_superlink_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "as-the-old-guide-left-it"))  # no config
    assert read_superlink_connection("local").address == ":local:"  # flwr's own simulation
    text = SCRIPT.read_text()
    config = text.split('cat > "$FLWR_HOME/config.toml" <<EOF\n', 1)[1].split("EOF\n", 1)[0]
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(config.replace("$PORT", "9").replace("$WORK", "/w"))
    monkeypatch.setenv("FLWR_HOME", str(home))
    with pytest.raises(click.ClickException, match="'local' not found"):
        read_superlink_connection("local")
    chosen = read_superlink_connection()
    assert (chosen.name, chosen.address, chosen.root_certificates) == (
        "deployment", "127.0.0.1:9", "/w/certs/ca.pem")
    assert not chosen.insecure


def _free_ports(count: int) -> int:
    """A port with the ``count`` ports after it free now (the SuperNodes' own)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count < 65536 and all(_free(base + i) for i in range(1, count + 1)):
            return base
    raise RuntimeError("no free range of ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow  # a SuperLink and 3 SuperNodes; minutes here (a process per message per node)
def test_the_deployment_guide_runs_as_written_and_its_run_audits_against_the_pinned_head(
        tmp_path):
    pytest.importorskip("flwr")
    work = tmp_path / "deployment"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "PORT": str(_free_ports(3)), "CLIENTS": "3", "RUN": TINY}
    env.pop("FLWR_HOME", None)
    done = subprocess.run(["bash", str(SCRIPT), str(work)], env=env, capture_output=True,
                          text=True, timeout=2400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    printed = re.findall(r"pin this log head, kept apart from the run folder: ([0-9a-f]{64})",
                         out)
    pinned = json.loads((work / "pins" / "got-deployed.json").read_text())["head"]
    assert printed == [pinned]  # the head the ServerApp pinned when it closed the log
    assert "OK: log intact" in out and f"head: {pinned}" in out
    assert "3 journal(s) verified" in out
    # the round ran to its end: both of GOT's kinds aggregated, nothing aborted
    [events] = [line for line in out.splitlines() if line.startswith("server events:")]
    assert "aggregated 2," in events and "aborted" not in events, events
    gathered = sorted(p.name for p in (work / "runs" / "got-deployed" / "journals").iterdir())
    assert gathered == ["client-1.jsonl", "client-2.jsonl", "client-3.jsonl"]
    # TLS and node authentication were on: the SuperLink said so, and registered the 3 keys
    link = (work / "superlink.log").read_text()
    assert "SuperNode authentication is disabled" not in link
    assert "Option `--insecure` was set" not in link
    # no party's folder holds another's key file
    for party in ("server", "client-1", "client-2", "client-3"):
        assert sorted(p.name for p in (work / "keys" / party).glob("*.key")) == sorted(
            [f"{party}.key"] + (["supernode-auth.key"] if party != "server" else []))
