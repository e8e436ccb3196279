"""Audits of a finished run: log verification (threat-model checks and attacks come later)."""

from __future__ import annotations

from .verify import AuditFinding, AuditReport, main, verify_run

__all__ = ["AuditFinding", "AuditReport", "verify_run", "main"]
