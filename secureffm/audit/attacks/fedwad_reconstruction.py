"""FedWAD reconstruction (``--attack fedwad-reconstruction``): the clients' points from the
interpolating measures the server received (docs/fedwad.md, "What the server learns").

Adversary: the honest-but-curious server of a FedWAD run. In iteration k it sent client c the
measure xi and got back the client's measure mu at the client's secret t on the geodesic from
its data (t = 0) to xi (t = 1): every atom of mu is (1 - t) a + t b with a a data point (or a
local mean of them) and b a point of xi. The server matches mu's atoms to xi with one exact OT
plan (W_2), takes each atom's barycentric image b, and solves for a = (m - t b) / (1 - t), with

- t recovered as 1 - W_2(mu, xi) / W_2(data, xi) when the client also sent the distance that
  iteration (``plaintext``, exact interpolation: W_2 scales by 1 - t along the geodesic);
- t guessed as ``t_guess`` otherwise (``fedwad-private``: distances only at the end), by
  default the middle of the protocol's public t range.

The score is W_2 between each reconstruction and the client's true points (rebuilt from the
run's config, the experimenter's knowledge), against W_2 of the measure mu itself and of the
server's own xi: a reconstruction closer than mu learned more than the message shows at face
value. Scores are averaged over clients and over the iterations with a measure upload.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from ...errors import SecureFFMError
from ...methods.fedwad import Measure, ground_cost, wasserstein
from ...ot import emd_plan
from ...protocols.protocol import load_protocol
from ...runs.fedwad import FedWADRun, client_data
from .view import ServerView

__all__ = ["invert_interpolation", "fedwad_reconstruction"]


def invert_interpolation(moved: Measure, xi: Measure, t: float) -> Measure:
    """The points whose W_2 interpolation toward ``xi`` at ``t`` gives ``moved``: each atom m
    of ``moved`` (weight w) paired with its barycentric image b = (P xi)_m / w under the exact
    OT plan P between ``moved`` and ``xi``, then a = (m - t b) / (1 - t)."""
    if not 0.0 <= t < 1.0:
        raise SecureFFMError(f"t = {t}: the interpolation inverts only for t in [0, 1)")
    plan = emd_plan(ground_cost(moved.support, xi.support, 2), moved.weights, xi.weights)
    image = plan @ xi.support / moved.weights[:, None]
    return Measure((moved.support - t * image) / (1 - t), moved.weights)


def _measure(view: ServerView, record: dict) -> Measure:
    payload = view.payload(record)
    return Measure(payload["support"], payload["weights"])


def fedwad_reconstruction(run_dir: str | Path, t_guess: float | None = None
                          ) -> dict[str, float]:
    """Reconstruct every client's points from every measure it sent (module docstring);
    returns the mean ``w2_reconstruction``, ``w2_measure`` and ``w2_server`` (W_2 to the true
    points), ``t_recovered`` (the fraction of measures whose t the server recovered from a
    distance) and ``measures`` (how many were attacked)."""
    folder = Path(run_dir)
    if not (folder / "config.toml").is_file():
        raise SecureFFMError(f"{folder} has no config.toml: give a secureffm fedwad run folder")
    run = FedWADRun.from_dict(tomllib.loads((folder / "config.toml").read_text()))
    if run.fedwad.p != 2:
        raise SecureFFMError(f"p = {run.fedwad.p}: the reconstruction inverts W_2 geodesics; "
                             "rerun with --p 2")
    view = ServerView.read(folder)
    privacy = load_protocol(run.protocol).geodesic_privacy("measure")
    low, high = ((privacy.t_low, privacy.t_high) if privacy is not None else
                 run.fedwad.t_range)
    guess = (low + high) / 2 if t_guess is None else t_guess
    data = client_data(run)
    rows: list[tuple[float, float, float, bool]] = []
    for index, points in enumerate(data, start=1):
        client = f"client-{index}"
        truth = Measure.uniform(points)
        for back in view.messages(kind="measure", sender=client, phase="upload"):
            sent = view.messages(kind="measure", recipient=client, round=back["round"],
                                 phase="broadcast")
            if not sent:
                continue
            xi, moved = _measure(view, sent[-1]), _measure(view, back)
            t, recovered = guess, False
            told = view.messages(kind="scalar", sender=client, round=back["round"],
                                 phase="upload")
            if told and view.payload(told[0])["distance"][0] > 0:
                t = 1 - wasserstein(moved, xi, 2) / float(view.payload(told[0])["distance"][0])
                recovered = True
            found = invert_interpolation(moved, xi, min(max(t, 0.0), 1 - 1e-9))
            rows.append((wasserstein(found, truth, 2), wasserstein(moved, truth, 2),
                         wasserstein(xi, truth, 2), recovered))
    if not rows:
        raise SecureFFMError(f"{folder}: no client sent a measure in reply to one the server "
                             "sent; is it a secureffm fedwad run?")
    table = np.array(rows, dtype=np.float64)
    return {"w2_reconstruction": float(table[:, 0].mean()),
            "w2_measure": float(table[:, 1].mean()), "w2_server": float(table[:, 2].mean()),
            "t_recovered": float(table[:, 3].mean()), "measures": float(len(rows))}
