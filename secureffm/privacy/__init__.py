"""Differential privacy: DP-SGD gradients through Opacus, accounting, the privacy ledger.

The names below load their module, and with it Opacus, on first access (PEP 562):
:mod:`.accounting` says why.
"""

from importlib import import_module

_HOME = {"DPGradient": "dpsgd", "PlainGradient": "dpsgd", "poisson_batch": "dpsgd",
         "epsilon": "accounting", "calibrate_noise": "accounting", "ACCOUNTANTS": "accounting",
         "LedgerEntry": "ledger", "PrivacyLedger": "ledger"}  # name -> its module
__all__ = list(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_HOME[name]}", __name__), name)
