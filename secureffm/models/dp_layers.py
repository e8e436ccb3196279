"""Which layers of a network DP-SGD (Opacus) cannot clip per example."""

from __future__ import annotations

from torch import nn

__all__ = ["dp_unsupported_layers"]

# Layers whose output for one example depends on other examples of the batch, or that Opacus
# trains only through its own replacements (DPMultiheadAttention, DPLSTM, ...).
_REFUSED: dict[type, str] = {
    nn.modules.batchnorm._BatchNorm: "normalizes each example with its batch's statistics; use "
                                     "GroupNorm (what secureffm's U-Net uses)",
    nn.MultiheadAttention: "is clipped by Opacus only through DPMultiheadAttention; write the "
                           "projections as nn.Linear (secureffm's U-Net attention does)",
    nn.RNNBase: "is clipped by Opacus only through its DPLSTM / DPGRU / DPRNN replacements",
}


def dp_unsupported_layers(model: nn.Module) -> list[str]:
    """One line per layer of ``model`` that per-example clipping cannot handle, naming the
    layer by its path and type (empty when every layer is supported); Opacus' validator's
    other findings follow."""
    found = [f"layer {name!r} ({type(module).__name__}) {why}"
             for name, module in model.named_modules()
             for kind, why in _REFUSED.items() if isinstance(module, kind)]
    if not found:
        from opacus.validators import ModuleValidator  # first use: accounting.py says why

        found = [str(e).split(".")[0] for e in ModuleValidator.validate(model, strict=False)]
    return found
