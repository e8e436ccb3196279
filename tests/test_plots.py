"""Pictures of a run (secureffm/plots.py): each call writes a readable PNG of the asked size.

Truths used: the PNG signature and header (width and height at 120 dpi), read by hand.
"""

from __future__ import annotations

import struct

import pytest
import torch

from secureffm.plots import plot_trajectories, plot_w2_nfe


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("clients", [1, 3])
def test_trajectories_are_drawn_to_a_10_by_5_inch_png(tmp_path, clients):
    shards = [torch.randn(30, 2) + i for i in range(clients)]
    paths = torch.randn(11, 20, 2).cumsum(0)
    out = tmp_path / "trajectories.png"
    plot_trajectories(out, shards, paths, "title")
    assert _png_size(out) == (1200, 600)
    over = tmp_path / "over-target.png"
    plot_trajectories(over, shards, paths, "title", target=torch.randn(50, 2))
    assert _png_size(over) == (1200, 600) and over.read_bytes() != out.read_bytes()


def test_w2_against_nfe_is_drawn_with_or_without_error_bars(tmp_path):
    curves = {"vanilla": {1: 2.0, 4: 1.0}, "got": {4: 0.5, 1: 0.9}}
    plot_w2_nfe(tmp_path / "a.png", curves, "W2")
    plot_w2_nfe(tmp_path / "b.png", curves, "W2",
                errors={"vanilla": {1: 0.1, 4: 0.1}, "got": {1: 0.2, 4: 0.05}})
    assert _png_size(tmp_path / "a.png") == _png_size(tmp_path / "b.png") == (720, 480)
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "b.png").read_bytes()
