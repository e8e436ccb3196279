"""Differential privacy: DP-SGD gradients through Opacus, accounting, the privacy ledger."""

from .accounting import ACCOUNTANTS, calibrate_noise, epsilon
from .dpsgd import DPGradient, PlainGradient, poisson_batch
from .ledger import LedgerEntry, PrivacyLedger

__all__ = ["DPGradient", "PlainGradient", "poisson_batch", "epsilon", "calibrate_noise",
           "ACCOUNTANTS", "LedgerEntry", "PrivacyLedger"]
