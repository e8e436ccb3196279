"""Real tables as three silos' files (issue 38, item 5): the data a tabular run starts from.

    .venv/bin/python experiments/tabular.py --out data/tabular

Writes, for each of scikit-learn's bundled tables (no download), ``OUT/<name>/silo-{1,2,3}.csv``
and ``OUT/<name>/schema.toml``:

- ``breast-cancer`` (569 rows x 30 features, plus the binary column ``benign``, scikit-learn's
  target: 1 benign, 0 malignant), split by the tertiles of ``mean_radius``;
- ``wine`` (178 rows x 13 features, plus the categorical column ``cultivar``: class_0, class_1,
  class_2), split by the tertiles of ``alcohol``.

The split is non-IID on purpose: silo 1 holds the rows below the first tertile of the split
column, silo 2 the middle third, silo 3 the rest, so each silo sees a different part of the
joint law (and a different class mix). Column names are scikit-learn's with every run of
non-alphanumeric characters replaced by ``_``.

Bounds: each numeric column's [low, high] is the FULL public table's min and max rounded outward
to a step of one tenth of the column's order of magnitude (``_bounds``). These data sets are
public, so bounds taken from them disclose nothing; for a silo's private table, bounds taken
from its data are a disclosure if the schema is published (docs/data.md). Columns whose values
are all whole numbers (wine's magnesium and proline) are integer columns.

    .venv/bin/python experiments/tabular.py run            # the comparison, then docs/results.md
    .venv/bin/python experiments/tabular.py run --smoke    # seconds: a check only

``run`` writes the silos under ``ROOT/data`` (``--root``, default runs/tabular) and runs, for
each data set, through the command line as a user would (``secureffm.cli.main``, in this
process, one run folder each; a finished one is reused):

- FFM-vanilla and FFM-GOT on the three silos' files, under ``plaintext`` and under
  ``dp-secagg`` at target epsilon 1, 4 and 8 per client (delta the spec's 1e-5), 600 rounds at
  a batch of 32 (breast-cancer) or 16 (wine) per client (``TRAINING``), with ``--shard-size``
  the smallest silo's training rows (the public nominal size that sets q);
- (a) the non-private ceiling: OT-CFM on the pooled training rows, run as one client holding
  ``pooled-train-seed<s>.csv`` with ``--method lot`` (one client's local exact-OT minibatch
  coupling is OT-CFM) and a batch three times the silos', holding out only 3 rows (its own
  evaluation is not used);
- (b) each silo alone: a one-client ``--method lot`` run on its own file (same holdout rows),
  scored by its own client, and also by each other client on its held-out rows (what a silo's
  model knows of the rest of the joint law under the non-IID split);
- (c) independent DP marginals (:mod:`secureffm.methods.dp_marginals`) at epsilon 1, 4, 8:
  each silo releases its training rows' histograms, pooled by sum, sampled independently.

Every model is scored by :func:`~secureffm.metrics.tabular.evaluate_table` on each client's
held-out rows (``holdout_split``: 0.2 of its rows with the run's seed), against the client's
training rows for ML efficacy: FFM runs and (b) on its own silo report it themselves
(metrics.json); for (a), (c) and (b) at the other silos this script samples 1,000 rows (NFE 32,
as the runs) and scores them with the same function.
Seeds (``--seeds``, default 0 and 1): each is a whole replicate (its own holdout rows, the
runs' public randomness, the sampled rows; DP noise comes from OS entropy whatever the seed);
the table's numbers are means over the clients and the seeds, with each seed's mean W2
beside them. Writes the table between the ``tabular`` markers of docs/results.md
(``--docs``) and docs/figures/tabular_marginals.png and tabular_correlations.png (models of the
first seed). ``--smoke``
runs wine only, GOT only, 3 rounds, under runs/smoke/tabular: its numbers are not results.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_wine  # noqa: E402

import secureffm  # noqa: E402
from secureffm.cli import main as secureffm_cli  # noqa: E402
from secureffm.data.files import write_table  # noqa: E402
from secureffm.data.schema import Schema  # noqa: E402
from secureffm.data.silo import Silo, load_silo  # noqa: E402
from secureffm.methods import dp_marginals  # noqa: E402
from secureffm.metrics.tabular import evaluate_table  # noqa: E402
from secureffm.reporting import markdown_table, write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SILOS = 3
DATASETS = {
    # name: (loader, target column, its type, split column)
    "breast-cancer": (load_breast_cancer, "benign", "binary", "mean_radius"),
    "wine": (load_wine, "cultivar", "categorical", "alcohol"),
}


def _name(feature: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", feature).strip("_")


def _bounds(values: np.ndarray) -> tuple[float, float]:
    """[min, max] of a public column rounded outward to a step of 10^(floor(log10(range)) - 1)."""
    low, high = float(values.min()), float(values.max())
    step = 10.0 ** (math.floor(math.log10(high - low)) - 1)
    return (round(math.floor(low / step) * step, 12), round(math.ceil(high / step) * step, 12))


def table_and_schema(name: str) -> tuple[dict[str, np.ndarray], Schema]:
    """The whole public table (a Table: one array per column) and its schema."""
    loader, target, kind, _ = DATASETS[name]
    data = loader()
    table, columns = {}, []
    for j, feature in enumerate(data.feature_names):
        values, column = data.data[:, j], _name(feature)
        low, high = _bounds(values)
        if np.all(values == np.round(values)):
            table[column] = values.astype(np.int64)
            columns.append({"name": column, "type": "integer", "low": math.floor(low),
                            "high": math.ceil(high)})
        else:
            table[column] = values
            columns.append({"name": column, "type": "continuous", "low": low, "high": high})
    if kind == "binary":
        table[target] = data.target.astype(np.int64)
        columns.append({"name": target, "type": "binary"})
    else:
        categories = [str(c) for c in data.target_names]
        table[target] = np.array(categories, dtype=object)[data.target]
        columns.append({"name": target, "type": "categorical", "categories": categories})
    return table, Schema.from_dict({"columns": columns}, source=f"experiments/tabular.py {name}")


def silo_of_rows(values: np.ndarray, silos: int = SILOS) -> np.ndarray:
    """Each row's silo (0 .. silos - 1) by the quantiles of ``values``: silo k holds the rows
    between the k-th and (k + 1)-th of ``silos`` equal quantiles."""
    edges = np.quantile(values, np.arange(1, silos) / silos)
    return np.searchsorted(edges, values, side="right")


def write_silos(name: str, out: Path) -> list[tuple[Path, int]]:
    """Write ``out/name/silo-k.csv`` and ``schema.toml``; returns each silo's file and rows."""
    table, schema = table_and_schema(name)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    comment = ("# Bounds: the full public table's min and max rounded outward (experiments/"
               "tabular.py).\n# The data set is public, so these bounds disclose nothing; "
               "bounds taken from a private\n# silo's data would (docs/data.md).\n\n")
    (folder / "schema.toml").write_text(comment + schema.to_toml())
    silo = silo_of_rows(table[DATASETS[name][3]])
    written = []
    for k in range(SILOS):
        rows = silo == k
        path = folder / f"silo-{k + 1}.csv"
        write_table({column: values[rows] for column, values in table.items()}, path)
        written.append((path, int(rows.sum())))
    return written


# -- run: the comparison ------------------------------------------------------------------------

HOLDOUT = 0.2  # the CLI's default: the public fraction each client holds out
EPSILONS = (1.0, 4.0, 8.0)
SAMPLES, NFE = 1_000, 32  # synthetic rows each client scores, and their Euler steps
# per data set: the batch per client and the rounds (the pooled run's batch is SILOS x batch)
TRAINING = {"breast-cancer": (32, 600), "wine": (16, 600)}
SMOKE = {"rounds": 3, "samples": 60, "nfe": 2}
FIGURE_COLUMNS = {"breast-cancer": ("mean_radius", "mean_texture", "worst_concave_points",
                                    "benign"),
                  "wine": ("alcohol", "flavanoids", "proline", "cultivar")}


@dataclass
class Cell:
    """One row of the table: ``model`` under ``protocol`` at ``epsilon`` (None: no DP), and
    each client's report (dicts of :class:`~secureffm.metrics.tabular.TableReport`)."""

    data: str
    model: str
    protocol: str
    epsilon: float | None
    reports: list[dict]
    train_seconds: float | None = None
    folder: Path | None = None
    seed_w2: list[float] = field(default_factory=list)  # each seed's mean W2 (merge)


def _cli_run(out: Path, files: list[Path], schema: Path, target: str, method: str,
             protocol: str, epsilon: float | None, shard: int, batch: int, rounds: int,
             holdout: float, seed: int, smoke: bool) -> dict:
    """``secureffm run`` as a user types it (reused when ``out`` holds a finished run);
    returns its metrics.json."""
    if not (out / "metrics.json").exists():
        args = ["run", "--method", method, "--protocol", protocol, "--clients", str(len(files)),
                *[a for f in files for a in ("--client-data", str(f))], "--schema", str(schema),
                "--shard-size", str(shard), "--batch-size", str(batch), "--rounds", str(rounds),
                "--holdout", f"{holdout:.6g}", "--target-column", target,
                "--eval-samples", str(SMOKE["samples"] if smoke else SAMPLES),
                "--nfe", str(SMOKE["nfe"] if smoke else NFE), "--threads", "1",
                "--seed", str(seed),
                "--out", str(out), "--overwrite", "--no-progress"]
        if epsilon is not None:
            args += ["--target-epsilon", f"{epsilon:g}"]
        print("secureffm " + " ".join(args), flush=True)
        if secureffm_cli(args) != 0:
            raise SystemExit(f"secureffm run failed: {out}")
    return json.loads((out / "metrics.json").read_text())


def _score(synthetic: dict[str, np.ndarray], silos: list[Silo], schema: Schema,
           target: str) -> list[dict]:
    """Each client's report of ``synthetic`` rows on its own held-out rows (as a run scores)."""
    return [evaluate_table(s.holdout, synthetic, schema, train=s.train,
                           target_column=target).to_dict() for s in silos]


def run_dataset(name: str, root: Path, smoke: bool, seed: int) -> list[Cell]:
    """Every cell of one data set at one seed (module docstring)."""
    target = DATASETS[name][1]
    files = [path for path, _ in write_silos(name, root / "data")]
    schema_path = root / "data" / name / "schema.toml"
    schema = Schema.load(schema_path)
    silos = [load_silo(f, schema, HOLDOUT, seed) for f in files]
    shard = min(len(s.train[target]) for s in silos)
    pooled = root / "data" / name / f"pooled-train-seed{seed}.csv"
    write_table({c: np.concatenate([s.train[c] for s in silos]) for c in schema.names}, pooled)
    batch, rounds = TRAINING[name]
    rounds = SMOKE["rounds"] if smoke else rounds
    runs = root / "runs" / name / f"seed-{seed}"
    common = dict(schema=schema_path, target=target, rounds=rounds, seed=seed, smoke=smoke)
    cells = []
    settings = [("plaintext", None)] + [("dp-secagg", e) for e in EPSILONS]
    for method in ("got",) if smoke else ("vanilla", "got"):
        for protocol, epsilon in settings[::3] if smoke else settings:
            folder = runs / (f"{method}-{protocol}" + (f"-eps{epsilon:g}" if epsilon else ""))
            metrics = _cli_run(folder, files, method=method, protocol=protocol,
                               epsilon=epsilon, shard=shard, batch=batch, holdout=HOLDOUT,
                               **common)
            cells.append(Cell(name, f"FFM-{method}", protocol, epsilon,
                              [metrics["eval"]["clients"][f"client-{k + 1}"]
                               for k in range(SILOS)], metrics["train_seconds"], folder))
    rows = len(pooled.read_text().splitlines()) - 1
    folder = runs / "pooled-otcfm"
    metrics = _cli_run(folder, [pooled], method="lot", protocol="plaintext", epsilon=None,
                       shard=rows - 3, batch=SILOS * batch, holdout=3 / rows, **common)
    model = secureffm.load(folder).sample(SMOKE["samples"] if smoke else SAMPLES,
                                         nfe=SMOKE["nfe"] if smoke else NFE, seed=seed)
    cells.append(Cell(name, "(a) OT-CFM on the pooled rows", "none (centralized)", None,
                      _score(model, silos, schema, target), metrics["train_seconds"], folder))
    alone, elsewhere, seconds = [], [], 0.0
    for k, (path, silo) in enumerate(zip(files, silos, strict=True)):
        if smoke and k:  # one silo is enough for a check
            continue
        folder = runs / f"alone-silo-{k + 1}"
        metrics = _cli_run(folder, [path], method="lot", protocol="plaintext", epsilon=None,
                           shard=len(silo.train[target]), batch=batch, holdout=HOLDOUT,
                           **common)
        alone.append(metrics["eval"]["clients"]["client-1"])
        seconds += metrics["train_seconds"] / SILOS
        rows = secureffm.load(folder).sample(SMOKE["samples"] if smoke else SAMPLES,
                                             nfe=SMOKE["nfe"] if smoke else NFE, seed=seed)
        elsewhere += _score(rows, silos[:k] + silos[k + 1:], schema, target)
    cells.append(Cell(name, "(b) each silo alone (OT-CFM)", "none (local)", None, alone,
                      seconds))
    cells.append(Cell(name, "(b) a silo's model at the other silos", "none (local)", None,
                      elsewhere))
    for epsilon in EPSILONS[-1:] if smoke else EPSILONS:
        cells.append(_dp_marginals(name, silos, schema, target, epsilon, runs, seed, smoke))
    return cells


def _dp_marginals(name: str, silos: list[Silo], schema: Schema, target: str, epsilon: float,
                  runs: Path, seed: int, smoke: bool) -> Cell:
    """(c): the silos' epsilon-DP histograms pooled and sampled; the pooled counts are kept in
    ``runs/dp-marginals-eps<e>/counts.json`` (the noise is not seeded: reruns reuse them)."""
    folder = runs / f"dp-marginals-eps{epsilon:g}"
    path = folder / "counts.json"
    if not path.exists():
        counts = dp_marginals.pool([dp_marginals.release(s.train, schema, epsilon)
                                    for s in silos])
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({k: v.tolist() for k, v in counts.items()}))
    counts = {k: np.array(v) for k, v in json.loads(path.read_text()).items()}
    synthetic = dp_marginals.sample(counts, schema, SMOKE["samples"] if smoke else SAMPLES,
                                    np.random.default_rng(seed))
    return Cell(name, "(c) DP independent marginals", "Laplace, per silo", epsilon,
                _score(synthetic, silos, schema, target), None, folder)


def merge(cells: list[Cell]) -> list[Cell]:
    """One cell per (data, model, protocol, epsilon) over the seeds: the clients' reports of
    every seed, the mean training seconds, each seed's mean W2, the first seed's folder."""
    merged: dict[tuple, Cell] = {}
    seconds: dict[tuple, list[float]] = {}
    for cell in cells:
        key = (cell.data, cell.model, cell.protocol, cell.epsilon)
        into = merged.setdefault(key, Cell(*key, [], folder=cell.folder))
        into.reports += cell.reports
        into.seed_w2.append(summary(cell)["w2"])
        if cell.train_seconds is not None:
            seconds.setdefault(key, []).append(cell.train_seconds)
            into.train_seconds = float(np.mean(seconds[key]))
    return list(merged.values())


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def summary(cell: Cell) -> dict[str, float]:
    """Means over the clients: W2 and floor, mean KS over numeric columns, mean TV over the
    others, correlation difference, efficacy (synthetic, and real: trained on real rows)."""
    r = cell.reports
    return {"w2": _mean(x["w2"] for x in r), "floor": _mean(x["w2_floor"] for x in r),
            "ks": _mean(_mean(x["ks"].values()) for x in r),
            "tv": _mean(_mean(x["tv"].values()) for x in r),
            "corr": _mean(x["correlation"] for x in r),
            "acc": _mean(x["efficacy"]["synthetic"]["accuracy"] for x in r),
            "auc": _mean(x["efficacy"]["synthetic"]["auc"] for x in r),
            "acc_real": _mean(x["efficacy"]["real"]["accuracy"] for x in r),
            "auc_real": _mean(x["efficacy"]["real"]["auc"] for x in r)}


def table(cells: list[Cell]) -> str:
    headers = ["data", "model", "protocol", "epsilon", "W2 (floor)", "W2 by seed", "KS", "TV",
               "corr diff",
               "accuracy synth (real)", "AUC synth (real)", "training s"]
    rows = []
    for c in cells:
        s = summary(c)
        rows.append([c.data, c.model, c.protocol, "-" if c.epsilon is None else f"{c.epsilon:g}",
                     f"{s['w2']:.2f} ({s['floor']:.2f})",
                     ", ".join(f"{w:.2f}" for w in c.seed_w2), f"{s['ks']:.3f}", f"{s['tv']:.3f}",
                     f"{s['corr']:.3f}", f"{s['acc']:.3f} ({s['acc_real']:.3f})",
                     f"{s['auc']:.3f} ({s['auc_real']:.3f})",
                     "-" if c.train_seconds is None else f"{c.train_seconds:.0f}"])
    return markdown_table(headers, rows)


def _synthetic(cell: Cell, schema: Schema, n: int, smoke: bool) -> dict[str, np.ndarray]:
    """Rows from a cell's model for the pictures (FFM run folder, or pooled DP counts)."""
    if cell.model.startswith("(c)"):
        counts = json.loads((cell.folder / "counts.json").read_text())
        return dp_marginals.sample({k: np.array(v) for k, v in counts.items()}, schema, n,
                                   np.random.default_rng(0))
    return secureffm.load(cell.folder).sample(n, nfe=SMOKE["nfe"] if smoke else NFE, seed=0)


def _pick(cells: list[Cell], name: str) -> list[tuple[str, Cell]]:
    """The cells drawn for ``name``: GOT plaintext, GOT at the largest epsilon, DP marginals
    at the largest epsilon (those present)."""
    top = max(c.epsilon or 0 for c in cells)
    wanted = [("FFM-GOT, no DP", "FFM-got", None), (f"FFM-GOT, eps {top:g}", "FFM-got", top),
              (f"DP marginals, eps {top:g}", "(c) DP independent marginals", top)]
    return [(label, c) for label, model, eps in wanted for c in cells
            if c.data == name and c.model == model and c.epsilon == eps]


def plot(cells: list[Cell], root: Path, figures: Path, smoke: bool) -> None:
    """tabular_marginals.png (real vs synthetic, a few columns per data set) and
    tabular_correlations.png (Pearson correlations of the numeric columns, in schema order):
    the real table's 569 or 178 rows (public) against 2,000 rows of each model drawn."""
    names = list(dict.fromkeys(c.data for c in cells))
    real = {n: table_and_schema(n)[0] for n in names}
    schemas = {n: Schema.load(root / "data" / n / "schema.toml") for n in names}
    drawn = {n: [(label, _synthetic(c, schemas[n], 2_000, smoke)) for label, c in
                 _pick(cells, n)] for n in names}
    colours = ["tab:green", "tab:blue", "tab:red"]
    fig, axes = plt.subplots(len(names), 4, figsize=(16, 3.6 * len(names)), squeeze=False)
    for row, n in zip(axes, names, strict=True):
        for ax, column in zip(row, FIGURE_COLUMNS[n], strict=True):
            spec = schemas[n].column(column)
            if spec.numeric:
                edges = np.linspace(float(spec.low), float(spec.high), 25)
                ax.hist(real[n][column], edges, density=True, color="0.75",
                        label="real (all rows)")
                for (label, rows), colour in zip(drawn[n], colours, strict=False):
                    ax.hist(rows[column], edges, density=True, histtype="step", lw=1.8,
                            color=colour, label=label)
            else:
                cats = (0, 1) if spec.type == "binary" else spec.categories
                width = 0.8 / (1 + len(drawn[n]))
                series = [("real (all rows)", real[n][column], "0.55")] + [
                    (label, rows[column], colour)
                    for (label, rows), colour in zip(drawn[n], colours, strict=False)]
                for i, (label, values, colour) in enumerate(series):
                    freq = [np.mean(np.asarray(values) == c) for c in cats]
                    ax.bar(np.arange(len(cats)) + i * width, freq, width, color=colour,
                           label=label)
                ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, [str(c) for c in cats])
            ax.set_title(f"{n}: {column}", fontsize=10)
            ax.set_yticks([])
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(figures / "tabular_marginals.png", dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(len(names), 4, figsize=(17, 4.3 * len(names)), squeeze=False)
    for row, n in zip(axes, names, strict=True):
        numeric = [c.name for c in schemas[n].columns if c.numeric]
        for ax, (label, rows) in zip(row, [("real (all rows)", real[n])] + drawn[n],
                                     strict=False):
            corr = np.nan_to_num(np.corrcoef(np.stack([np.asarray(rows[c], dtype=float)
                                                        for c in numeric])))
            image = ax.imshow(corr, vmin=-1, vmax=1, cmap="RdBu_r")
            ax.set_title(f"{n}: {label}", fontsize=10)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(image, ax=list(row), shrink=0.8, label="Pearson correlation")
    fig.savefig(figures / "tabular_correlations.png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def run_all(args) -> None:
    smoke_root = ROOT / "runs" / "smoke" / "tabular"
    root = Path(args.root or (smoke_root if args.smoke else ROOT / "runs" / "tabular"))
    docs = Path(args.docs or (smoke_root if args.smoke else ROOT / "docs"))
    names = ["wine"] if args.smoke else args.datasets.split(",")
    seeds = [0] if args.smoke else [int(s) for s in args.seeds.split(",")]
    cells = merge([cell for name in names for seed in seeds
                   for cell in run_dataset(name, root, args.smoke, seed)])
    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    plot(cells, root, figures, args.smoke)
    text = table(cells)
    print(text)
    write_block(docs / "results.md", "tabular", text
                + "\n\n![marginals, real vs synthetic](figures/tabular_marginals.png)\n"
                "![correlations of the numeric columns](figures/tabular_correlations.png)\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=("data", "run"), default="data",
                        help="data: write the silos' files (default); run: the comparison")
    parser.add_argument("--out", default="data/tabular", help="data: folder for "
                        "<name>/silo-k.csv and <name>/schema.toml (default data/tabular)")
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"comma-separated, of {', '.join(DATASETS)}")
    parser.add_argument("--root", help="run: data and run folders (default runs/tabular)")
    parser.add_argument("--docs", help="run: folder of results.md and figures/ (default docs)")
    parser.add_argument("--seeds", default="0,1", help="run: comma-separated seeds "
                        "(default 0,1)")
    parser.add_argument("--smoke", action="store_true", help="run: wine, GOT, 3 rounds, seed 0 "
                        "under runs/smoke/tabular (seconds); the numbers are not results")
    args = parser.parse_args(argv)
    for name in args.datasets.split(","):
        if name not in DATASETS:
            parser.error(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    if args.mode == "run":
        run_all(args)
        return
    for name in args.datasets.split(","):
        target, split = DATASETS[name][1], DATASETS[name][3]
        print(f"{name}: split by the tertiles of {split}; target {target}")
        for path, rows in write_silos(name, Path(args.out)):
            print(f"  {path}: {rows} rows")


if __name__ == "__main__":
    main()
