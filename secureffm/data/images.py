"""Image data sets for FFM on images: local-path loaders that never download or unpickle, and a
synthetic set that needs no file.

Every loader returns an :class:`ImageSet`: images ``x`` [N, C, H, W] float32 scaled to [-1, 1]
(pixel byte p -> p / 127.5 - 1) and class labels [N] int64.

- ``cifar10`` (3 x 32 x 32, 10 classes): the *binary* version, ``cifar-10-batches-bin/`` with
  ``data_batch_1.bin`` .. ``data_batch_5.bin`` (train) and ``test_batch.bin`` (test); each record
  is 1 label byte then 3,072 pixel bytes (1,024 red, 1,024 green, 1,024 blue, rows in order).
  Parsed with numpy from the raw bytes; the pickled "python version" is never read.
- ``mnist`` (1 x 28 x 28, 10 classes): the idx files ``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, raw or
  ``.gz``, in the folder given or its ``MNIST/raw/`` (torchvision's layout).
- ``colored-mnist`` (3 x 28 x 28, 100 classes digit * 10 + color): MNIST digits in the ten colors
  of :mod:`.colored_digits` (DCFM paper, Sec. 6.1), one seeded, balanced color per image.
- ``digits`` (1 x 8 x 8, 10 classes, no file): scikit-learn's bundled digits (pixels 0..16
  scaled to [-1, 1]), split 75/25 into train and test, stratified and seeded; small enough for
  the attack tests of :mod:`secureffm.audit.attacks`.
- ``shapes`` (3 x S x S, 10 classes, no file): a seeded synthetic set with CIFAR's shape: a
  smooth random color background and one filled disk or square of a random color, position
  and size; the class is the shape (disk 0-4, square 5-9) and the color's hue bin (5 bins).
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SecureFFMError
from ..names import IMAGE_DATA
from .toy2d import Distribution, normals

__all__ = ["ImageSet", "ImagePair", "MissingDataError", "IMAGE_DATA", "check_image_files",
           "load_cifar10",
           "load_mnist", "load_colored_mnist", "make_shapes", "load_digit_images", "load_images",
           "gaussian_images", "image_pair", "image_shape", "read_idx", "mnist_intensity",
           "mnist_arrays"]

DIGITS_TEST_FRACTION = 0.25
SHAPES_TRAIN, SHAPES_TEST = 20_000, 2_000  # images of the synthetic set per split

CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
MNIST_PREFIX = {"train": "train", "test": "t10k"}

CIFAR_HELP = ("download the CIFAR-10 *binary version* (cifar-10-binary.tar.gz) from "
              "https://www.cs.toronto.edu/~kriz/cifar.html and extract it, so that PATH holds "
              "cifar-10-batches-bin/data_batch_1.bin .. data_batch_5.bin and test_batch.bin "
              "(records of 1 label byte + 3,072 pixel bytes); pass --data-dir PATH")
MNIST_HELP = ("download the four MNIST idx files (train-images-idx3-ubyte, "
              "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; raw or "
              ".gz) from https://yann.lecun.com/exdb/mnist/ or a mirror into PATH (or "
              "PATH/MNIST/raw/); pass --data-dir PATH")


class MissingDataError(SecureFFMError):
    """A local data set is not where the run was told to look, or its files are malformed."""


@dataclass(frozen=True)
class ImageSet:
    """Images ``x`` [N, C, H, W] float32 in [-1, 1] and class labels [N] int64."""

    x: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        return tuple(self.x.shape[1:])


@dataclass(frozen=True)
class ImagePair:
    """FFM on images: the source q0 is N(0, I) on the images' shape (public noise every party
    samples), the target the clients' images. ``train`` is split over the clients, ``test`` is
    the evaluation's reference; ``classes`` labels the partition (disjoint, Dirichlet)."""

    name: str
    source: Distribution
    train: ImageSet
    test: ImageSet
    classes: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.train.shape

    @property
    def dim(self) -> int:
        return math.prod(self.shape)


def _scaled(pixels: np.ndarray) -> torch.Tensor:
    """uint8 pixels -> float32 in [-1, 1]."""
    return torch.from_numpy(pixels.astype(np.float32) / 127.5 - 1.0)


def _need_dir(data_dir: str | Path | None, name: str, help_text: str) -> Path:
    if not data_dir:
        raise MissingDataError(f"data = {name!r} is read from local files and never "
                               f"downloaded, and no --data-dir was given: {help_text}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise MissingDataError(f"--data-dir {str(path)!r} is not a folder: {help_text}")
    return path


def check_image_files(name: str, data_dir: str | Path | None) -> None:
    """Raise :class:`MissingDataError` unless ``data_dir`` holds the files of image data set
    ``name`` (cifar10, mnist, colored-mnist), both splits; reads none of them."""
    if name == "cifar10":
        root = _need_dir(data_dir, name, CIFAR_HELP)
        folder = root / "cifar-10-batches-bin" if (root / "cifar-10-batches-bin").is_dir() else root
        for path in (folder / file for files in CIFAR_FILES.values() for file in files):
            if not path.is_file():
                raise MissingDataError(f"{path} is missing: {CIFAR_HELP}")
        return
    root = _need_dir(data_dir, name, MNIST_HELP)
    for prefix in MNIST_PREFIX.values():
        for kind in ("images-idx3", "labels-idx1"):
            _idx_file([root, root / "MNIST" / "raw"], f"{prefix}-{kind}-ubyte")


def load_cifar10(data_dir: str | Path | None, split: str = "train") -> ImageSet:
    """CIFAR-10's binary version from ``data_dir`` (the folder holding
    ``cifar-10-batches-bin/``, or that folder itself): images [N, 3, 32, 32] in [-1, 1], labels
    [N]. Raises :class:`MissingDataError` naming the missing file and the expected layout."""
    root = _need_dir(data_dir, "cifar10", CIFAR_HELP)
    folder = root / "cifar-10-batches-bin" if (root / "cifar-10-batches-bin").is_dir() else root
    if split not in CIFAR_FILES:
        raise MissingDataError(f"split = {split!r} is unknown; use 'train' or 'test'")
    records = []
    for name in CIFAR_FILES[split]:
        path = folder / name
        if not path.is_file():
            raise MissingDataError(f"{path} is missing: {CIFAR_HELP}")
        raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        if raw.size == 0 or raw.size % CIFAR_RECORD:
            raise MissingDataError(f"{path} holds {raw.size} bytes, not a whole number of "
                                   f"{CIFAR_RECORD}-byte records: is it the binary version? "
                                   f"{CIFAR_HELP}")
        records.append(raw.reshape(-1, CIFAR_RECORD))
    table = np.concatenate(records)
    labels = table[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise MissingDataError(f"{folder} has label bytes above 9: not CIFAR-10's binary "
                               f"version. {CIFAR_HELP}")
    return ImageSet(_scaled(table[:, 1:].reshape(-1, 3, 32, 32)), torch.from_numpy(labels))


def read_idx(path: str | Path) -> np.ndarray:
    """An idx file (raw, or gzip when the name ends in .gz) as a numpy array: the magic's third
    byte gives the type (0x08 unsigned byte, the only one MNIST uses), the fourth the number of
    dimensions, then one big-endian uint32 per dimension and the data."""
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] or data[1] or data[2] != 0x08:
        raise MissingDataError(f"{path} is not an unsigned-byte idx file (magic "
                               f"{data[:4].hex()}); {MNIST_HELP}")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise MissingDataError(f"{path} declares shape {tuple(dims)} but holds {body.size} "
                               f"bytes of data; {MNIST_HELP}")
    return body.reshape(tuple(dims))


def _idx_file(folders: list[Path], stem: str) -> Path:
    for folder in folders:
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    raise MissingDataError(f"{stem}[.gz] is in none of {', '.join(map(str, folders))}: "
                           f"{MNIST_HELP}")


def mnist_arrays(data_dir: str | Path | None, split: str = "train"
                 ) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's raw pixels [N, 28, 28] uint8 and digits [N] int64 of ``split``."""
    root = _need_dir(data_dir, "mnist", MNIST_HELP)
    if split not in MNIST_PREFIX:
        raise MissingDataError(f"split = {split!r} is unknown; use 'train' or 'test'")
    folders = [root, root / "MNIST" / "raw"]
    prefix = MNIST_PREFIX[split]
    images = read_idx(_idx_file(folders, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_idx_file(folders, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise MissingDataError(f"MNIST {split} files do not match: images {images.shape}, "
                               f"labels {labels.shape}; {MNIST_HELP}")
    return images, labels


def load_mnist(data_dir: str | Path | None, split: str = "train") -> ImageSet:
    """MNIST from idx files: images [N, 1, 28, 28] in [-1, 1], digits [N]."""
    images, labels = mnist_arrays(data_dir, split)
    return ImageSet(_scaled(images[:, None]), torch.from_numpy(labels))


def load_colored_mnist(data_dir: str | Path | None, split: str = "train", seed: int = 0,
                       colors_per_image: int = 1):
    """Colored MNIST as the DCFM paper's Sec. 6.1 uses it: each digit image in
    ``colors_per_image`` of the ten colors of :data:`~.colored_digits.COLORS` (strokes in the
    color, background black), balanced over colors, seeded. Returns a
    :class:`~.colored_digits.ColoredDigits`: x [N, 3, 28, 28] in [-1, 1], labels [N, 2]
    (digit, color). For DCFM's federated split with held combinations use
    ``federated_colored_digits(..., images=mnist_intensity(data_dir))``."""
    from .colored_digits import load_colored_digits

    return load_colored_digits(split, colors_per_image, seed,
                               images=mnist_intensity(data_dir, split))


def mnist_intensity(data_dir: str | Path | None, split: str = "train"
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST as stroke intensities [N, 28, 28] in [0, 1] and digits [N] (what
    :func:`~.colored_digits.colorize` colors)."""
    images, labels = mnist_arrays(data_dir, split)
    return torch.from_numpy(images.astype(np.float32) / 255.0), torch.from_numpy(labels)


def _hue_rgb(hue: torch.Tensor) -> torch.Tensor:
    """Fully saturated colors of hues [N] in [0, 1): RGB [N, 3] in [0, 1]."""
    k = (hue[:, None] * 6.0 + torch.tensor([5.0, 3.0, 1.0])) % 6.0
    return 1.0 - torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


def make_shapes(count: int, size: int = 32, seed: int = 0) -> ImageSet:
    """``count`` synthetic images [count, 3, size, size] in [-1, 1] from ``seed``: a smooth
    background (a 4 x 4 grid of random dim colors, bilinearly upsampled) and one filled disk
    (classes 0-4) or square (5-9) of a saturated color whose hue bin (5 bins) completes the
    class; centre uniform in the middle 60%, radius 15-30% of ``size``."""
    g = torch.Generator().manual_seed(seed)
    grid = 0.5 * torch.rand(count, 3, 4, 4, generator=g) - 0.25
    background = torch.nn.functional.interpolate(grid, size=(size, size), mode="bilinear",
                                                 align_corners=True)
    square = torch.rand(count, generator=g) < 0.5
    hue = torch.rand(count, generator=g)
    centre = (0.2 + 0.6 * torch.rand(count, 2, generator=g)) * size
    radius = (0.15 + 0.15 * torch.rand(count, generator=g)) * size
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    dy = (coords[None, :, None] - centre[:, 0, None, None]).abs()
    dx = (coords[None, None, :] - centre[:, 1, None, None]).abs()
    r = radius[:, None, None]
    inside = torch.where(square[:, None, None], torch.maximum(dx, dy) <= r,
                         dx.pow(2) + dy.pow(2) <= r.pow(2))
    color = 2.0 * _hue_rgb(hue) - 1.0
    x = torch.where(inside[:, None], color[:, :, None, None], background)
    labels = square.long() * 5 + (hue * 5).long().clamp(max=4)
    return ImageSet(x.float().contiguous(), labels)


def load_digit_images(split: str = "train", seed: int = 0, count: int | None = None) -> ImageSet:
    """scikit-learn's digits as images [N, 1, 8, 8] in [-1, 1] (pixel v in 0..16 -> v / 8 - 1)
    and digits [N]: the ``split`` of a stratified cut seeded by ``seed`` (shuffled), its first
    ``count`` images when given (the whole split has 1,347 train and 450 test images)."""
    from sklearn.model_selection import train_test_split

    from .digits import load_digit_arrays

    if split not in ("train", "test"):
        raise MissingDataError(f"split = {split!r} is unknown; use 'train' or 'test'")
    x, y = load_digit_arrays()
    parts = train_test_split(x, y, test_size=DIGITS_TEST_FRACTION, stratify=y,
                             random_state=seed)
    x, y = (parts[0], parts[2]) if split == "train" else (parts[1], parts[3])
    x, y = x[:count], y[:count]
    return ImageSet(torch.from_numpy(2.0 * x - 1.0).reshape(-1, 1, 8, 8), torch.from_numpy(y))


def load_images(name: str, data_dir: str | Path | None = None, split: str = "train",
                seed: int = 0, image_size: int = 32, count: int | None = None) -> ImageSet:
    """The ``split`` ("train" or "test") of image data set ``name`` (one of
    :data:`IMAGE_DATA`). ``seed`` colors Colored MNIST and cuts digits; ``image_size`` and
    ``count`` (default :data:`SHAPES_TRAIN` / :data:`SHAPES_TEST`) size ``shapes``, whose train
    and test images come from different seeds derived from ``seed``; ``count`` also caps the
    digits' train split (so clients x shard_size sizes a digits run's training data)."""
    if name == "cifar10":
        return load_cifar10(data_dir, split)
    if name == "mnist":
        return load_mnist(data_dir, split)
    if name == "colored-mnist":
        colored = load_colored_mnist(data_dir, split, seed)
        return ImageSet(colored.x, colored.labels[:, 0] * 10 + colored.labels[:, 1])
    if name == "digits":
        return load_digit_images(split, seed, count if split == "train" else None)
    if name == "shapes":
        if split not in ("train", "test"):
            raise MissingDataError(f"split = {split!r} is unknown; use 'train' or 'test'")
        count = count or (SHAPES_TRAIN if split == "train" else SHAPES_TEST)
        return make_shapes(count, image_size, 2 * seed + (split == "test"))
    raise MissingDataError(f"data = {name!r} is not an image data set; use one of "
                           f"{', '.join(IMAGE_DATA)}")


def image_shape(name: str, image_size: int = 32) -> tuple[int, int, int]:
    """(C, H, W) of image data set ``name`` without reading it (``image_size``: shapes')."""
    shapes = {"cifar10": (3, 32, 32), "mnist": (1, 28, 28), "colored-mnist": (3, 28, 28),
              "shapes": (3, image_size, image_size), "digits": (1, 8, 8)}
    if name not in shapes:
        raise MissingDataError(f"data = {name!r} is not an image data set; use one of "
                               f"{', '.join(IMAGE_DATA)}")
    return shapes[name]


def gaussian_images(shape: tuple[int, ...]) -> Distribution:
    """N(0, I) on images of ``shape`` (C, H, W) as a :class:`Distribution` of C*H*W (rounded
    up to even) uniforms per image (Box-Muller in pairs), so that keyed per-example streams
    draw it like the 2D sources; points come out [n, C, H, W]."""
    dim = math.prod(shape)
    half = (dim + 1) // 2

    def transform(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = normals(u[:, :half], u[:, half:]).reshape(len(u), 2 * half)[:, :dim]
        return z.reshape(len(u), *shape), torch.zeros(len(u), dtype=torch.long, device=u.device)

    return Distribution(f"gaussian{tuple(shape)}", dim, 2 * half, transform, (0,))


def image_pair(name: str, data_dir: str | Path | None = None, seed: int = 0,
               image_size: int = 32, train_count: int | None = None,
               test_count: int | None = None) -> ImagePair:
    """Source N(0, I) and the train and test images of ``name`` (the counts size ``shapes``,
    ``train_count`` caps ``digits``' train split; the files' sets are read whole)."""
    train = load_images(name, data_dir, "train", seed, image_size, train_count)
    test = load_images(name, data_dir, "test", seed, image_size, test_count)
    classes = 100 if name == "colored-mnist" else 10
    return ImagePair(name, gaussian_images(train.shape), train, test, classes)
