"""Smoke tests: every script in benchmarks/ and experiments/ runs end to end at its smallest size
(issue 18: ``benchmarks/secagg.py --quick`` had stopped running and nobody noticed).

Each script runs through its command line (argparse and the ``if __name__ == "__main__"`` block)
with everything written under tmp_path. ``test_secagg_benchmark`` runs its script as a user does,
``python benchmarks/secagg.py``, in a fresh interpreter with PYTHONPATH at this checkout; the
others run in a child process forked from this one, with ``sys.argv`` set, so that each does not
pay a fresh import of torch, opacus and matplotlib (4-5 s a script on a 2-core machine, more
than half of this file's budget). The child's exit code, stdout and stderr are the script's.
Each test checks the exit code and the tables and files the script writes; none of them checks
the numbers, which at these sizes mean nothing.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from secureffm.config import load_config
from secureffm.models.unet import make_unet
from secureffm.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("experiments/*.py")])
TIMEOUT_S = 300  # per script; each takes seconds


@dataclass
class Result:
    code: int | None
    stdout: str = field(repr=False)
    stderr: str = field(repr=False)

    def check(self) -> Result:
        assert self.code == 0, f"exit code {self.code}\n{self.stderr[-4000:]}"
        return self


def _child(script: Path, args: list[str], cwd: Path, stdout: Path, stderr: Path) -> None:
    """In the forked child: the script as ``python script args`` would run it."""
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", closefd=False)  # flushed by multiprocessing on exit
    sys.stderr = open(2, "w", closefd=False)
    os.chdir(cwd)  # a relative path a script writes lands in tmp_path
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def _tree(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture(scope="module")
def preimported():
    """Each script imported once in this process (module level only, ``main`` not called), so
    the forked children find torch, opacus, matplotlib and the library loaded."""
    for script in SCRIPTS:  # a script may import its siblings, as python script.py allows
        sys.path.insert(0, str(script.parent))
        try:
            runpy.run_path(str(script), run_name="smoke_import")
        finally:
            sys.path.remove(str(script.parent))


@pytest.fixture
def run_script(preimported, tmp_path):
    """run_script("experiments/x.py", *args) -> Result; the repository's docs/ and runs/ must
    be left as they were."""
    before = {name: _tree(ROOT / name) for name in ("docs", "runs")}

    def run(script: str, *args: str) -> Result:
        out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        child = multiprocessing.get_context("fork").Process(
            target=_child, args=(ROOT / script, list(args), tmp_path, out, err))
        child.start()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
            pytest.fail(f"{script} ran past {TIMEOUT_S} s")
        return Result(child.exitcode, out.read_text(), err.read_text())

    yield run
    assert {name: _tree(ROOT / name) for name in ("docs", "runs")} == before, \
        "a script wrote into the repository's docs/ or runs/"


def _block(doc: Path, name: str) -> str:
    """The text between the ``name`` markers of ``doc`` (written by reporting.write_block)."""
    text = doc.read_text()
    match = re.search(f"<!-- {re.escape(name)}:begin -->\n(.*)\n<!-- {re.escape(name)}:end -->",
                      text, re.S)
    assert match, f"no {name} block in {doc}"
    return match.group(1)


def _section(text: str, heading: str) -> str:
    """From the markdown heading that starts with ``heading`` to the next heading."""
    start = text.index(heading)
    end = text.find("\n#", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _rows(text: str, first_cell: str) -> list[list[str]]:
    """Cells of the markdown table rows of ``text`` whose first cell is ``first_cell``."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if r[0] == first_cell]


def test_every_script_has_a_smoke_test():
    tested = {"benchmarks/audit.py", "benchmarks/deployment.py", "benchmarks/dp.py",
              "benchmarks/engines.py",
              "benchmarks/fedwad.py",
              "benchmarks/he.py", "benchmarks/images.py", "benchmarks/main_job.py",
              "benchmarks/scale.py", "benchmarks/secagg.py", "benchmarks/secagg_rounds.py",
              "benchmarks/tabular.py",
              "experiments/attacks.py", "experiments/dcfm_2d.py", "experiments/dcfm_digits.py",
              "experiments/distributed_noise_gain.py", "experiments/dp_main_job.py",
              "experiments/fedwad_clustering.py",
              "experiments/fedwad_coreset.py", "experiments/ffm_2d.py",
              "experiments/one_run_audit.py",
              "experiments/secagg_vs_plaintext.py", "experiments/sweep_privacy_utility.py",
              "experiments/tabular.py"}
    assert {str(p.relative_to(ROOT)) for p in SCRIPTS} == tested


@pytest.mark.parametrize("config", sorted(ROOT.glob("experiments/*.toml")), ids=lambda p: p.name)
def test_experiment_config_loads(config):
    """Run configs load as runs; sweep files (a [grid] table) as sweeps, every cell checked."""
    if "[grid]" in config.read_text():
        assert load_sweep(config).cells()
    else:
        assert load_config(config, {}).data


# -- benchmarks/ ----------------------------------------------------------------------------


def test_audit_benchmark(run_script, tmp_path):
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/audit.py", "--smoke", "--out", str(out)).check()
    records, signatures = {}, {}
    for kept in ("not kept", "kept"):
        [row] = _rows(result.stdout, f"GOT, dp-secagg, 3 rounds, payloads {kept}")
        records[kept], signatures[kept], payloads = int(row[1]), int(row[2]), int(row[3])
        assert records[kept] > 60 and (0 < payloads < records[kept]) == (kept == "kept")
        assert 0 < signatures[kept] < records[kept] / 10  # links: about one per party
        assert all(float(row[i].replace(",", "")) > 0 for i in range(4, 10))  # rates, ratios
    profile = _section(result.stdout, "### Where an audit's time goes")  # of the last log
    rows = [line.split("|") for line in profile.splitlines() if line.startswith("| `")]
    assert len(rows) >= 5 and all(int(row[2].replace(",", "")) > 0 for row in rows)  # calls
    cpus = len(getattr(os, "sched_getaffinity", lambda _: ())(0))
    if cpus > 1:  # the threads' table: both logs, each pinned and on every CPU
        every = _section(result.stdout, "### The same audits on every CPU")
        for kept in ("not kept", "kept"):
            [row] = _rows(every, f"GOT, dp-secagg, 3 rounds, payloads {kept}, on {cpus} CPUs")
            assert all(float(c.replace(",", "").rstrip("x")) > 0 for c in row[1:])
    assert _block(out, "audit") == result.stdout.rstrip("\n")
    old_log = ROOT / "tests" / "fixtures" / "audit_log"  # --log: a finished run folder
    result = run_script("benchmarks/audit.py", "--log", str(old_log), "--repeats", "1").check()
    [row] = _rows(result.stdout, str(old_log))
    assert row[1:4] == ["60", "60", "55"]  # written before links: every signature verified


def test_secagg_benchmark(tmp_path):
    """The script of issue 18, in a fresh interpreter as a user runs it."""
    out = tmp_path / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/secagg.py", "--smoke", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    result = Result(done.returncode, done.stdout, done.stderr).check()
    for heading in ("### Round time, secure aggregation over plaintext",
                    "### Bytes on the wire per client per round",
                    "### The malicious-server variant over the semi-honest one",
                    "### Masking throughput against the raw stream cipher",
                    "### Where the time goes: n = 10, d = 10^3, full graph",
                    "### A small model: d = 10^3, full graph, n = 10"):
        assert heading in result.stdout
    rounds = _section(result.stdout, "### Round time")
    assert [r[:3] for r in _rows(rounds, "2") + _rows(rounds, "10")] == [
        ["2", "10^3", "full graph (1 neighbour)"],
        ["2", "10^3", "SecAgg+, = full graph at n = 2 (1 neighbour)"],
        ["10", "10^3", "full graph (9 neighbours)"],
        ["10", "10^3", "SecAgg+, Bell et al.'s k (8 neighbours)"]]
    assert _block(out, "secagg") == result.stdout.rstrip("\n")


def test_secagg_rounds_benchmark(run_script, tmp_path):
    """Issue 18's many-rounds table: every protocol ran every round, plaintext is the unit."""
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/secagg_rounds.py", "--smoke", "--out", str(out)).check()
    assert "### Many rounds of a small model: n = 3, d = 100, 3 rounds" in result.stdout
    names = ["plaintext"] + [f"{a}, {s}" for a in ("semi-honest", "malicious")
                             for s in ("per-round", "once")]
    rows = [r for name in names for r in _rows(result.stdout, name)]
    assert [r[0] for r in rows] == names and rows[0][4] == "1.00x"
    assert all(float(r[3]) > 0 for r in rows)
    assert _block(out, "secagg-rounds") == result.stdout.rstrip("\n")


def _with_ray(script: str, out: Path) -> Result:
    """``python script --smoke --out out`` in a fresh interpreter (Ray must not start inside a
    fork of this process); skipped without flwr."""
    pytest.importorskip("flwr")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, script, "--smoke", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Result(done.returncode, done.stdout, done.stderr).check()


@pytest.mark.slow
def test_engines_benchmark(tmp_path):
    """Issue 17's engine table at its smallest: needs flwr and Ray (about 50 s: Ray's start), so
    slow; a fresh interpreter, since Ray must not start inside a fork of this process."""
    out = tmp_path / "benchmarks.md"
    result = _with_ray("benchmarks/engines.py", out)
    assert "### Round time and bytes per round by engine, n = 3" in result.stdout
    rows = _rows(_section(result.stdout, "### Round time and bytes"), "3")
    ours = ["secureffm plaintext"] + [f"secureffm {sharing}, {who}" for sharing in (
        "secagg, all", "secagg+, groups of 3") for who in ("semi-honest", "malicious server")]
    assert [r[2] for r in rows] == (
        [f"{row}, in-process" for row in ours] + [f"{row}, on Flower" for row in ours]
        + ["Flower plain FedAvg", "Flower SecAgg+, num_shares = all (3), threshold 2",
           "Flower SecAgg+, num_shares = 3, threshold 2"])
    for row in rows:  # every round measured, and bytes counted both ways
        assert float(row[3]) > 0 and float(row[5]) > 0 and float(row[6]) > 0
    calls = _section(result.stdout, "### One `FlowerCalls.call` on the simulation engine")
    assert [r[:2] for r in _rows(calls, "3")] == [["3", "0"], ["3", "1,000"]]
    assert _block(out, "engines") == result.stdout.rstrip("\n")


@pytest.mark.slow
def test_scale_benchmark(tmp_path):
    """Issue 39's scale tables at their smallest: flwr and Ray (slow, a fresh interpreter)."""
    out = tmp_path / "benchmarks.md"
    result = _with_ray("benchmarks/scale.py", out)
    assert [r[1] for r in _rows(result.stdout, "3") + _rows(result.stdout, "5")] == [
        "secagg (2 neighbours)", "secagg-plus (2 neighbours)", "2", "secagg-plus (4 neighbours)"]
    assert "full secagg / secagg-plus at n = 3:" in result.stdout
    assert "One `secagg-plus` round at n = 5 on the simulation engine:" in result.stdout
    assert _block(out, "scale") == result.stdout.rstrip("\n")


@pytest.mark.slow
def test_deployment_benchmark(tmp_path):
    """Issue 39's deployment table at its smallest (1 round, 1 echo): it starts a SuperLink and
    3 SuperNodes three times and Ray once (minutes), so slow; a fresh interpreter."""
    pytest.importorskip("flwr")
    out = tmp_path / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "benchmarks/deployment.py", "--rounds", "1",
                           "--echoes", "1", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    result = Result(done.returncode, done.stdout, done.stderr).check()
    table = _section(result.stdout, "### A deployed round against the simulation engine")
    for name in ("echo, Flower's flower-supernode, SuperExec poll 1 s (default)",
                 "echo, Flower's flower-supernode, SuperExec poll 0.05 s",
                 "echo, secureffm flower-supernode --idle-poll 0.1, SuperExec poll 0.05 s"):
        [row] = _rows(table, name)
        assert float(row[2]) > 0
    for name in ("GOT, deployed, warm process", "GOT, simulation engine", "GOT, in-process"):
        [row] = _rows(table, name)  # s / round, s / exchange, two ratios (0.0x in-process)
        assert float(row[1]) > 0 and all(float(cell.rstrip("x")) >= 0 for cell in row[2:])
    assert re.search(r"GOT: \d+ exchanges in 1 round\(s\)", table)
    parts = [line for line in table.splitlines() if line.startswith("| fresh interpreter")
             or line.startswith("| 3 nodes")]
    assert len(parts) == 5
    assert _block(out, "deployment") == result.stdout.rstrip("\n")


def test_he_benchmark(run_script, tmp_path):
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/he.py", "--smoke", "--out", str(out)).check()
    for heading in ("### Round time, he over plaintext and over secagg",
                    "### Bytes per parameter per client per round",
                    "### CKKS packing against NVIDIA FLARE's, d = 10^3",
                    "### Where the time of an he round goes: n = 10, d = 10^3"):
        assert heading in result.stdout
    rounds = _section(result.stdout, "### Round time")
    assert [r[:2] for r in _rows(rounds, "2") + _rows(rounds, "10")] == [["2", "10^3"],
                                                                         ["10", "10^3"]]
    packing = _section(result.stdout, "### CKKS packing")
    flare = _rows(packing, "NVIDIA FLARE's filter: public key")[0]
    ours = _rows(packing, "`he` (this stage): symmetric")[0]
    assert flare[3] == "140 <= 218" and ours[3] == "140 <= 218"
    assert _block(out, "he") == result.stdout.rstrip("\n")


def test_dp_benchmark(run_script, tmp_path):
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/dp.py", "--smoke", "--out", str(out)).check()
    modes = _rows(result.stdout, "`VelocityMLP(2, 64)` (8,706 params)")
    assert [r[3] for r in modes] == ["`hooks`", "`functorch`", "`ew`", "`ghost`"]
    for row in modes:  # each Opacus mode against the per-example truth, without noise
        assert float(row[-1]) < 1e-4, row
    assert len(_rows(result.stdout, "`UNet(3)`, 8x8x3 (456,963 params)")) == 4
    linear = next(r for r in result.stdout.splitlines() if r.startswith("| `DPGradient`, mode "
                                                                        "`linear`"))
    error, noise = linear.split("|")[-2].split("/")
    assert float(error) < 1e-4 and 0.5 < float(noise) < 2.0
    for heading in ("### Variants of the DP step on the 2D MLPs",
                    "### Where the `DPGradient` step's time goes"):
        assert heading in result.stdout
    assert "**DP step, sum of medians**" in result.stdout
    assert _block(out, "dp") == result.stdout.rstrip("\n")


def test_images_benchmark(run_script, tmp_path):
    """Issue 21's table at its smallest: every configuration measured, the four ratios."""
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/images.py", "--quick", "--threads", "1",
                        "--out", str(out)).check()
    assert "Device: CPU" in result.stdout
    quick = make_unet("guided", 3, base_width=8, channel_mult=(1, 2), image_size=8)
    guided = sum(p.numel() for p in quick.parameters())  # the paper's layout, at --quick's size
    for method, protocol in (("vanilla", "plaintext"), ("got", "plaintext"),
                             ("vanilla", "dp"), ("got", "dp")):
        [row] = [r for r in _rows(result.stdout, method) if r[1] == protocol]
        assert row[2] == f"{guided:,}" and float(row[3]) > 0, row  # parameters, round ms
    for ratio in ("GOT / vanilla, plain", "GOT / vanilla, dp", "dp / plain, vanilla",
                  "dp / plain, GOT"):
        [row] = _rows(result.stdout, ratio)
        assert float(row[1].rstrip("x")) > 0
    assert _block(out, "images") == result.stdout.rstrip("\n")


def test_fedwad_benchmark(run_script, tmp_path):
    out, figure = tmp_path / "benchmarks.md", tmp_path / "fig2.png"
    result = run_script("benchmarks/fedwad.py", "--sizes", "30", "--figure", str(figure),
                        "--out", str(out)).check()
    for dim in (2, 50):
        for ratio in (1, 3):
            assert f"**d = {dim}, ratio 1:{ratio}**" in result.stdout
    rows = _rows(result.stdout, "30")
    assert len(rows) == 4 and all(len(r) == 7 and "not run" not in r for r in rows)
    assert figure.stat().st_size > 0
    assert "| N | W (POT) s |" in _block(out, "fedwad")


def test_fedwad_paper_protocol(run_script, tmp_path):
    """Fig. 2's protocol on the paper's data (closed form 4): every method in every cell, both
    times (sequential / critical path) over exact W's, and the block for docs/benchmarks.md."""
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/fedwad.py", "--paper", "--smoke", "--out",
                        str(out)).check()
    for dim in (2, 50):
        for ratio in (1, 3):
            assert f"**d = {dim}, ratio 1:{ratio}** (exact W: CPU seconds" in result.stdout
    rows = _rows(result.stdout, "30")
    assert len(rows) == 4 and all(len(r) == 7 and "not run" not in r for r in rows)
    sequential, path = (float(v.rstrip("x")) for v in rows[0][3].split(",")[0].split(" / "))
    assert sequential >= path > 0  # the critical path is part of all parties' work
    assert "--paper --smoke" in _block(out, "fedwad_paper")


def test_fedwad_speed_grid(run_script, tmp_path):
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/fedwad.py", "--speed", "--sizes", "110", "--dims", "2",
                        "--out", str(out)).check()
    for header in ("**two Gaussians, d = 2, N = 110", "**Gaussian vs mixture, d = 2, N = 110"):
        assert header in result.stdout
    assert "d = 50" not in result.stdout
    rows = _rows(result.stdout, "0.05-0.95") + _rows(result.stdout, "0.3-0.7")
    assert len(rows) == 4 and all(len(r) == 7 and r[1] == "100" for r in rows)
    block = _block(out, "fedwad_speed_n110")  # a size of its own keeps the default grid's block
    assert "| t range | S | K = 1 |" in block and "--sizes 110 --dims 2" in block


def test_main_job_benchmark(run_script, tmp_path):
    """The job runs in a fresh interpreter of its own; its wall time, memory and parts are
    reported, and the parts timed inside the job leave a remainder >= 0 of its wall time."""
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/main_job.py", "--smoke", "--out", str(out)).check()
    assert "### `secureffm run --protocol dp-secagg --method got`" in result.stdout
    (wall,) = _rows(result.stdout, "wall time")
    (memory,) = _rows(result.stdout, "peak resident memory")
    assert wall[1].endswith(" s") and float(memory[1].split()[0]) > 0.1  # torch alone: > 0.1 GB
    parts = [line.split("|")[1:3] for line in result.stdout.splitlines()
             if line.startswith(("| set-up", "| training (", "| evaluation", "| privacy",
                                 "| interpreter"))]
    assert len(parts) == 8 and float(parts[-1][1].split()[0]) >= 0.0, parts
    (w2,) = _rows(result.stdout, "run 1")
    assert len(w2) == 5 and all(float(v) > 0 for v in w2[1:])  # NFE 1, 2, dopri5, floor
    assert _block(out, "main-job") == result.stdout.rstrip("\n")


def test_tabular_benchmark(run_script, tmp_path):
    """Seconds per round of the main job and of two tabular jobs, their ratios to the main
    job's, and one client's evaluation; the --out block is the printed tables."""
    out = tmp_path / "benchmarks.md"
    result = run_script("benchmarks/tabular.py", "--smoke", "--out", str(out)).check()
    jobs = [[c.strip() for c in line.strip("|").split("|")] for line in result.stdout.splitlines()
            if line.startswith(("| main job", "| breast-cancer", "| wine"))]
    assert [j[0].split(":")[0] for j in jobs] == ["main job", "breast-cancer", "wine"]
    assert jobs[0][3] == "1.00" and all(float(j[2]) > 0 and float(j[3]) > 0 for j in jobs)
    (evaluation,) = _rows(result.stdout, "400")  # 0.2 of 2,000 rows held out
    assert evaluation[1:4] == ["1,600", "2,000", "200"] and float(evaluation[4]) > 0
    assert _block(out, "tabular") == result.stdout.rstrip("\n")


# -- experiments/ ---------------------------------------------------------------------------


def test_tabular_silos_fit_their_schema(run_script, tmp_path):
    """Each silo's CSV passes check_table against the schema with nothing clipped, the silos
    hold every row once, and the split column's ranges do not overlap (non-IID by tertiles)."""
    from secureffm.data.schema import Schema
    from secureffm.data.tables import load_table

    result = run_script("experiments/tabular.py", "--out", str(tmp_path / "data")).check()
    for name, rows, columns, split in (("breast-cancer", 569, 31, "mean_radius"),
                                       ("wine", 178, 14, "alcohol")):
        schema = Schema.load(tmp_path / "data" / name / "schema.toml")
        assert len(schema.columns) == columns
        tables = []
        for k in (1, 2, 3):
            table, report = load_table(tmp_path / "data" / name / f"silo-{k}.csv", schema)
            assert report.clipped == 0 and report.rows > rows // 4
            tables.append(table)
        assert sum(len(t[split]) for t in tables) == rows
        assert tables[0][split].max() < tables[1][split].min()
        assert tables[1][split].max() < tables[2][split].min()
        assert f"silo-1.csv: {len(tables[0][split])} rows" in result.stdout
    wine = Schema.load(tmp_path / "data" / "wine" / "schema.toml")
    assert wine.column("proline").type == "integer"
    assert wine.column("cultivar").categories == ("class_0", "class_1", "class_2")


def test_tabular_comparison(run_script, tmp_path):
    """``run --smoke``: FFM-GOT plaintext and at epsilon 8 through the CLI, the three baselines,
    each scored on the clients' held-out rows; the table, both figures, the silos' files."""
    docs, root = tmp_path / "docs", tmp_path / "runs"
    result = run_script("experiments/tabular.py", "run", "--smoke", "--root", str(root),
                        "--docs", str(docs)).check()
    block = _block(docs / "results.md", "tabular")
    assert block.split("\n\n")[0] in result.stdout
    rows = _rows(block, "wine")
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("FFM-got", "plaintext", "-"), ("FFM-got", "dp-secagg", "8"),
        ("(a) OT-CFM on the pooled rows", "none (centralized)", "-"),
        ("(b) each silo alone (OT-CFM)", "none (local)", "-"),
        ("(b) a silo's model at the other silos", "none (local)", "-"),
        ("(c) DP independent marginals", "Laplace, per silo", "8")]
    assert all(0 <= float(r[6]) <= 1 and 0 <= float(r[7]) <= 1 for r in rows)  # KS, TV
    for figure in ("tabular_marginals", "tabular_correlations"):
        assert (docs / "figures" / f"{figure}.png").stat().st_size > 0
    assert (root / "data" / "wine" / "pooled-train-seed0.csv").exists()
    assert json.loads((root / "runs" / "wine" / "seed-0" / "got-dp-secagg-eps8" / "privacy.json")
                      .read_text())["target_epsilon"] == 8


def test_one_run_audit(run_script, tmp_path):
    docs = tmp_path / "docs"
    run_script("experiments/one_run_audit.py", "--smoke", "--out", str(tmp_path / "runs"),
               "--doc", str(docs / "results.md")).check()
    block = _block(docs / "results.md", "one_run_audit")
    assert [r[1] for r in _rows(block, "dp")] == ["DP-SGD as built", "**noise switched off**"]
    assert (tmp_path / "runs" / "dp-broken" / "canaries.safetensors").is_file()


def test_attacks(run_script, tmp_path):
    docs = tmp_path / "docs"
    result = run_script("experiments/attacks.py", "--smoke", "--protocols", "plaintext",
                        "--runs", str(tmp_path / "runs"), "--doc", str(docs / "results.md")
                        ).check()
    block = _block(docs / "results.md", "attacks")
    assert block.split("\n\n")[1] in result.stdout  # the table
    assert [r[1] for r in _rows(block, "plaintext")] == ["1 (1)", "4 (4)"]
    for batch in (1, 4):
        assert (docs / "figures" / f"attacks_inversion_plaintext_b{batch}.png").stat().st_size


def test_dcfm_2d(run_script, tmp_path):
    docs = tmp_path / "docs"
    result = run_script("experiments/dcfm_2d.py", "--smoke", "--runs", str(tmp_path / "runs"),
                        "--doc", str(docs / "results.md")).check()
    block = _block(docs / "results.md", "dcfm-2d")
    assert block in result.stdout
    for method in ("FedFlow", "DDM", "FedFlow+L", "DDM+L", "DCFM-A", "DCFM-B (observed)",
                   "DCFM-B (marginal)", "DCFM-B (anchored)"):
        assert [r[1] for r in _rows(block, method)] == ["IID", "non-IID"]
    assert len(list((tmp_path / "runs").glob("*-s0/metrics.json"))) == 16
    config = (tmp_path / "runs" / "dcfm-b-anchored-disjoint-s0" / "config.toml").read_text()
    assert 'dcfm_teacher = "anchored"' in config
    assert (docs / "figures" / "dcfm_2d.png").stat().st_size > 0


def test_dcfm_digits(run_script, tmp_path):
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    result = run_script("experiments/dcfm_digits.py", "--smoke", "--methods", "dcfm-b",
                        "--runs", str(runs), "--docs", str(docs)).check()
    with (runs / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], r["partition"]) for r in rows] == [
        ("dcfm-b", "iid"), ("dcfm-b", "dirichlet"), ("real", "-")]
    assert list(rows[0])[:7] == ["method", "partition", "seed", "fd_known", "ca_known",
                                 "fd_novel", "ca_novel"]
    assert len(_rows(result.stdout, "DCFM-B")) == 1
    assert len(_rows(result.stdout, "real training images (floor)")) == 1
    assert (runs / "dcfm_digits_novel.png").stat().st_size > 0
    assert not (docs / "results.md").exists()  # a smoke run's numbers are not results


def test_dcfm_digits_curve(run_script, tmp_path):
    """--curve trains each scale's runs in the --steps-scale folders (where finished runs are
    reused), then writes the curve's CSV, table and figures."""
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    result = run_script("experiments/dcfm_digits.py", "--smoke", "--curve", "1,2", "--methods",
                        "fedflow", "--partitions", "dirichlet", "--runs", str(runs), "--docs",
                        str(docs)).check()
    for folder in ("dcfm_digits-smoke", "dcfm_digits-smoke-x2"):
        assert (runs / folder / "fedflow-dirichlet-s0" / "checkpoint.safetensors").exists()
    with (runs / "dcfm_digits-smoke-curve-dirichlet.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], r["partition"], r["local_steps"]) for r in rows] == [
        ("fedflow", "dirichlet", "2"), ("fedflow", "dirichlet", "4"), ("real", "-", "")]
    assert rows[0]["ca_novel_joint"] != ""
    assert [r[1] for r in _rows(result.stdout, "FedFlow")] == ["2", "4"]
    assert "Dir(0.1) CA* joint" in result.stdout and "IID CA*" not in result.stdout
    for name in ("dcfm_digits_curve_dirichlet.png", "dcfm_digits_curve_dirichlet_novel.png"):
        assert (runs / "dcfm_digits-smoke-curve" / name).stat().st_size > 0
    assert not (docs / "results.md").exists()  # a smoke run's numbers are not results


def test_dp_main_job(run_script, tmp_path):
    docs = tmp_path / "docs"
    result = run_script("experiments/dp_main_job.py", "--smoke", "--root", str(tmp_path / "runs"),
                        "--docs", str(docs)).check()
    block = _block(docs / "results.md", "dp_main_job")
    assert block in result.stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()
            if line.startswith("| ") and not line.startswith(("| setting", "| ---"))]
    assert [r[0].startswith("main job") for r in rows] == [False, True]
    assert [(r[1], r[2]) for r in rows] == [("dp", "rdp"), ("dp-secagg", "rdp")]
    assert (docs / "figures" / "dp_main_job.png").stat().st_size > 0


def test_distributed_noise_gain(run_script, tmp_path):
    result = run_script("experiments/distributed_noise_gain.py", "--clients", "2,5", "--eps", "8",
                        "--rounds", "10", "--docs", str(tmp_path)).check()
    block = _block(tmp_path / "results.md", "distributed_gain")
    assert block.strip() in result.stdout
    assert [r[:3] for r in _rows(block, "2") + _rows(block, "5")] == [["2", "2", "8"],
                                                                       ["5", "3", "8"]]


def test_fedwad_clustering(run_script, tmp_path):
    docs = tmp_path / "docs"
    result = run_script("experiments/fedwad_clustering.py", "--seeds", "1", "--clients", "10",
                        "--iterations", "1", "--support", "5", "--rounds", "1",
                        "--root", str(tmp_path / "runs"), "--docs", str(docs)).check()
    block = _block(docs / "results.md", "fedwad_clustering")
    assert block in result.stdout
    assert len(_rows(block, "clusters")[0]) == len(_rows(block, "random")[0]) == 6
    assert (docs / "figures" / "fedwad_clustering.png").stat().st_size > 0


def test_fedwad_coreset(run_script, tmp_path):
    result = run_script("experiments/fedwad_coreset.py", "--epochs", "1", "--clients", "4",
                        "--clients-per-epoch", "2", "--support", "5", "--iterations", "2",
                        "--docs", str(tmp_path)).check()
    block = _block(tmp_path / "results.md", "fedwad_coreset")
    for split in ("random dealing (all classes per client)", "two classes per client"):
        assert [r[1] for r in _rows(block, split)] == ["exact W", "FedWAD"]
    assert "exact W2(coreset, pooled train)" in result.stdout
    assert (tmp_path / "figures" / "fedwad_coreset_digits.png").stat().st_size > 0


def test_ffm_2d(run_script, tmp_path):
    docs = tmp_path / "docs"
    result = run_script("experiments/ffm_2d.py", "--smoke", "--root", str(tmp_path / "runs"),
                        "--docs", str(docs)).check()
    name = "ffm_2d_8gaussians-moons"
    block = _block(docs / "results.md", name)
    assert block in result.stdout
    for label in ("FFM-vanilla", "FFM-LOT", "FFM-GOT", "FFM-GOT, phi lr 1e-3",
                  "I-CFM (centralized)", "OT-CFM (centralized)"):
        assert len(_rows(block, label)) == 1, label
    for figure in ("w2_nfe", "trajectories"):
        assert (docs / "figures" / f"{name}_{figure}.png").stat().st_size > 0


def test_secagg_vs_plaintext(run_script, tmp_path):
    result = run_script("experiments/secagg_vs_plaintext.py", "--smoke",
                        "--root", str(tmp_path / "runs"), "--docs", str(tmp_path)).check()
    block = _block(tmp_path / "results.md", "secagg_match")
    assert block.strip() in result.stdout
    for method in ("vanilla", "got"):
        rows = _rows(block, method)
        assert [r[1] for r in rows] == ["1", "2", "4", "8", "16", "32", "100", "time and traffic"]


def test_he_vs_plaintext(run_script, tmp_path):
    result = run_script("experiments/secagg_vs_plaintext.py", "--smoke", "--protocol", "he",
                        "--methods", "got", "--root", str(tmp_path / "runs"),
                        "--docs", str(tmp_path)).check()
    block = _block(tmp_path / "results.md", "he_match")
    assert block.strip() in result.stdout
    assert "| method | NFE | W2 plaintext | W2 he | difference |" in block
    assert "--protocol he --methods got" in block
    assert _rows(block, "vanilla") == [] and len(_rows(block, "got")) == 8
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["got-he", "got-plaintext"]


def test_sweep_privacy_utility(run_script, tmp_path):
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    result = run_script("experiments/sweep_privacy_utility.py", "--smoke", "--methods", "vanilla",
                        "--root", str(runs), "--docs", str(docs)).check()
    with (runs / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["protocol"], r["epsilon"]) for r in rows] == [
        ("dp", "8"), ("dp-secagg", "8"), ("dp", "inf"), ("dp-secagg", "inf")]
    assert all(float(r["spent_rdp"]) <= 8.0 for r in rows[:2])
    block = _block(docs / "results.md", "sweep")
    assert block in result.stdout
    assert [r[1] for r in _rows(block, "vanilla, W2 at NFE 2")] == ["dp", "dp-secagg"]
    assert (docs / "figures" / "sweep_privacy_utility.png").stat().st_size > 0
