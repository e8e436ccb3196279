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


def test_w2_against_nfe_draws_the_iid_floor_when_given(tmp_path):
    curves = {"got": {1: 0.9, 4: 0.5}}
    plot_w2_nfe(tmp_path / "a.png", curves, "W2")
    plot_w2_nfe(tmp_path / "b.png", curves, "W2", floor=(0.2, 3000))
    assert _png_size(tmp_path / "b.png") == (720, 480)
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "b.png").read_bytes()


@pytest.mark.parametrize("side, width", [(8, 73 * 7), (32, 265)])
def test_a_grid_of_small_images_is_enlarged_to_be_seen(tmp_path, side, width):
    """64 digits of 8 x 8 made a 73 px grid; whole-pixel enlargement brings it to 511 px, and
    a grid already wider than 256 px (CIFAR's 265) keeps its size."""
    from secureffm.runs.ffm import write_grid

    write_grid(tmp_path / "grid.png", torch.rand(64, 1, side, side) * 2 - 1)
    assert _png_size(tmp_path / "grid.png") == (width, width)
