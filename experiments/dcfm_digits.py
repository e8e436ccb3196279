"""The DCFM paper's Table 1 on colored 8 x 8 digits: Frechet distance on known and on novel
combinations and compositional accuracy, for FedFlow, DDM, their +L variants, DCFM-A and DCFM-B,
IID and Dirichlet(0.1), 10 clients at total coverage 1/2, over seeds.

    .venv/bin/python experiments/dcfm_digits.py                # 36 runs, 3 seeds (see SIZES)
    .venv/bin/python experiments/dcfm_digits.py --quick        # 1 seed, short runs: a look
    .venv/bin/python experiments/dcfm_digits.py --smoke        # seconds: a check only
    .venv/bin/python experiments/dcfm_digits.py --data-figure  # docs/figures/colored_digits.png
    .venv/bin/python experiments/dcfm_digits.py --seeds 0 --curve 1,2,4,8,16 \
        --methods fedflow,ddm,dcfm-a,dcfm-b --partitions dirichlet   # learning curves

Runs go to runs/dcfm_digits[-quick|-smoke][-xK]/<method>-<partition>-s<seed> (``--runs``) through
``secureffm run``'s library entry; a finished run (checkpoint.safetensors present) is reused, its
evaluation redone. Evaluation (docs/dcfm-digits.md): an attribute classifier trained on the fully
colored training images gives the features of the Frechet distance and the compositional
accuracy; generated images of every known (held) and every novel combination are compared with
the real test images of those combinations. Writes results.csv in the runs folder,
docs/figures/dcfm_digits[_xK]_novel.png and the table between the dcfm_digits[_xK] markers of
docs/results.md (K: --steps-scale; ``--docs`` moves both). With --quick or --smoke the numbers
are not results: the figure goes to the runs folder and docs/results.md is not written.
``--smoke`` is --quick with one or two steps per stage, one epoch of the classifier and 2
generated images per combination: the default test suite runs it to check that the script
works.

``--curve SCALES`` runs the grid at each of the comma-separated steps scales (the runs of
``--steps-scale K``, in runs/dcfm_digits[-quick|-smoke]-xK, reused when finished, so the curve
can grow a scale at a time and scales can be trained by separate processes, for example one per
``--partitions``), then writes runs/dcfm_digits[-quick|-smoke]-curve.csv (``--runs`` moves the
parent folder), docs/figures/dcfm_digits_curve.png (CA*, FD*, CA° and FD° against steps per
client on a log axis, one line per method, one row of panels per partition),
docs/figures/dcfm_digits_curve_novel.png (samples of the largest scale) and the table between
the dcfm_digits_curve markers of docs/results.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from secureffm.config import load_config  # noqa: E402
from secureffm.data.colored_digits import (  # noqa: E402
    CARDINALITIES,
    COLORS,
    ColoredDigits,
    federated_colored_digits,
    load_colored_digits,
)
from secureffm.metrics.attribute_classifier import (  # noqa: E402
    AttributeClassifier,
    attribute_accuracy,
    classifier_features,
    compositional_accuracy,
    train_attribute_classifier,
)
from secureffm.metrics.frechet import frechet_distance_features  # noqa: E402
from secureffm.metrics.sampling import integrate  # noqa: E402
from secureffm.reporting import mean_std, write_block  # noqa: E402
from secureffm.runs import run  # noqa: E402
from secureffm.runs.dcfm import DCFMSampler, load_dcfm  # noqa: E402
from secureffm.runtime import party_generator  # noqa: E402

METHODS = ("fedflow", "fedflow-l", "ddm", "ddm-l", "dcfm-a", "dcfm-b")
LABELS = {"fedflow": "FedFlow", "fedflow-l": "FedFlow+L", "ddm": "DDM", "ddm-l": "DDM+L",
          "dcfm-a": "DCFM-A", "dcfm-b": "DCFM-B"}
PARTITIONS = ("iid", "dirichlet")
# Run settings (RunConfig fields). Every method gets the same per-client step budget: stage I
# (DDM, DCFM) = FedFlow's rounds x local steps. "full" is sized so that the 36 runs finish in
# about 40 minutes on one shared CPU core (docs/dcfm-digits.md); "quick" only checks the pipeline.
SIZES = {
    "full": dict(local_steps=120, fedflow_rounds=12, fedflow_local_steps=10, dcfm_steps=12,
                 distill_steps=120, teacher_steps=10),
    "quick": dict(local_steps=30, fedflow_rounds=3, fedflow_local_steps=10, dcfm_steps=5,
                  distill_steps=30, teacher_steps=10),
    "smoke": dict(local_steps=2, fedflow_rounds=1, fedflow_local_steps=2, dcfm_steps=1,
                  distill_steps=2, teacher_steps=2),
}
# nfe=(1,): the run's own sample sheet is a 1-step preview; this script samples for the metrics.
COMMON = dict(data="colored-digits", clients=10, coverage=0.5, dirichlet_alpha=0.1, dcfm_rounds=3,
              batch_size=64, hidden=256, lr=2e-3, ema_decay=0.98, nfe=(1,), device="cpu",
              progress=False, eval_samples=100, eval_classifier_epochs=0)  # scored here
EVAL_NFE = 20  # Euler steps of the evaluated samples
EVALUATOR = 2_000_000  # party index of this script's sampling generator
ROOT = Path(__file__).resolve().parents[1]


def _show(ax, images: torch.Tensor) -> None:
    """Images [m, 3, 8, 8] in [-1, 1] side by side on ``ax``."""
    tiles = ((images.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)
    ax.imshow(torch.cat(list(tiles), dim=1).numpy(), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def _frame(ax, novel: bool) -> None:
    for spine in ax.spines.values():
        spine.set_visible(novel)
        spine.set_linewidth(2.5)
        spine.set_linestyle("--")
        spine.set_edgecolor("0.55")


def plot_data_grid(path: Path, seed: int = 0) -> None:
    """Rows digits, columns colors: one real test image per combination; the novel combinations
    of the seed-``seed`` split (held by no client) are framed."""
    data = load_colored_digits("test")
    novel = {tuple(c) for c in federated_colored_digits(seed=seed).novel.tolist()}
    fig, axes = plt.subplots(10, 10, figsize=(8, 8.6))
    for digit in range(10):
        for color, (name, _) in enumerate(COLORS):
            ax = axes[digit, color]
            _show(ax, data.select(digit, color)[digit % 3][None])
            _frame(ax, (digit, color) in novel)
            if digit == 0:
                ax.set_title(name, fontsize=8)
            if color == 0:
                ax.set_ylabel(str(digit), rotation=0, labelpad=10, fontsize=10)
    fig.suptitle("colored digits (sklearn 8x8, test images): rows digit, columns color\n"
                 f"dashed frame: novel combination, held by no client (split seed {seed}, "
                 "coverage 1/2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sample(sampler: DCFMSampler, combos: torch.Tensor, per_combo: int,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``per_combo`` samples [M, 3, 8, 8] of each combination in ``combos`` [m, 2] in one batch,
    with their labels [M, 2], and the fraction of diverged samples (a value beyond +-10 or not
    finite). Samples are clipped to the pixel range [-1, 1] (as saving images for FID does): a
    few diverged samples would otherwise dominate the Frechet distance's moments."""
    y = combos.repeat_interleave(per_combo, dim=0)
    x0 = torch.randn(len(y), *sampler.shape, generator=generator)
    x = integrate(sampler.field(y, generator), x0, EVAL_NFE)[0]
    diverged = float((~(x.abs() <= 10).flatten(1).all(1)).double().mean())
    return x.nan_to_num(nan=0.0).clamp(-1.0, 1.0), y, diverged


def _subset(data: ColoredDigits, combos: torch.Tensor, limit: int | None = None,
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images [M, 3, 8, 8] and labels [M, 2] of ``data`` whose (digit, color) is in ``combos``
    [m, 2]; with ``limit``, a seeded random subset of that many."""
    wanted = set(map(tuple, combos.tolist()))
    index = torch.tensor([i for i, v in enumerate(data.labels.tolist()) if tuple(v) in wanted])
    if limit is not None:
        pick = torch.randperm(len(index), generator=torch.Generator().manual_seed(seed))
        index = index[pick[:limit]]
    return data.x[index], data.labels[index]


def _scores(classifier: AttributeClassifier, reference: dict, generated: dict) -> dict:
    """Frechet distances and compositional accuracies of generated (x, y) per set."""
    out = {}
    for name in ("known", "novel"):
        x, y = generated[name][:2]
        feats = classifier_features(classifier, x)
        out[f"fd_{name}"] = frechet_distance_features(feats, reference[name])
        out[f"ca_{name}"] = compositional_accuracy(classifier, x, y)
    return out


def _run_dir(root: Path, method: str, partition: str, seed: int) -> Path:
    return root / f"{method}-{partition}-s{seed}"


def _train(method: str, partition: str, seed: int, sizes: dict, root: Path) -> Path:
    out = _run_dir(root, method, partition, seed)
    if not (out / "checkpoint.safetensors").exists():  # a finished run is reused
        run(load_config(None, {**COMMON, **sizes, "method": method, "partition": partition,
                                "seed": seed, "out": str(out)}))
    return out


def _steps(size: str, scale: float) -> dict:
    """The run settings of ``size`` with every step count but the per-round ones (FedFlow's local
    steps, the teacher's Euler steps) multiplied by ``scale``."""
    return {k: v if k in ("fedflow_local_steps", "teacher_steps") else max(1, round(v * scale))
            for k, v in SIZES[size].items()}


def _folder(size: str, scale: float) -> str:
    """runs/<this>: dcfm_digits[-quick|-smoke][-xK]."""
    return ("dcfm_digits" + ("" if size == "full" else f"-{size}")
            + ("" if scale == 1 else f"-x{scale:g}"))


def joint_label(sampler: DCFMSampler) -> DCFMSampler:
    """The same models sampled on the joint label, without Eq. (5): DDM's router over the run's
    models (one model: its velocity for the full label). Against the run's own sampler it
    separates what the composition adds from what the models learned."""
    combinations = math.prod(sampler.cardinalities)
    counts = (sampler.counts if sampler.counts.shape[0] == len(sampler.models)
              else torch.ones(len(sampler.models), combinations))
    return DCFMSampler("router", sampler.models, counts, sampler.cardinalities, sampler.shape)


def _grid(jobs: list[tuple[int, str, str]], steps: dict, root: Path,
          classifier: AttributeClassifier, test_set: ColoredDigits, per_combination: int,
          desc: str = "dcfm_digits", joint: bool = False) -> tuple[list[dict], dict]:
    """Train (or reuse) and score each (seed, partition, method) run under ``root``: one row per
    run (its eval.json) and the novel-combination samples of the first seed's runs. With
    ``joint``, the row also scores the run's models on the joint label (:func:`joint_label`),
    columns suffixed ``_joint``."""
    rows, samples = [], {}
    bar = tqdm(jobs, desc=desc, unit="run")
    for seed, partition, method in bar:
        bar.set_postfix_str(f"{method} {partition} s{seed}")
        split = federated_colored_digits(seed=seed)  # held/novel depend on the seed only
        sets = {"known": split.held, "novel": split.novel}
        reference = {k: classifier_features(classifier, _subset(test_set, v)[0])
                     for k, v in sets.items()}
        start = time.perf_counter()
        out = _train(method, partition, seed, steps, root)
        train_seconds = json.loads((out / "metrics.json").read_text())["train_seconds"]
        sampler = load_dcfm(out)
        generator = party_generator(seed, EVALUATOR, torch.device("cpu"))
        generated = {k: _sample(sampler, v, per_combination, generator)
                     for k, v in sets.items()}
        if seed == jobs[0][0]:
            samples[(method, partition)] = generated["novel"]
        row = {"method": method, "partition": partition, "seed": seed,
               **_scores(classifier, reference, generated),
               **{f"diverged_{k}": v[2] for k, v in generated.items()},
               "train_seconds": train_seconds}
        if joint:
            generator = party_generator(seed, EVALUATOR, torch.device("cpu"))
            scored = _scores(classifier, reference,
                             {k: _sample(joint_label(sampler), v, per_combination, generator)
                              for k, v in sets.items()})
            row.update({f"{k}_joint": v for k, v in scored.items()})
        row["seconds"] = time.perf_counter() - start
        (out / "eval.json").write_text(json.dumps(row, indent=2))
        rows.append(row)
        tqdm.write(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in row.items()))
    return rows, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed and short runs")
    parser.add_argument("--smoke", action="store_true",
                        help="1 seed and the shortest runs: checks that the script works "
                             "(seconds); implies --per-combination 2")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--partitions", default=",".join(PARTITIONS),
                        help="comma-separated, among " + ", ".join(PARTITIONS))
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help="multiply every step count (local, FedFlow rounds, DCFM-A, "
                             "distillation) of the chosen size; runs go to a separate folder")
    parser.add_argument("--curve", default=None, metavar="SCALES",
                        help="comma-separated steps scales (e.g. 1,2,4,8): the grid at each "
                             "(runs reused from the --steps-scale folders), drawn as learning "
                             "curves; replaces --steps-scale")
    parser.add_argument("--per-combination", type=int, default=20,
                        help="generated images per combination for the metrics")
    parser.add_argument("--data-figure", action="store_true",
                        help="draw docs/figures/colored_digits.png and stop")
    parser.add_argument("--docs", default=str(ROOT / "docs"),
                        help="folder of results.md and figures/")
    parser.add_argument("--runs", type=Path,
                        help="runs and results.csv (default runs/dcfm_digits[-quick|-smoke][-xK]); "
                             "with --curve, the folder that holds one such folder per scale "
                             "and the curve's CSV (default runs/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Generated features often have dead units: singular covariances, handled by the ridge.
    warnings.filterwarnings("ignore", message="Matrix is singular")
    figures = Path(args.docs) / "figures"
    if args.data_figure:
        figures.mkdir(parents=True, exist_ok=True)
        plot_data_grid(figures / "colored_digits.png")
        return
    if args.smoke:
        args.quick, args.per_combination = True, 2
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    seeds = [int(v) for v in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    methods = args.methods.split(",")
    partitions = [p for p in PARTITIONS if p in args.partitions.split(",")]
    if set(args.partitions.split(",")) - set(PARTITIONS) or not partitions:
        parser.error(f"--partitions: choose among {', '.join(PARTITIONS)}")
    jobs = [(s, p, m) for s in seeds for p in partitions for m in methods]
    command = " ".join(["experiments/dcfm_digits.py"] + sys.argv[1:])

    train_set, test_set = load_colored_digits("train"), load_colored_digits("test")
    classifier = train_attribute_classifier(train_set.x, train_set.labels, CARDINALITIES,
                                            epochs=1 if args.smoke else 4)
    accuracy = attribute_accuracy(classifier, test_set.x, test_set.labels)
    print(f"attribute classifier, held-out: digit {accuracy[0]:.4f}, color {accuracy[1]:.4f}")
    if args.curve:
        curve(args, size, seeds, methods, partitions, jobs, classifier, train_set, test_set,
              accuracy, figures, command)
        return

    steps = _steps(size, args.steps_scale)
    root = args.runs or ROOT / "runs" / _folder(size, args.steps_scale)
    root.mkdir(parents=True, exist_ok=True)
    if args.quick:  # not results: the figure stays with the runs
        figures = root
    figures.mkdir(parents=True, exist_ok=True)
    rows, samples = _grid(jobs, steps, root, classifier, test_set, args.per_combination)
    floor = _floor(seeds, classifier, train_set, test_set, args.per_combination)
    with (root / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), restval="")
        writer.writeheader()
        writer.writerows(rows + floor)
    name = _folder("full", args.steps_scale).replace("-", "_").replace(".", "_")
    plot_novel_grid(figures / f"{name}_novel.png", samples, methods, partitions, test_set,
                    federated_colored_digits(seed=seeds[0]).novel, args.per_combination)
    text = _report(rows, floor, methods, partitions, seeds, accuracy, steps,
                   args.per_combination, command, name)
    if not args.quick:  # a smoke test's numbers are not results
        write_block(Path(args.docs) / "results.md", name, text)
    print(text)


def _floor(seeds: list[int], classifier: AttributeClassifier, train_set: ColoredDigits,
           test_set: ColoredDigits, per_combination: int) -> list[dict]:
    """Scores of real training images of the known and novel combinations, per seed: what a
    perfect generator would get."""
    floor = []
    for seed in seeds:
        split = federated_colored_digits(seed=seed)
        sets = {"known": split.held, "novel": split.novel}
        reference = {k: classifier_features(classifier, _subset(test_set, v)[0])
                     for k, v in sets.items()}
        real = {k: _subset(train_set, v, per_combination * len(v), seed)
                for k, v in sets.items()}
        floor.append({"method": "real", "partition": "-", "seed": seed,
                      **_scores(classifier, reference, real)})
    return floor


def _cell(rows: list[dict], key: str, digits: int) -> str:
    mean, std = mean_std([r[key] for r in rows])
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


# Column names of a partition and of a metric (suffix ° known, * novel combinations).
PARTITION_LABELS = {"iid": "IID", "dirichlet": "Dir(0.1)"}
METRICS = (("fd_known", "FD°", 1), ("fd_novel", "FD*", 1), ("ca_known", "CA°", 3),
           ("ca_novel", "CA*", 3))
# The same models on the joint label (joint_label), in the curve's table.
JOINT = (("fd_novel_joint", "FD* joint", 1), ("ca_known_joint", "CA° joint", 3),
         ("ca_novel_joint", "CA* joint", 3))


def _settings(steps: dict, seeds: list[int], per_combination: int, accuracy: list[float],
              command: str) -> str:
    """The caption shared by the tables: set-up, settings, metrics, classifier, command."""
    sizes = ", ".join(f"{k} {v}" for k, v in {**steps, **COMMON}.items()
                      if k not in ("device", "progress", "data", "nfe"))
    return (
        f"Colored 8x8 digits, 10 clients, total coverage 1/2 (50 known, 50 novel combinations), "
        f"mean ± std over seeds {seeds}; settings: {sizes}. FD: Frechet distance in the "
        f"attribute classifier's 64 features between {per_combination} generated images per "
        "combination (Euler, "
        f"{EVAL_NFE} steps) and all real test images of the known (°) or novel (*) "
        "combinations; CA: compositional accuracy (predicted digit and color both as asked). "
        f"Classifier held-out accuracy: digit {accuracy[0]:.3f}, color {accuracy[1]:.3f}. "
        f"Written by `{command}`.")


def _report(rows: list[dict], floor: list[dict], methods: list[str], partitions: list[str],
            seeds: list[int], accuracy: list[float], steps: dict, per_combination: int,
            command: str, name: str) -> str:
    head = ["method"] + [f"{PARTITION_LABELS[p]} {label}" for p in partitions
                         for _, label, _ in METRICS] + ["train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for method in methods:
        cells = []
        for partition in partitions:
            runs = [r for r in rows if r["method"] == method and r["partition"] == partition]
            cells += [_cell(runs, key, digits) for key, _, digits in METRICS]
        seconds = mean_std([r["train_seconds"] for r in rows if r["method"] == method])[0]
        lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    real = [_cell(floor, key, digits) for key, _, digits in METRICS]
    lines.append("| real training images (floor) | " + " | ".join(real * len(partitions))
                 + " | - |")
    return (_settings(steps, seeds, per_combination, accuracy, command) + "\n\n"
            + "\n".join(lines) + f"\n\n![novel combinations](figures/{name}_novel.png)\n")


def curve(args: argparse.Namespace, size: str, seeds: list[int], methods: list[str],
          partitions: list[str], jobs: list[tuple[int, str, str]],
          classifier: AttributeClassifier, train_set: ColoredDigits, test_set: ColoredDigits,
          accuracy: list[float], figures: Path, command: str) -> None:
    """``--curve``: the grid at each steps scale, as learning curves. A scale's runs are those
    of ``--steps-scale`` (runs/dcfm_digits[-size]-xK), so finished runs are reused and the curve
    can grow one scale at a time. Writes <runs>/dcfm_digits[-size]-curve.csv, the figure
    dcfm_digits_curve.png (one panel per partition and metric, a line per method, steps per
    client on a log axis), the novel-combination samples of the largest scale
    (dcfm_digits_curve_novel.png) and the table between the dcfm_digits_curve markers; with a
    subset of the partitions, each name ends with them (dcfm_digits_curve_dirichlet). Every run
    is also scored on the joint label (:func:`joint_label`: columns "joint", dashed lines)."""
    scales = sorted(float(v) for v in args.curve.split(","))
    base = args.runs or ROOT / "runs"
    prefix = _folder(size, 1)
    name = "dcfm_digits_curve" + ("" if len(partitions) == len(PARTITIONS)
                                  else "_" + "_".join(partitions))
    if args.quick:  # not results: the figures stay with the runs
        figures = base / f"{prefix}-curve"
    figures.mkdir(parents=True, exist_ok=True)
    rows, samples = [], {}
    for scale in scales:
        steps = _steps(size, scale)
        root = base / _folder(size, scale)
        root.mkdir(parents=True, exist_ok=True)
        scored, samples = _grid(jobs, steps, root, classifier, test_set, args.per_combination,
                                desc=f"dcfm_digits x{scale:g}", joint=True)
        rows += [{"scale": scale, "local_steps": steps["local_steps"], **r} for r in scored]
    floor = _floor(seeds, classifier, train_set, test_set, args.per_combination)
    with (base / f"{prefix}-{name[12:].replace('_', '-')}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), restval="")
        writer.writeheader()
        writer.writerows(rows + floor)
    plot_curve(figures / f"{name}.png", rows, floor, methods, partitions)
    plot_novel_grid(figures / f"{name}_novel.png", samples, methods, partitions,
                    test_set, federated_colored_digits(seed=seeds[0]).novel,
                    args.per_combination)
    head = (["method", "steps per client"]
            + [f"{PARTITION_LABELS[p]} {label}" for p in partitions
               for _, label, _ in METRICS + JOINT]
            + ["train s"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for method in methods:
        for scale in scales:
            here = [r for r in rows if r["method"] == method and r["scale"] == scale]
            cells = [_cell([r for r in here if r["partition"] == p], key, digits)
                     for p in partitions for key, _, digits in METRICS + JOINT]
            seconds = mean_std([r["train_seconds"] for r in here])[0]
            lines.append(f"| {LABELS[method]} | {here[0]['local_steps']} | "
                         + " | ".join(cells) + f" | {seconds:.0f} |")
    real = [_cell(floor, key, digits) for key, _, digits in METRICS] + ["-"] * len(JOINT)
    lines.append("| real training images (floor) | - | " + " | ".join(real * len(partitions))
                 + " | - |")
    largest = _steps(size, scales[-1])["local_steps"]
    text = (_settings(_steps(size, 1), seeds, args.per_combination, accuracy, command)
            + " Step counts are those settings times each scale ("
            + ", ".join(f"{v:g}" for v in scales) + "); "
            "steps per client: stage I (FedFlow: rounds x local steps); DCFM-A adds "
            "dcfm_rounds x dcfm_steps composed steps, DCFM-B's server distils for "
            "distill_steps; "
            "train s: the wall-clock training time of one run (mean over partitions and "
            "seeds) on a shared CPU, beside other work: a rough cost only. "
            "Columns \"joint\": the same models sampled on the joint label, without Eq. (5) "
            "(DDM's router over the run's models; FedFlow and DCFM-B: the one model's velocity "
            "for the full label); for DDM they repeat its own columns.\n\n"
            + "\n".join(lines) + f"\n\n![learning curves](figures/{name}.png)\n\n"
            f"![novel combinations at {largest} steps per client]"
            f"(figures/{name}_novel.png)\n")
    if not args.quick:  # a smoke test's numbers are not results
        write_block(Path(args.docs) / "results.md", name, text)
    print(text)


def plot_curve(path: Path, rows: list[dict], floor: list[dict], methods: list[str],
               partitions: list[str]) -> None:
    """One row of panels per partition, one panel per metric (CA*, FD*, CA°, FD°), one line per
    method (mean over seeds) against steps per client on a log axis; dashed, the same models on
    the joint label where the rows have it (not for DDM, whose sampler it is); the real images'
    CA dotted, their FD (two orders of magnitude below) in the panel's title."""
    order = [METRICS[i] for i in (3, 1, 2, 0)]
    fig, axes = plt.subplots(len(partitions), len(order), figsize=(3.3 * len(order),
                             2.9 * len(partitions) + 0.4), squeeze=False)
    for r, partition in enumerate(partitions):
        for c, (key, label, _) in enumerate(order):
            ax = axes[r, c]
            for method in methods:
                here = [x for x in rows if x["method"] == method and x["partition"] == partition]
                steps = sorted({x["local_steps"] for x in here})
                ys = [mean_std([x[key] for x in here if x["local_steps"] == s])[0]
                      for s in steps]
                line = ax.plot(steps, ys, marker="o", label=LABELS[method])[0]
                if f"{key}_joint" in here[0] and method not in ("ddm", "ddm-l"):
                    ys = [mean_std([x[f"{key}_joint"] for x in here if x["local_steps"] == s])[0]
                          for s in steps]
                    ax.plot(steps, ys, linestyle="--", marker=".", color=line.get_color(),
                            label=f"{LABELS[method]}, joint label")
            real = mean_std([x[key] for x in floor])[0]
            title = f"{PARTITION_LABELS[partition]}: {label}"
            if key.startswith("ca"):
                ax.axhline(real, color="0.5", linestyle=":", label="real images")
                ax.set_ylim(0, 1.02)
            else:
                title += f" (real images: {real:.0f})"
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator(steps))
            ax.xaxis.set_major_formatter(FormatStrFormatter("%d"))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("steps per client", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("colored digits: learning curves (° known, * novel combinations; CA higher "
                 "is better, FD lower is better; dashed: the same models on the joint label, "
                 "without Eq. 5)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_novel_grid(path: Path, samples: dict, methods: list[str], partitions: list[str],
                    test_set: ColoredDigits, novel: torch.Tensor, per_combination: int,
                    shown: int = 6, per_cell: int = 3) -> None:
    """Rows: real test images, then each method; columns: ``shown`` novel combinations (of
    distinct digits and colors) under each partition, ``per_cell`` images each."""
    picks, used = [], set()
    for i, (digit, color) in enumerate(novel.tolist()):
        if not {("d", digit), ("c", color)} & used and len(picks) < shown:
            picks.append(i)
            used |= {("d", digit), ("c", color)}
    fig, axes = plt.subplots(1 + len(methods), len(partitions) * shown,
                             figsize=(1.6 * shown * len(partitions),
                                      0.75 * (1 + len(methods)) + 0.8), squeeze=False)
    for g, partition in enumerate(partitions):
        for c, i in enumerate(picks):
            digit, color = novel[i].tolist()
            column = g * shown + c
            _show(axes[0, column], test_set.select(digit, color)[:per_cell])
            axes[0, column].set_title(f"{PARTITION_LABELS[partition]}: "
                                      f"{digit}, {COLORS[color][0]}", fontsize=7)
            for r, method in enumerate(methods, start=1):
                x = samples[(method, partition)][0]
                start = i * per_combination
                _show(axes[r, column], x[start:start + per_cell])
    for r, name in enumerate(["real (test)"] + [LABELS[m] for m in methods]):
        axes[r, 0].set_ylabel(name, rotation=0, ha="right", fontsize=8)
    fig.suptitle("novel combinations (held by no client), first seed: generated images per "
                 "method", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
