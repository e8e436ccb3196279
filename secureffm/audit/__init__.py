"""Audits of a finished run: log verification against the protocol rules and, when kept apart,
a pin (threat-model checks and attacks come later)."""

from __future__ import annotations

from ..federation.pin import RunPin, load_pin
from .verify import AuditFinding, AuditReport, pin_run, verify_run

__all__ = ["AuditFinding", "AuditReport", "RunPin", "load_pin", "pin_run", "verify_run"]
