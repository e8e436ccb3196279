"""DP-SGD step time over the non-private step: Opacus' grad-sample modes on our models, where the
ghost-clipping step's time goes, and faster ways to clip per example for small MLPs.

    .venv/bin/python benchmarks/dp.py                            # every case (a few minutes)
    .venv/bin/python benchmarks/dp.py --quick                    # no 28x28 U-Net
    .venv/bin/python benchmarks/dp.py --out docs/benchmarks.md   # also write the tables
    .venv/bin/python benchmarks/dp.py --smoke                    # seconds: a check only

A step is one forward of the per-example flow matching loss [B] (``flow_matching_loss`` on fixed
random x0, x1 with fresh t) and the gradient. The non-private step is ``zero_grad``, the loss and
``losses.mean().backward()``. A DP step leaves in ``p.grad`` (or returns, for ``DPGradient``)
(sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B: per-example clipping, noise and the average. Plain
and DP steps alternate within one process, so both see the same background load; a ratio is the
DP median over the plain median. Progress goes to stderr, the tables (markdown) to stdout and,
with ``--out``, between the ``<!-- dp:begin -->`` and ``<!-- dp:end -->`` markers of that file.
``--smoke`` runs every table on two cases (the 64-wide MLP and the 8x8 U-Net at batch 16, one
thread) with the fewest rounds (5) and no time budget: the default test suite runs it to check
that the script works; its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import platform
import pstats
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import opacus
import torch
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.utils import wrap_model
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn
from torch.func import functional_call, grad, vmap

from secureffm.methods.flow_matching import flow_matching_loss, sample_path
from secureffm.models import VelocityMLP
from secureffm.models.params import flat_grad
from secureffm.models.unet import UNet
from secureffm.privacy import DPGradient, PlainGradient
from secureffm.reporting import markdown_table, write_block

__all__ = ["main"]

CLIP, SIGMA = 1.0, 1.0
MODES = ("hooks", "functorch", "ew", "ghost")
# A step of a few hundred microseconds runs faster after itself than after another kind of step
# (caches, allocator): steps are timed in blocks of back-to-back calls of about this length.
_BLOCK_S = 0.01
# One step: ``scale`` multiplies the per-example losses (0 isolates the noise in the checks).
# DPGradient-based steps return the flat gradient; the others leave it in p.grad.
Step = Callable[[float], np.ndarray | None]
Factory = Callable[[nn.Module, torch.Tensor, torch.Tensor, float, float], Step]



def _fm_loss(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor,
             gen: torch.Generator) -> torch.Tensor:
    """The per-example flow matching loss [B] at times t ~ U[0, 1) drawn from ``gen``."""
    return flow_matching_loss(model, x0, x1, torch.rand(len(x0), generator=gen))

def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _ms(seconds: list[float]) -> str:
    med = 1e3 * statistics.median(seconds)
    return f"{med:,.2f} ({1e3 * min(seconds):,.2f}-{1e3 * max(seconds):,.2f})"


def _t_gen() -> torch.Generator:
    """The t draws: the same sequence for every step kind, so the checks compare like with like."""
    return torch.Generator().manual_seed(1)


# -- steps -------------------------------------------------------------------------------------


def _plain(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
           sigma: float) -> Step:
    gen = _t_gen()

    def step(scale: float = 1.0) -> None:
        model.zero_grad(set_to_none=True)
        (scale * _fm_loss(model, x0, x1, gen)).mean().backward()

    return step


def _opacus(mode: str, set_to_none: bool = True) -> Factory:
    """Opacus as its tutorials wire it: a grad-sample module of ``mode`` and the matching
    DPOptimizer (loss_reduction "mean", expected batch B); ``pre_step`` clips, adds the noise
    and divides by B (``step`` would also move the weights, which is not timed here)."""

    def make(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
             sigma: float) -> Step:
        ghost = mode == "ghost"
        extra = {"use_ghost_clipping": True, "max_grad_norm": clip} if ghost else {}
        module = wrap_model(model, mode, batch_first=True, loss_reduction="mean", **extra)
        cls = DPOptimizerFastGradientClipping if ghost else DPOptimizer
        optimizer = cls(torch.optim.SGD(model.parameters(), lr=0.0), noise_multiplier=sigma,
                        max_grad_norm=clip, expected_batch_size=len(x0), loss_reduction="mean",
                        generator=torch.Generator().manual_seed(2))
        gen = _t_gen()

        def step(scale: float = 1.0) -> None:
            optimizer.zero_grad(set_to_none=set_to_none)
            losses = scale * _fm_loss(module, x0, x1, gen)
            if ghost:
                DPTensorFastGradientClipping(module, optimizer, losses, "mean").backward()
            else:
                losses.mean().backward()
            optimizer.pre_step()

        return step

    return make


def _plain_gradient(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
                    sigma: float) -> Step:
    estimator, gen = PlainGradient(model), _t_gen()
    return lambda scale=1.0: estimator(scale * _fm_loss(model, x0, x1, gen), len(x0))


def _dp_gradient(mode: str) -> Factory:
    def make(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
             sigma: float) -> Step:
        estimator = DPGradient(model, clip, sigma, len(x0), torch.Generator().manual_seed(2),
                               mode=mode)
        gen = _t_gen()
        return lambda scale=1.0: estimator(
            scale * _fm_loss(estimator.forward_module, x0, x1, gen), len(x0))

    return make


def _dp_gradient_rebuilt(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
                         sigma: float) -> Step:
    gen, noise, last = _t_gen(), torch.Generator().manual_seed(2), []

    def step(scale: float = 1.0) -> np.ndarray:
        if last:
            last.pop().forward_module._close()  # remove the hooks, as a fresh wrapper needs
        estimator = DPGradient(model, clip, sigma, len(x0), noise, mode="ghost")
        last.append(estimator)
        return estimator(scale * _fm_loss(estimator.forward_module, x0, x1, gen),
                         len(x0))

    return step


def _add_flat_noise(params: list[nn.Parameter], std: float, divisor: float,
                    generator: torch.Generator) -> None:
    """p.grad <- (p.grad + N(0, std^2)) / divisor for all parameters, from one normal draw."""
    noise = torch.normal(0.0, std, (sum(p.numel() for p in params),), generator=generator)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.add_(noise[offset:offset + n].view_as(p)).div_(divisor)
        offset += n


def _ghost_own_noise(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
                     sigma: float) -> Step:
    """Opacus' ghost-clipping module for the per-example norms; the two backward passes and the
    noise written out: no DPOptimizer (its per-parameter deepcopy and noise draws) and no
    DPTensorFastGradientClipping."""
    module = GradSampleModuleFastGradientClipping(model, max_grad_norm=clip,
                                                  use_ghost_clipping=True, loss_reduction="sum")
    params = [p for p in model.parameters() if p.requires_grad]
    gen, noise = _t_gen(), torch.Generator().manual_seed(2)

    def step(scale: float = 1.0) -> None:
        for p in params:
            p.grad = None
        losses = scale * _fm_loss(module, x0, x1, gen)
        losses.sum().backward(retain_graph=True)  # hooks store each example's norm
        for p in params:
            p.grad = None
        with torch.no_grad():
            coef = module.get_clipping_coef()  # min(1, C / |g_i|)
        module.disable_hooks()
        (coef * losses).sum().backward()  # sum_i clip_C(g_i)
        module.enable_hooks()
        with torch.no_grad():
            _add_flat_noise(params, sigma * clip, len(x0), noise)

    return step


def _vmap_grad(model: nn.Module, x0: torch.Tensor, x1: torch.Tensor, clip: float,
               sigma: float) -> Step:
    """Per-example gradients [B, ...] with ``torch.func.vmap(grad(loss of one example))``, then
    the norms, the clipped sum (one tensordot per parameter) and one noise draw."""
    gen, noise = _t_gen(), torch.Generator().manual_seed(2)
    named = dict(model.named_parameters())

    def one(params: dict[str, torch.Tensor], a: torch.Tensor, b: torch.Tensor,
            t: torch.Tensor, scale: float) -> torch.Tensor:
        path = sample_path(a[None], b[None], t[None])
        error = functional_call(model, params, (path.x_t, path.t)) - path.u_t
        return scale * error.pow(2).mean()

    per_example = vmap(grad(one), in_dims=(None, 0, 0, 0, None))

    def step(scale: float = 1.0) -> None:
        t = torch.rand(len(x0), generator=gen)
        grads = per_example({k: p.detach() for k, p in named.items()}, x0, x1, t, scale)
        with torch.no_grad():
            squared = sum(g.flatten(1).pow(2).sum(1) for g in grads.values())
            coef = (clip / (squared.sqrt() + 1e-6)).clamp(max=1.0)
            for k, p in named.items():
                p.grad = torch.tensordot(coef, grads[k], dims=1)
            _add_flat_noise(list(named.values()), sigma * clip, len(x0), noise)

    return step


# -- timing ------------------------------------------------------------------------------------


def _time(steps: dict[str, Step], budget_s: float, min_rounds: int,
          max_rounds: int) -> tuple[dict[str, list[float]], int]:
    """Steady-state timings, as in a training loop that repeats one kind of step: after two
    untimed warm-up rounds (and a third that estimates each step's time), every round runs each
    step in order as a block of back-to-back calls lasting about ``_BLOCK_S`` (1 to 20 calls),
    timing every call. Rounds fill ``budget_s``. Returns the timings and the rounds."""
    for _ in range(2):
        for step in steps.values():
            step(1.0)
    estimate = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        step(1.0)
        estimate[name] = max(time.perf_counter() - t0, 1e-9)
    block = {name: max(1, min(20, int(_BLOCK_S / t))) for name, t in estimate.items()}
    per_round = sum(block[name] * estimate[name] for name in steps)
    rounds = max(min_rounds, min(max_rounds, int(budget_s / per_round)))
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            for _ in range(block[name]):
                t0 = time.perf_counter()
                step(1.0)
                times[name].append(time.perf_counter() - t0)
    return times, rounds


def _data(batch: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed x0, x1 [batch, *shape] (standard normal; only the timing matters)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, *shape, generator=g), torch.randn(batch, *shape, generator=g)


@dataclass(frozen=True)
class _Case:
    label: str
    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    batch: int
    threads: int
    budget_s: float

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make()


def _cases(quick: bool, smoke: bool = False) -> list[_Case]:
    mlp = [("`VelocityMLP(2, 64)`", lambda: VelocityMLP(2, 64)),
           ("`VelocityMLP(2, 256)` (3x256)", lambda: VelocityMLP(2, 256))]
    if smoke:  # no budget: the fewest rounds (5) of each
        return [_Case(mlp[0][0], mlp[0][1], (2,), 256, 1, 0.0),
                _Case("`UNet(3)`, 8x8x3", lambda: UNet(3), (3, 8, 8), 16, 1, 0.0)]
    cases = [_Case(label, make, (2,), 256, 1, 2.0) for label, make in mlp]
    cases.append(_Case("`UNet(3)`, 8x8x3", lambda: UNet(3), (3, 8, 8), 64, 1, 5.0))
    # Below 32 examples PyTorch's expanded weights take another convolution path.
    cases.append(_Case("`UNet(3)`, 8x8x3", lambda: UNet(3), (3, 8, 8), 16, 1, 3.0))
    if not quick:
        cases.append(_Case("`UNet(1)`, 28x28x1", lambda: UNet(1), (1, 28, 28), 64, 1, 8.0))
    cases += [_Case(label, make, (2,), 256, 2, 2.0) for label, make in mlp]
    return cases


def _error(e: Exception) -> str:
    message = " ".join(str(e).split())
    return f"`{type(e).__name__}`: {message[:160]}{'...' if len(message) > 160 else ''}"


def _reference(base: nn.Module, x0: torch.Tensor,
               x1: torch.Tensor) -> tuple[float, np.ndarray]:
    """The checks' truth, one example at a time with plain autograd: the clip C = the median
    per-example gradient norm (so about half the examples clip) and sum_i clip_C(g_i) / B."""
    model = copy.deepcopy(base)
    t = torch.rand(len(x0), generator=_t_gen())  # the draw _fm_loss makes
    grads = []
    for i in range(len(x0)):
        path = sample_path(x0[i:i + 1], x1[i:i + 1], t[i:i + 1])
        model.zero_grad(set_to_none=True)
        (model(path.x_t, path.t) - path.u_t).pow(2).mean().backward()
        grads.append(flat_grad(model).astype(np.float64))
    norms = np.linalg.norm(np.stack(grads), axis=1)
    clip = float(np.median(norms))
    clipped = sum(g * min(1.0, clip / (n + 1e-6)) for g, n in zip(grads, norms, strict=True))
    return clip, clipped / len(x0)


def _modesmarkdown_table(cases: list[_Case]) -> str:
    rows = []
    truths: dict[tuple[str, int], tuple[float, np.ndarray]] = {}
    for case in cases:
        torch.set_num_threads(1)  # the checks; timing runs at the case's thread count
        base = case.model()
        params = sum(p.numel() for p in base.parameters())
        x0, x1 = _data(case.batch, case.shape)
        if (case.label, case.batch) not in truths:
            truths[case.label, case.batch] = _reference(base, x0, x1)
        clip, reference = truths[case.label, case.batch]
        for mode in MODES:
            _say(f"{case.label}, batch {case.batch}, {case.threads} thread(s), {mode} ...")
            label = [f"{case.label} ({params:,} params)", str(case.batch), str(case.threads),
                     f"`{mode}`"]
            try:
                torch.set_num_threads(1)
                model = copy.deepcopy(base)
                _opacus(mode)(model, x0, x1, clip, 0.0)(1.0)
                error = np.abs(flat_grad(model) - reference).max() / np.linalg.norm(reference)
                torch.set_num_threads(case.threads)
                steps = {"plain": _plain(copy.deepcopy(base), x0, x1, CLIP, SIGMA),
                         mode: _opacus(mode)(copy.deepcopy(base), x0, x1, CLIP, SIGMA)}
                times, rounds = _time(steps, case.budget_s, 5, 300)
            except Exception as e:  # noqa: BLE001 - a mode that fails is a result to print
                rows.append(label + ["", _error(e), "fails", "", ""])
                _say(f"    fails: {_error(e)}")
                continue
            ratio = statistics.median(times[mode]) / statistics.median(times["plain"])
            rows.append(label + [_ms(times["plain"]), _ms(times[mode]), f"**{ratio:.1f}x**",
                                 str(rounds), f"{error:.0e}"])
            _say(f"    {ratio:.1f}x")
    return markdown_table(["model", "batch", "threads", "mode", "plain ms (min-max)",
                   "DP ms (min-max)", "ratio of medians", "rounds", "check"], rows)


# -- variants of the DP step on the 2D MLP -----------------------------------------------------

VARIANTS: list[tuple[str, Factory, str]] = [
    ("plain step (the denominator)", _plain, "not private"),
    ("`PlainGradient` (adds the flat numpy copy)", _plain_gradient, "not private"),
    ("`DPGradient`, mode `linear` (the automatic choice for Linear-only nets, as "
     "`methods/ffm.py` uses it): one backward to the layer outputs G, norms from G and the "
     "inputs A, clipped sum (c G)^T A, one noise draw", _dp_gradient("linear"),
     "yes: exact norms; checked against per-example truth"),
    ("`DPGradient`, mode `ghost` (Opacus' ghost clipping, built once, reused)",
     _dp_gradient("ghost"), "yes (Opacus)"),
    ("`DPGradient`, mode `ghost`, rebuilt every step", _dp_gradient_rebuilt, "yes (Opacus)"),
    ("Opacus ghost: module + `DPOptimizerFastGradientClipping` + `DPTensor...`, mean, no numpy",
     _opacus("ghost"), "yes (Opacus)"),
    ("same, `zero_grad(set_to_none=False)`", _opacus("ghost", set_to_none=False),
     "yes (Opacus)"),
    ("Opacus ghost module for the norms; two backward passes and one flat noise draw by hand, "
     "under `no_grad`", _ghost_own_noise, "yes: Opacus' norms, same sum, same noise law"),
    ("`torch.func`: `vmap(grad(loss of one example))`, clip, tensordot, one noise draw",
     _vmap_grad, "yes: exact per-example gradients"),
]


def _check(factory: Factory, base: nn.Module, x0: torch.Tensor, x1: torch.Tensor,
           reference: np.ndarray, clip: float) -> str:
    """Against the one-example-at-a-time truth without noise (max |difference| / |truth|), and
    the noise alone (losses times 0: std of the result over sigma C / B)."""
    results = []
    for sigma, scale in ((0.0, 1.0), (SIGMA, 0.0)):
        model = copy.deepcopy(base)
        out = factory(model, x0, x1, clip, sigma)(scale)
        results.append(out if out is not None else flat_grad(model))
    err = np.abs(results[0] - reference).max() / np.linalg.norm(reference)
    return f"{err:.0e} / {results[1].std() / (SIGMA * clip / len(x0)):.3f}"


def _variants(configs: tuple[tuple[int, int], ...], rounds: int,
              budget_s: float) -> tuple[str, str]:
    """Every variant and the plain step, round robin, for each (hidden width, threads) of
    ``VelocityMLP(2, hidden)`` at batch 256 (``rounds``, fewer where they would take over
    ``budget_s``); and the checks, on the first configuration at 1 thread."""
    results, done, checks, clip = {}, {}, {}, 0.0
    for hidden, threads in configs:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        base = VelocityMLP(2, hidden)
        x0, x1 = _data(256, (2,))
        if not checks:
            torch.set_num_threads(1)
            clip, reference = _reference(base, x0, x1)
            checks = {name: _check(f, base, x0, x1, reference, clip)
                      if kind != "not private" else "" for name, f, kind in VARIANTS}
            torch.set_num_threads(threads)
        _say(f"variants of the DP step, VelocityMLP(2, {hidden}), batch 256, {threads} "
             "thread(s) ...")
        steps = {name: f(copy.deepcopy(base), x0, x1, CLIP, SIGMA) for name, f, _ in VARIANTS}
        results[hidden, threads], done[hidden, threads] = _time(steps, budget_s, 5, rounds)
    rows = []
    for name, _, kind in VARIANTS:
        row = [name]
        for config in configs:
            plain = statistics.median(results[config][VARIANTS[0][0]])
            med = statistics.median(results[config][name])
            row += [f"{1e3 * med:,.2f}", f"**{med / plain:.2f}x**"]
        rows.append(row + [kind, checks[name]])
    headers = ["step"]
    for hidden, threads in configs:
        headers += [f"{hidden} wide, {threads} thread{'s' if threads > 1 else ''}: ms",
                    "/ plain"]
    headers += ["sound (clips each example's whole gradient to C, adds N(0, sigma^2 C^2))",
                "check: max error / noise std"]
    hidden, _ = configs[0]
    counts = ", ".join(f"{done[c]} ({c[0]} wide, {c[1]} thread{'s' if c[1] > 1 else ''})"
                       for c in configs)
    note = (f"`VelocityMLP(2, hidden)`, batch 256. Rounds: {counts}; every round runs each "
            "step in the order listed, as a block of back-to-back calls of about "
            f"{1e3 * _BLOCK_S:.0f} ms (1 to 20 calls), after two untimed warm-up rounds; a ratio "
            "is the step's median over the plain step's median in the same rounds. The check "
            "runs "
            f"on `VelocityMLP(2, {hidden})` at 1 thread with C = {clip:.3g} (the median "
            "per-example norm, so about half the examples clip): max |result (sigma = 0) - "
            "truth| over |truth|, the truth computed one example at a time, then, with the "
            "losses multiplied by 0, the std of the result over sigma C / B (1 when the noise "
            "is N(0, sigma^2 C^2) / B).")
    return markdown_table(headers, rows), note


# -- where the time goes -----------------------------------------------------------------------


def _phases(rounds: int) -> str:
    """The plain step and `DPGradient.__call__` (ghost mode) replayed call by call (the same
    calls in the same order as `DPGradient._ghost`), timed."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = VelocityMLP(2, 64)
    x0, x1 = _data(256, (2,))
    plain_model = copy.deepcopy(base)
    dp = DPGradient(copy.deepcopy(base), CLIP, SIGMA, 256, torch.Generator().manual_seed(2),
                    mode="ghost")
    module, model, params = dp.forward_module, dp.model, dp.params
    gen = _t_gen()
    laps: dict[str, list[float]] = defaultdict(list)
    clock = [0.0]

    def lap(name: str) -> None:
        now = time.perf_counter()
        laps[name].append(now - clock[0])
        clock[0] = now

    def plain() -> None:
        clock[0] = time.perf_counter()
        plain_model.zero_grad(set_to_none=True)
        lap("plain: `zero_grad`")
        losses = _fm_loss(plain_model, x0, x1, gen)
        lap("plain: forward (loss [B])")
        losses.mean().backward()
        lap("plain: backward")

    def ghost() -> None:
        clock[0] = time.perf_counter()
        for p in params:
            p.grad = None
        lap("DP: clear grads")
        losses = _fm_loss(module, x0, x1, gen)
        lap("DP: forward through the hooked module (activations stored)")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            lap("DP: `warnings.catch_warnings` set-up")
            losses.sum().backward(retain_graph=True)
            lap("DP: backward 1 (gradients + per-example norm hooks)")
            for p in params:
                p.grad = None
            with torch.no_grad():
                coef = module.get_clipping_coef()
            lap("DP: clipping coefficients (stack, norm, clamp)")
            module.disable_hooks()
            (coef * losses).sum().backward()
            module.enable_hooks()
            lap("DP: backward 2 (sum of c_i loss_i, hooks off)")
        total = flat_grad(model)
        lap("DP: flat numpy copy")
        noise = torch.normal(0.0, SIGMA * CLIP, (total.size,), generator=dp.generator)
        (total + noise.numpy()) / np.float32(256)
        lap("DP: one noise draw over all parameters, / E[b]")

    for _ in range(20):
        plain()
        ghost()
    laps.clear()
    for _ in range(max(1, rounds // 10)):  # blocks of 10, as in _time
        for _ in range(10):
            plain()
        for _ in range(10):
            ghost()
    med = {name: statistics.median(v) for name, v in laps.items()}
    plain_total = sum(v for k, v in med.items() if k.startswith("plain"))
    rows = [[name, f"{1e6 * v:,.0f}", f"{v / plain_total:.2f}x"] for name, v in med.items()]
    dp_total = sum(v for k, v in med.items() if k.startswith("DP"))
    rows.append(["**plain step, sum of medians**", f"{1e6 * plain_total:,.0f}", "1.00x"])
    rows.append(["**DP step, sum of medians**", f"{1e6 * dp_total:,.0f}",
                 f"**{dp_total / plain_total:.2f}x**"])
    return markdown_table(["phase", "us (median)", "/ plain step"], rows)


_BUCKETS = [  # (label, test on (filename, function name)), first match wins
    ("autograd engine: backward kernels (C++)", lambda f, n: "run_backward" in n),
    ("`copy.deepcopy` (DPOptimizer.accumulate)", lambda f, n: "deepcopy" in n
     or f.endswith("/copy.py") or "torch/storage.py" in f),
    ("Opacus grad-sample hooks (activations, norms)", lambda f, n: "opacus/grad_sample" in f),
    ("DP optimizer (Opacus; `torch.optim` zero_grad and its wrappers)",
     lambda f, n: "opacus/optimizers" in f or "torch/optim/" in f or "torch/_dynamo" in f
     or "torch/_functorch/utils.py" in f or "torch/utils/_contextlib.py" in f),
    ("Opacus `DPTensorFastGradientClipping`", lambda f, n: "opacus/utils" in f),
    ("full-backward-hook plumbing (`torch.utils.hooks`, BackwardHookFunction)",
     lambda f, n: "torch/utils/hooks.py" in f or "torch/autograd/function.py" in f
     or n == "<built-in method apply>"),
    ("autograd Python entry (`Tensor.backward`, `autograd.backward`)",
     lambda f, n: "torch/autograd" in f or f.endswith("torch/_tensor.py")),
    ("`nn.Module` call machinery (`_call_impl`, hooks dispatch)",
     lambda f, n: "torch/nn/modules/module.py" in f),
    ("layer forwards (`torch.nn` Linear, SELU, Sequential, functional)",
     lambda f, n: "torch/nn/" in f),
    ("warnings", lambda f, n: "warnings" in f or "warn" in n),
    ("secureffm and this script (loss, model forward, flat_grad)",
     lambda f, n: "/secureffm/" in f or f.endswith("benchmarks/dp.py")),
    ("tensor ops (torch built-ins and their Python wrappers)",
     lambda f, n: "torch/functional.py" in f or "torch/_VF.py" in f
     or (f == "~" and ("torch" in n or "Tensor" in n))),
]


def _own_bucket(func: tuple[str, int, str]) -> str | None:
    filename, _, name = func
    filename = filename.replace("\\", "/")
    return next((label for label, test in _BUCKETS if test(filename, name)), None)


def _bucket(func: tuple[str, int, str], stats: dict) -> list[tuple[str, float]]:
    """(cost, own seconds) pairs for one profiled function: a function no cost names (Python
    built-ins such as isinstance, hasattr) is split over its callers' costs by call time."""
    own, callers = stats[func][2], stats[func][4]
    label = _own_bucket(func)
    if label is not None or not callers:
        return [(label or "other", own)]
    weights = {caller: entry[2] for caller, entry in callers.items()}
    total = sum(weights.values()) or 1.0
    return [(_own_bucket(caller) or "other", own * w / total) for caller, w in weights.items()]


def _short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return f"`{name.strip('<>')}`"
    parts = filename.replace("\\", "/").split("/")
    where = "/".join(parts[-2:])
    return f"`{name}` ({where}:{line})"


def _profile(steps: int, top: int) -> tuple[str, str]:
    """cProfile ``steps`` plain steps and ``steps`` DPGradient steps (own time per step by cost,
    and the DP step's top functions)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = VelocityMLP(2, 64)
    x0, x1 = _data(256, (2,))
    kinds = {"plain": _plain(copy.deepcopy(base), x0, x1, CLIP, SIGMA),
             "DPGradient": _dp_gradient("auto")(copy.deepcopy(base), x0, x1, CLIP, SIGMA)}
    buckets: dict[str, dict[str, float]] = {}
    stats = {}
    for kind, step in kinds.items():
        for _ in range(20):
            step(1.0)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(steps):
            step(1.0)
        profile.disable()
        stats[kind] = pstats.Stats(profile).stats
        totals: dict[str, float] = defaultdict(float)
        for func in stats[kind]:
            for label, own in _bucket(func, stats[kind]):
                totals[label] += own / steps
        buckets[kind] = totals
    plain_total = sum(buckets["plain"].values())
    labels = sorted(set(buckets["plain"]) | set(buckets["DPGradient"]),
                    key=lambda b: -buckets["DPGradient"].get(b, 0.0))
    rows = []
    for label in labels:
        plain, dp = buckets["plain"].get(label, 0.0), buckets["DPGradient"].get(label, 0.0)
        rows.append([label, f"{1e6 * plain:,.0f}", f"{1e6 * dp:,.0f}",
                     f"{(dp - plain) / plain_total:+.2f}x"])
    dp_total = sum(buckets["DPGradient"].values())
    rows.append(["**total (profiled)**", f"{1e6 * plain_total:,.0f}", f"{1e6 * dp_total:,.0f}",
                 f"**{dp_total / plain_total:.2f}x** (ratio)"])
    bucket_table = markdown_table(["cost", "plain us/step", "DPGradient us/step",
                           "difference / plain step"], rows)
    dp_stats = stats["DPGradient"]
    dp_own = sum(s[2] for s in dp_stats.values())
    ranked = sorted(dp_stats.items(), key=lambda kv: -kv[1][2])[:top]
    func_rows = [[_short(func), f"{calls / steps:g}", f"{1e6 * own / steps:,.0f}",
                  f"{100 * own / dp_own:.0f}%"] for func, (_, calls, own, _, _) in ranked]
    return bucket_table, markdown_table(["function", "calls/step", "own us/step", "share"],
                                        func_rows)


# -- output ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="skip the 28x28 U-Net")
    parser.add_argument("--rounds", type=int, default=300,
                        help="rounds of the variant and phase tables (median reported)")
    parser.add_argument("--out", type=Path, help="markdown file to write the tables into")
    parser.add_argument("--top", type=int, default=12, help="functions listed in the profile")
    parser.add_argument("--smoke", action="store_true",
                        help="two cases, 5 rounds, no time budget: checks that the script runs "
                             "(seconds); the numbers are not measurements")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.rounds = True, 5
    if args.rounds < 5:
        parser.error("--rounds must be >= 5")
    # Opacus warns on every hooked backward that no input requires grad: expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Using a non-full backward hook")
    command = "benchmarks/dp.py" + (" --smoke" if args.smoke else (
        (" --quick" if args.quick else "") + (
            f" --rounds {args.rounds}" if args.rounds != 300 else "")))
    load_before = os.getloadavg()
    started = time.perf_counter()

    modes = _modesmarkdown_table(_cases(args.quick, args.smoke))
    variants, variants_note = _variants(((64, 1),) if args.smoke else ((64, 1), (64, 2), (256, 1)),
                                        args.rounds, 0.0 if args.smoke else 30.0)
    _say("phases of the DPGradient step ...")
    phases = _phases(args.rounds)
    _say("cProfile of the DPGradient step ...")
    buckets, functions = _profile(args.rounds, args.top)
    load_after = os.getloadavg()

    text = "\n".join([
        f"Written by `.venv/bin/python {command}` in {time.perf_counter() - started:.0f} s on "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}, opacus {opacus.__version__}, "
        f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}); "
        f"1-minute load average {load_before[0]:.1f} before and {load_after[0]:.1f} after "
        "(other work ran meanwhile, so absolute times are noisy; ratios pair steps run back "
        "to back).",
        "",
        "### DP step over plain step, by Opacus grad-sample mode",
        "",
        f"C = {CLIP}, sigma = {SIGMA}, Opacus' `DPOptimizer` (ghost: "
        "`DPOptimizerFastGradientClipping` with `DPTensorFastGradientClipping`), loss reduction "
        "\"mean\", expected batch B; the DP step ends with `pre_step()` (clip, noise, / B in "
        "p.grad). After two untimed warm-up rounds, each round runs a block of plain steps and "
        f"then a block of DP steps (back-to-back calls lasting about {1e3 * _BLOCK_S:.0f} ms, "
        "1 to 20 calls; the median is over all calls); rounds fill a time budget per case "
        "(5 to 300). Check: before timing, each mode's result without "
        "noise against the truth computed one example at a time with plain autograd, at C = "
        "the median per-example norm (about half the examples clip): max |difference| over "
        "the truth's norm.",
        "",
        modes,
        "",
        "### Variants of the DP step on the 2D MLPs",
        "",
        variants_note,
        "",
        variants,
        "",
        "### Where the `DPGradient` step's time goes (`VelocityMLP(2, 64)`, batch 256, 1 thread)",
        "",
        f"The step replayed call by call with a clock between the calls ({args.rounds} steps "
        "of each kind, alternating blocks of 10 plain and 10 DP steps; medians per phase):",
        "",
        phases,
        "",
        f"cProfile of {args.rounds} steps of each kind, own time per step grouped by cost "
        "(cProfile's per-call overhead inflates Python-heavy costs, so the totals exceed the "
        "timings above):",
        "",
        buckets,
        "",
        f"Top {args.top} functions of the `DPGradient` step by own time:",
        "",
        functions,
    ])
    print(text)
    if args.out:
        write_block(args.out, "dp", text, title="# Benchmarks")
        _say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
