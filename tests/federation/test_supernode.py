"""``secureffm flower-supernode`` (secureffm/federation/supernode.py): Flower's own SuperNode
whose loop module alone waits at most ``--idle-poll`` s, refused where Flower's internals are
not the ones it was written for, Flower's arguments passed through, and the warm process still
finding its SuperNode above it. The deployment through launched nodes is ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from secureffm.cli import main
from secureffm.errors import ConfigError
from secureffm.federation import supernode
from secureffm.federation.warm import is_supernode, supernode_pid

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["client-1", "client-2", "client-3"]


def test_a_capped_sleep_waits_at_most_the_cap_and_delegates_the_rest_to_time():
    waits = []
    proxy = supernode.CappedTime(0.1, sleep=waits.append)
    for seconds in (3, 0.5, 0.02):  # the idle wait, the reply poll, a short one
        proxy.sleep(seconds)
    assert waits == [0.1, 0.1, 0.02]
    assert proxy.monotonic is time.monotonic and proxy.time is time.time


def test_the_cap_replaces_the_loop_modules_time_only_and_is_undone():
    pytest.importorskip("flwr")
    import importlib

    cli_module = importlib.import_module("flwr.supernode.cli.flower_supernode")
    module, sleep = supernode.loop_module(), time.sleep
    with supernode.capped(module, 0.1) as proxy:
        assert module.time is proxy and proxy.cap == 0.1
        assert time.sleep is sleep and sys.modules["time"].sleep is sleep  # the global one
        assert cli_module.sleep is sleep  # another Flower module's wait is its own
    assert module.time is time



def test_the_superexec_polls_at_the_idle_poll_unless_the_operator_set_its_interval():
    """Flower's SuperExec looks for a task every FLWR_SUPEREXEC_TASK_POLL_INTERVAL (1 s by
    default), another idle wait per message: the launcher sets it to the idle poll for the
    SuperExec its SuperNode starts, and keeps an operator's own value."""
    environ: dict[str, str] = {}
    assert supernode.superexec_poll(environ, 0.1) == "0.1"
    assert environ == {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
    own = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"}
    assert supernode.superexec_poll(own, 0.1) == "0.5"
    assert own == {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5"}


def test_an_idle_poll_under_the_floor_is_refused_saying_what_it_costs_the_superlink():
    supernode.check_idle_poll(supernode.FLOOR_S)
    for seconds in (0.01, 0.0, -1.0, float("nan"), 5.0):
        with pytest.raises(ConfigError, match="requests/s per node"):
            supernode.check_idle_poll(seconds)


def test_a_flwr_version_the_launcher_was_not_written_for_is_refused_by_name(monkeypatch):
    """Adversary: a Flower upgrade whose SuperNode loop nobody read. The launcher refuses it
    and names Flower's own flower-supernode to run instead."""
    pytest.importorskip("flwr")
    monkeypatch.setattr(supernode, "FLWR_RANGE", ">=1.43,<1.44")
    with pytest.raises(ConfigError, match=r"written for flwr >=1\.43,<1\.44, not the installed "
                                          r"1\.42\.\d+: run Flower's own flower-supernode"):
        supernode.launch(["--insecure"])


def test_a_loop_without_the_idle_wait_it_caps_is_refused_by_name(monkeypatch):
    """Adversary: a flwr whose loop module no longer waits with ``time.sleep(3)`` (renamed,
    or imported ``from time``): a proxy there would change nothing, or something else. The
    launcher refuses, naming the module and Flower's own flower-supernode."""
    pytest.importorskip("flwr")
    module = supernode.loop_module()
    monkeypatch.setattr(supernode, "IDLE_WAIT", "time.sleep(30)")
    with pytest.raises(ConfigError, match="start_client_internal no longer waits with "
                                          r"time\.sleep\(30\).*own flower-supernode"):
        supernode.loop_module()
    monkeypatch.undo()
    monkeypatch.setattr(module, "time", supernode.CappedTime(1.0))  # not the time module
    with pytest.raises(ConfigError, match="no longer waits"):
        supernode.launch([])
    assert isinstance(module.time, supernode.CappedTime)  # refused before touching it


def test_pyprojects_flower_extra_allows_the_versions_the_launcher_checks():
    """A new flwr in the extra needs its SuperNode loop read again: this test fails until
    FLWR_RANGE follows."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["flower"] == [f"flwr[simulation]{supernode.FLWR_RANGE}"]


def test_the_cli_hands_flowers_arguments_to_flowers_own_parser(monkeypatch, capsys):
    """Everything after ``--idle-poll SECONDS`` reaches Flower's parser as written: Flower's
    own usage error names the one word it does not know (not ``--idle-poll``, which is
    ours), and its ``--version`` is Flower's."""
    pytest.importorskip("flwr")
    monkeypatch.setattr(sys, "argv", ["secureffm"])  # the launcher sets Flower's
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    with pytest.raises(SystemExit) as stopped:
        main(["flower-supernode", "--idle-poll", "0.2", "--insecure", "--superlink",
              "127.0.0.1:1", "--node-config", "client-id='client-1'", "--no-such-option"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "flower-supernode: error: unrecognized arguments: --no-such-option" in error
    assert sys.argv == ["flower-supernode", "--insecure", "--superlink", "127.0.0.1:1",
                        "--node-config", "client-id='client-1'", "--no-such-option"]
    assert supernode.loop_module().time is time  # the cap undone as Flower exited
    with pytest.raises(SystemExit) as stopped:
        main(["flower-supernode", "--version"])
    assert stopped.value.code == 0 and "Flower version: 1.42" in capsys.readouterr().out
    assert main(["flower-supernode", "--idle-poll", "0.001", "--insecure"]) == 2
    assert "--idle-poll 0.001 s: give 0.05 to 3 s" in capsys.readouterr().err


def test_its_help_loads_neither_flower_nor_torch():
    """``secureffm flower-supernode --help`` (and ``secureffm --help``, which lists it) imports
    only the launcher's constants; checked on sys.modules in a fresh interpreter."""
    code = ("import sys\nfrom secureffm.cli import main\ntry:\n    main(['flower-supernode', "
            "'--help'])\nexcept SystemExit:\n    pass\nprint(sorted(m for m in ('torch', "
            "'numpy', 'flwr') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "--idle-poll SECONDS" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("argv", "found"), [
    (["/v/bin/python", "/v/bin/flower-supernode", "--insecure"], True),  # Flower's script
    (["/v/bin/flower-supernode", "--insecure"], True),
    (["/v/bin/python", "/v/bin/secureffm", "flower-supernode", "--idle-poll", "0.1"], True),
    (["/v/bin/python", "-m", "secureffm", "flower-supernode", "--insecure"], True),
    (["/v/bin/python", "/v/bin/secureffm", "run", "flower-supernode"], False),
    (["/v/bin/python", "/v/bin/flower-superexec", "--parent-pid", "1"], False),
    (["/v/bin/python", "/v/bin/flwr-clientapp", "--token", "1"], False),
])
def test_a_supernode_is_known_by_its_argv_flowers_or_the_launchers(argv, found):
    assert is_supernode(argv) is found


def test_warm_finds_a_launched_supernode_above_a_clientapp_in_proc(tmp_path):
    """The /proc walk a ClientApp makes (warm.supernode_pid) finds the process started as
    ``python .../secureffm flower-supernode ...`` (the console script's argv shape): a script
    named ``secureffm`` stands in for the console script and starts the ClientApp's stand-in.
    Before, only ``flower-supernode`` as the first two words counted, and the ClientApp
    served in its own process."""
    script = tmp_path / "secureffm"
    script.write_text("import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
                      "'from secureffm.federation.warm import supernode_pid; "
                      "print(supernode_pid())'], check=True)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, str(script), "flower-supernode", "--insecure"],
                               stdout=subprocess.PIPE, text=True, env=env)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == str(process.pid)
    assert supernode_pid() is None  # pytest runs below no SuperNode


def where(node_config: dict, run_config: dict, state: bytes | None,
          request: bytes) -> tuple[bytes, bytes]:
    """The launched deployment's handler: the SuperNode pid found above the serving process,
    and whether that process is the node's warm process."""
    warm = Path(sys.argv[0]).name == "warm.py"
    return b"", json.dumps({"supernode": supernode_pid(), "warm": warm}).encode()


def one_exchange(calls, run_config: dict) -> dict:
    """The launched deployment's ServerApp: hello, then one call to every node."""
    found = calls.hello(120.0, clients=len(CLIENTS))
    replies = calls.call(dict.fromkeys(found, b"where"), 300.0)
    return {c: None if r is None else json.loads(r) for c, r in replies.items()}


@pytest.mark.slow  # a SuperLink and 3 SuperNodes: a minute or two on 2 cores
def test_a_deployment_exchange_runs_through_launched_supernodes_and_their_warm_processes(
        tmp_path):
    pytest.importorskip("flwr")
    from secureffm.federation.flower import LocalDeployment

    with LocalDeployment(f"{__name__}:one_exchange", f"{__name__}:where", CLIENTS,
                         home=str(tmp_path / "flwr"), idle_poll=0.1) as deployment:
        replies = deployment.run(timeout=600)
        nodes = {c: deployment.processes[c].pid for c in CLIENTS}
        argv = Path(f"/proc/{nodes['client-1']}/cmdline").read_bytes().split(b"\0")
    assert [Path(a.decode()).name for a in argv[1:5]] == [
        "secureffm", "flower-supernode", "--idle-poll", "0.1"]
    assert replies == {c: {"supernode": nodes[c], "warm": True} for c in CLIENTS}

