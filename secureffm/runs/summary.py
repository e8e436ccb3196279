"""The end of a run in a few lines: the epsilon each client spent against its target, the
model's quality beside the number that says whether it is good (W2 and its i.i.d. floor, FID
and its floor, or each client's W2 on its own held-out rows against that floor), the run
folder and the log head. ``secureffm run`` prints it; metrics.json keeps it under "summary".
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["run_summary", "summary_lines", "add_summary"]


def run_summary(out: Path, metrics: dict, pin: dict | None) -> dict:
    """The summary of the finished run in ``out`` from its metrics, privacy.json and pin."""
    return {"run_folder": str(out), "log_head": pin["head"] if pin else None,
            "privacy": _privacy(out / "privacy.json"), "quality": _quality(metrics["eval"])}


def add_summary(out: Path, metrics: dict, pin: dict | None) -> dict:
    """Add the run's summary to ``metrics`` and to ``out``/metrics.json; returns it."""
    metrics["summary"] = run_summary(out, metrics, pin)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics["summary"]


def _privacy(path: Path) -> dict | None:
    """Epsilon spent per client (the enforcing accountant's, PRV beside it) against the target;
    None without DP."""
    if not path.is_file():
        return None
    facts = json.loads(path.read_text())
    if "delta" not in facts or "clients" not in facts:
        return None
    enforced = facts.get("enforced_by", "rdp")
    clients = {cid: {"epsilon": entry[enforced]["total"], "prv": entry.get("prv", {}).get("total"),
                     "target_held": entry.get("target_held")}
               for cid, entry in facts.get("clients", {}).items()}
    return {"target_epsilon": facts.get("target_epsilon"), "delta": facts["delta"],
            "accountant": enforced, "clients": clients}


def _quality(evaluation: dict) -> dict:
    """W2 at the largest evaluated NFE with its floor, FID with its floor, or per client."""
    if "clients" in evaluation and isinstance(evaluation["clients"], dict):
        return {"clients": {cid: {"w2": r.get("w2"), "w2_floor": r.get("w2_floor")}
                            for cid, r in evaluation["clients"].items()}}
    if "fid" in evaluation:
        nfe = max(evaluation["fid"], key=int)
        return {"fid": evaluation["fid"][nfe], "nfe": int(nfe),
                "fid_floor": evaluation.get("fid_floor")}
    if "w2" in evaluation:
        nfe = max(evaluation["w2"], key=int)
        return {"w2": evaluation["w2"][nfe], "nfe": int(nfe),
                "iid_floor": evaluation.get("iid_floor")}
    return {}


def summary_lines(summary: dict) -> list[str]:
    """The summary's privacy and quality as lines (``secureffm run`` prints the run folder and
    the log head after them, with how to check the log)."""
    lines = []
    privacy = summary["privacy"]
    if privacy is None:
        lines.append("privacy: no DP in this protocol (no epsilon)")
    else:
        spent = ", ".join(f"{cid} {c['epsilon']:.3f}" + ("" if c["target_held"] is not False
                                                           else " (OVER the target)")
                          for cid, c in privacy["clients"].items())
        target = privacy["target_epsilon"]
        against = f"target {target:g}" if target else "no target (fixed noise multiplier)"
        lines.append(f"epsilon spent per client (delta {privacy['delta']:g}, "
                     f"{privacy['accountant']} accountant; {against}): {spent}")
    quality = summary["quality"]
    if "w2" in quality:
        lines.append(f"W2 at NFE {quality['nfe']}: {quality['w2']:.3f} (i.i.d. floor "
                     f"{quality['iid_floor']:.3f}: what a perfect generator scores on as many "
                     "samples)")
    elif "fid" in quality:
        lines.append(f"FID at NFE {quality['nfe']}: {quality['fid']:.3g} (floor "
                     f"{quality['fid_floor']:.3g}: held-out training images against the "
                     "reference)")
    for cid, client in quality.get("clients", {}).items():
        if client["w2"] is not None:
            lines.append(f"{cid}: W2 on its own held-out rows {client['w2']:.3f} (i.i.d. floor "
                         f"{client['w2_floor']:.3f})")
    return lines
