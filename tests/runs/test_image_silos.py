"""A run on the clients' own image folders (secureffm/runs/silo.py, secureffm/data/silo.py):
each client reads its own folder of PNG files, trains FFM's U-Net, and evaluates the released
model on its own held-out images; ``secureffm sample`` writes PNG files out of the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import secureffm
from secureffm.audit import verify_run
from secureffm.audit.attacks.ffm_run import load_image_run
from secureffm.cli import main
from secureffm.config import RunConfig, load_config
from secureffm.data.silo import load_image_silo
from secureffm.errors import ConfigError, SecureFFMError
from secureffm.federation.log import MessageLog
from secureffm.runs import run
from secureffm.runs.ffm import build_run

SIDE = 8


def _folder(path: Path, count: int, colours: list[tuple[int, int, int]], seed: int) -> Path:
    """``count`` 8 x 8 RGB PNGs named ``<label>_<i>.png``: a square of one of ``colours``
    (label: its index) on noise."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    for i in range(count):
        label = i % len(colours)
        pixels = rng.integers(0, 40, (SIDE, SIDE, 3), dtype=np.uint8)
        pixels[2:6, 2:6] = colours[label]
        Image.fromarray(pixels).save(path / f"{label}_{i:03d}.png")
    return path


@pytest.fixture
def clinics(tmp_path) -> list[Path]:
    """Three clients' folders, non-IID colours: 20 images each."""
    return [_folder(tmp_path / "clinic-1", 20, [(250, 0, 0), (0, 250, 0)], 1),
            _folder(tmp_path / "clinic-2", 20, [(0, 250, 0), (0, 0, 250)], 2),
            _folder(tmp_path / "clinic-3", 20, [(250, 250, 0)], 3)]


def _config(tmp_path, folders, **changes) -> RunConfig:
    values = dict(data="image-folder", client_data=tuple(map(str, folders)),
                  clients=len(folders), image_size=SIDE, image_channels=3, unet_width=8,
                  unet_mult=(1, 2), shard_size=16, batch_size=8, rounds=3, eval_samples=16,
                  nfe=(2,), holdout=0.25, progress=False, device="cpu",
                  insecure_deterministic=True, out=str(tmp_path / "run"))
    values.update(changes)
    return RunConfig(**values)


def test_three_clients_train_on_their_folders_and_each_reports_on_its_own_held_out_images(
        tmp_path, clinics):
    """Each client reports a Frechet distance and its floor on its own held-out images (5 of
    20); only the numbers reach the server's log, which verifies, and privacy.json names the
    release."""
    result = run(_config(tmp_path, clinics, method="vanilla", image_labels="names"))
    evaluation = result.metrics["eval"]
    assert evaluation["image_shape"] == [3, SIDE, SIDE]
    assert set(evaluation["clients"]) == {"client-1", "client-2", "client-3"}
    for client, report in evaluation["clients"].items():
        assert report["heldout_images"] == 5 and report["synthetic_images"] == 16
        assert np.isfinite(report["fid"]) and report["fid"] >= 0 and report["fid_floor"] >= 0
        one_class = client == "client-3"  # no classifier from a single label: raw pixels
        assert report["features"]["kind"] == ("pixels" if one_class else "classifier")
    records = [json.loads(x) for x in (result.out / "messages.jsonl").read_text().splitlines()]
    senders = sorted(r["sender"] for r in records if r["kind"] == "evaluation")
    assert senders == ["client-1", "client-2", "client-3"]
    assert verify_run(result.out).ok
    privacy = json.loads((result.out / "privacy.json").read_text())
    assert any(e.startswith("evaluation:") and "held-out images" in e
               for e in privacy["exclusions"])
    assert (result.out / "samples.png").is_file()


def test_each_client_holds_only_its_own_folder_and_the_server_none(tmp_path, clinics):
    """Adversary: an honest-but-curious server (or a client) that would see another client's
    images: client i's shard is exactly the training images of folder i, no two shards share
    an image, and the server's side of the run holds no image (no shards, an empty pair)."""
    config = _config(tmp_path, clinics)
    out = Path(config.out)
    out.mkdir(parents=True)
    pair, shards, trainer = build_run(config, torch.device("cpu"),
                                      MessageLog(out / "messages.jsonl"), None, out)
    assert shards is None and len(pair.train) == 0 and len(pair.test) == 0
    for client, folder in zip(trainer.channel.clients, clinics, strict=True):
        own = {tuple(np.asarray(Image.open(p)).ravel()) for p in folder.iterdir()}
        held = {tuple(((x.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).ravel().tolist())
                for x in client.data}
        assert len(held) == 15 and held <= own  # 20 images, 5 held out
    datas = [c.data for c in trainer.channel.clients]
    assert not any(torch.equal(a[0], b[0]) for i, a in enumerate(datas) for b in datas[i + 1:])
    trainer.channel.close()


def test_a_folder_with_an_image_of_another_shape_is_refused_by_name_before_round_one(
        tmp_path, clinics):
    odd = clinics[1] / "0_999.png"
    Image.fromarray(np.zeros((SIDE, SIDE + 4, 3), dtype=np.uint8)).save(odd)
    with pytest.raises(SecureFFMError, match=r"'0_999\.png'"):
        run(_config(tmp_path, clinics))
    # refused before round one began, so the start was undone: no folder, no log
    assert not (tmp_path / "run").exists()


def test_a_folder_off_the_public_shape_is_refused_by_name(tmp_path, clinics):
    """The public shape comes from the config: a client whose images (all of one size) differ
    from it refuses its own folder, naming it and a file, instead of the server learning the
    shape from a client."""
    gray = tmp_path / "gray"
    gray.mkdir()
    for i in range(20):
        Image.fromarray(np.full((SIDE, SIDE), 10 * i, dtype=np.uint8)).save(gray / f"{i}.png")
    with pytest.raises(SecureFFMError, match=r"'0\.png' of .*gray.*\(1, 8, 8\).*\(3, 8, 8\)"):
        run(_config(tmp_path, [clinics[0], gray, clinics[2]]))


def test_folders_imply_image_folder_and_flower_is_refused_by_name(tmp_path, clinics):
    config = load_config(None, {"client_data": [str(p) for p in clinics], "clients": 3})
    assert config.data == "image-folder"
    with pytest.raises(ConfigError, match="'image-folder'.*in-process"):
        _config(tmp_path, clinics, engine="flower")
    with pytest.raises(ConfigError, match="one image folder per client"):
        _config(tmp_path, clinics, clients=2)


def test_sample_writes_png_files_and_load_gives_image_arrays(tmp_path, clinics, capsys):
    result = run(_config(tmp_path, clinics, rounds=2))
    out = tmp_path / "synthetic"
    assert main(["sample", str(result.out), "--n", "7", "--out", str(out)]) == 0
    files = sorted(out.iterdir())
    assert len(files) == 7 and all(p.suffix == ".png" for p in files)
    assert np.asarray(Image.open(files[0])).shape == (SIDE, SIDE, 3)
    notice = json.loads((tmp_path / "synthetic.privacy.json").read_text())
    assert notice["images"] == 7 and notice["holds"].startswith("none")
    images = secureffm.load(result.out).sample_array(4, seed=1)
    assert images.shape == (4, 3, SIDE, SIDE) and images.min() >= -1 and images.max() <= 1
    exported = tmp_path / "export"
    assert main(["export", str(result.out), "--out", str(exported)]) == 0
    again = secureffm.load(exported).sample_array(4, seed=1)  # the U-Net, without a pickle
    assert np.array_equal(again, images)
    with pytest.raises(SecureFFMError, match="clients' own image folders"):
        load_image_run(result.out)  # the image attacks rebuild named sets only


def test_labels_come_from_the_file_names_or_the_folders_own_csv(clinics):
    folder = clinics[0]
    named = load_image_silo(folder, (3, SIDE, SIDE), "names", 0.25, 0)
    files = sorted(p.name for p in folder.iterdir())
    (folder / "labels.csv").write_text("file,label\n" + "".join(
        f"{name},{'red' if name.startswith('0_') else 'green'}\n" for name in files))
    from_csv = load_image_silo(folder, (3, SIDE, SIDE), "csv", 0.25, 0)
    assert named.classes == ("0", "1") and from_csv.classes == ("green", "red")
    assert torch.equal(named.train_labels, 1 - from_csv.train_labels)  # same split, renamed
    assert load_image_silo(folder, (3, SIDE, SIDE), "none", 0.25, 0).train_labels is None
