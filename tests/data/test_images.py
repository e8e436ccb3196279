"""The image loaders read tiny files written here in the real formats (CIFAR-10's binary
records, MNIST's idx, raw and gzip) and the synthetic set needs none."""

import gzip
import struct

import numpy as np
import pytest
import torch

from secureffm.data.colored_digits import COLORS, federated_colored_digits
from secureffm.data.images import (
    MissingDataError,
    gaussian_images,
    image_pair,
    load_cifar10,
    load_colored_mnist,
    load_images,
    load_mnist,
    make_shapes,
    mnist_intensity,
    read_idx,
)
from secureffm.errors import SecureFFMError


def _cifar_records(rng, count):
    labels = rng.integers(0, 10, count, dtype=np.uint8)
    pixels = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
    raw = np.concatenate([labels[:, None], pixels.reshape(count, -1)], axis=1).tobytes()
    return labels, pixels, raw


@pytest.fixture
def cifar_dir(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    written = {"train": [], "test": []}
    for i in range(1, 6):
        labels, pixels, raw = _cifar_records(rng, i)  # 1 + 2 + ... + 5 = 15 train records
        (folder / f"data_batch_{i}.bin").write_bytes(raw)
        written["train"].append((labels, pixels))
    labels, pixels, raw = _cifar_records(rng, 3)
    (folder / "test_batch.bin").write_bytes(raw)
    written["test"].append((labels, pixels))
    return tmp_path, written


def test_cifar10_reads_every_binary_record_in_order(cifar_dir):
    root, written = cifar_dir
    for split in ("train", "test"):
        data = load_cifar10(root, split)
        labels = np.concatenate([lab for lab, _ in written[split]])
        pixels = np.concatenate([pix for _, pix in written[split]])
        assert data.x.shape == (len(labels), 3, 32, 32) and data.x.dtype == torch.float32
        assert data.labels.tolist() == labels.tolist()
        # channel-major planes, rows in order, scaled byte p -> p / 127.5 - 1
        assert torch.equal(data.x, torch.from_numpy(pixels.astype(np.float32) / 127.5 - 1))
        assert data.x.min() >= -1 and data.x.max() <= 1
    assert load_cifar10(root / "cifar-10-batches-bin").labels.shape == (15,)  # the folder itself


def test_cifar10_missing_or_truncated_files_say_where_to_get_them(cifar_dir, tmp_path):
    with pytest.raises(MissingDataError, match="binary version.*data_batch_1.bin"):
        load_cifar10(None)
    with pytest.raises(MissingDataError, match="not a folder"):
        load_cifar10(tmp_path / "nowhere")
    root, _ = cifar_dir
    (root / "cifar-10-batches-bin" / "data_batch_3.bin").unlink()
    with pytest.raises(MissingDataError, match="data_batch_3.bin is missing.*3,072 pixel bytes"):
        load_cifar10(root)
    (root / "cifar-10-batches-bin" / "test_batch.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(MissingDataError, match="not a whole number"):
        load_cifar10(root, "test")
    assert issubclass(MissingDataError, SecureFFMError)


def _idx(array: np.ndarray) -> bytes:
    return bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.astype(np.uint8).tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_mnist_reads_idx_files_raw_or_gzip(tmp_path, compressed):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (4, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 5], dtype=np.uint8)
    for prefix in ("train", "t10k"):
        for stem, array in ((f"{prefix}-images-idx3-ubyte", images),
                            (f"{prefix}-labels-idx1-ubyte", labels)):
            raw = _idx(array)
            name = stem + (".gz" if compressed else "")
            (tmp_path / name).write_bytes(gzip.compress(raw) if compressed else raw)
    data = load_mnist(tmp_path, "test")
    assert data.x.shape == (4, 1, 28, 28) and data.labels.tolist() == [3, 1, 4, 5]
    assert torch.equal(data.x[:, 0], torch.from_numpy(images.astype(np.float32) / 127.5 - 1))
    gray, digits = mnist_intensity(tmp_path)
    assert gray.shape == (4, 28, 28) and 0 <= gray.min() and gray.max() <= 1
    colored = load_colored_mnist(tmp_path, "train", seed=0)
    assert colored.x.shape == (4, 3, 28, 28)
    assert sorted(colored.labels[:, 0].tolist()) == [1, 3, 4, 5]
    for image, (digit, color) in zip(colored.x, colored.labels.tolist(), strict=True):
        rgb = torch.tensor(COLORS[color][1])  # strokes in the color, background -1
        expected = 2 * gray[digits.tolist().index(digit)] * rgb[:, None, None] - 1
        assert torch.allclose(image, expected)
    flat = load_images("colored-mnist", tmp_path, "test")
    assert flat.labels.tolist() == (colored.labels[:, 0] * 10 + colored.labels[:, 1]).tolist()


def test_colored_mnist_gets_dcfms_federated_split(tmp_path):
    rng = np.random.default_rng(2)
    digits = np.repeat(np.arange(10, dtype=np.uint8), 6)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(
        _idx(rng.integers(0, 256, (60, 28, 28), dtype=np.uint8)))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(digits))
    split = federated_colored_digits(clients=2, images=mnist_intensity(tmp_path))
    assert len(split.held) == 50 and all(c.x.shape[1:] == (3, 28, 28) for c in split.clients)
    held = {tuple(p) for p in split.held.tolist()}
    seen = {tuple(p) for c in split.clients for p in c.labels.tolist()}
    assert seen <= held  # no client holds a novel combination


def test_mnist_errors_name_the_file_and_layout(tmp_path):
    with pytest.raises(MissingDataError, match="train-images-idx3-ubyte.*idx files"):
        load_mnist(tmp_path)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + b"\x00" * 8)
    with pytest.raises(MissingDataError, match="not an unsigned-byte idx"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + b"\x01")
    with pytest.raises(MissingDataError, match="declares shape"):
        read_idx(tmp_path / "short")


def test_shapes_are_seeded_scaled_and_labelled():
    a, b = make_shapes(64, 16, seed=3), make_shapes(64, 16, seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels)
    assert a.x.shape == (64, 3, 16, 16) and a.x.min() >= -1 and a.x.max() <= 1
    assert not torch.equal(a.x, make_shapes(64, 16, seed=4).x)
    assert set(a.labels.tolist()) <= set(range(10)) and len(set(a.labels.tolist())) > 5
    # the shape's pixels are saturated (some channel at +-1), the background is dim (|x| <= .25)
    bright = (a.x.abs() > 0.9).any(1).float().mean((1, 2))
    assert ((bright > 0.04) & (bright < 0.4)).all()


def test_image_pair_source_is_a_standard_normal_of_the_image_shape():
    pair = image_pair("shapes", image_size=8)
    assert pair.shape == (3, 8, 8) and pair.dim == 192 and pair.classes == 10
    x0, _ = pair.source.sample(4000, torch.Generator().manual_seed(0))
    assert x0.shape == (4000, 3, 8, 8)
    assert abs(float(x0.mean())) < 0.01 and abs(float(x0.std()) - 1) < 0.01
    odd = gaussian_images((1, 3, 3))  # an odd dimension: the last normal of a pair is dropped
    assert odd.uniforms == 10 and odd.sample(2, torch.Generator())[0].shape == (2, 1, 3, 3)
    assert not torch.equal(pair.train.x[:100], pair.test.x[:100])  # train and test differ
