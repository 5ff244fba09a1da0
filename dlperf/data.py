"""Fashion-MNIST through torchvision's own dataset class, or a synthetic stand-in.

The real files come from torchvision's downloader. Where they cannot be had
(CI, an offline laptop, a GPU box without internet) this module writes a small
synthetic set in the very same IDX format and layout, so that the *same*
``torchvision.datasets.FashionMNIST`` class reads it, and says loudly that
the data are synthetic. Synthetic files live under their own root, so they can
never be mistaken for the real set later.

``DLPERF_DATA`` chooses the source: ``auto`` (default: real files if present,
else try to download them, else synthetic), ``real`` (download or fail), or
``synthetic`` (never touch the network; what the tests use).
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torchvision
from torch.utils import data
from torchvision import transforms

SOURCE_ENV_VAR = "DLPERF_DATA"
ROOT_ENV_VAR = "DLPERF_DATA_DIR"
SOURCES = ("auto", "real", "synthetic")

LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat",
          "sandal", "shirt", "sneaker", "bag", "ankle boot")

# torchvision's FashionMNIST looks for these (uncompressed) in <root>/FashionMNIST/raw.
IDX_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SYNTHETIC_MARKER = "SYNTHETIC.txt"
SYNTHETIC_SIZES = {True: 6000, False: 1000}  # train, test


def default_root() -> Path:
    root = os.environ.get(ROOT_ENV_VAR)
    return Path(root) if root else Path.home() / ".cache" / "dlperf" / "data"


# ---------------------------------------------------------------- IDX files
def write_idx(path: Path, array: np.ndarray) -> None:
    """Write an unsigned-byte array in the IDX format of the MNIST family."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        # magic: two zero bytes, type code 0x08 (unsigned byte), number of dimensions
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.tobytes())


def _class_templates(rng: np.random.Generator, size: int = 28) -> np.ndarray:
    """Ten smooth, distinct blob shapes, one per class."""
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1) * 2 - 1
    templates = []
    for _ in range(len(LABELS)):
        field = np.zeros((size, size))
        for _ in range(4):  # a few Gaussian bumps make a shape
            cx, cy = rng.uniform(-0.6, 0.6, 2)
            sx, sy = rng.uniform(0.15, 0.5, 2)
            field += np.exp(-((xx - cx) ** 2 / sx ** 2 + (yy - cy) ** 2 / sy ** 2))
        templates.append(field / field.max())
    return np.stack(templates)


def synthetic_images(n: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 uint8 images and labels: class shape, random shift, brightness and noise."""
    templates = _class_templates(np.random.default_rng(1234))  # same shapes for train and test
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(LABELS), n)
    images = templates[labels]
    shifts = rng.integers(-2, 3, (n, 2))
    images = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(images, shifts)])
    images = images * rng.uniform(0.6, 1.0, (n, 1, 1)) + rng.normal(0, 0.25, images.shape)
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels.astype(np.uint8)


def write_synthetic_fashion_mnist(root: Path) -> Path:
    """Write the synthetic set under ``root`` in torchvision's layout; returns the raw folder."""
    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for train, (images_name, labels_name) in IDX_FILES.items():
        images, labels = synthetic_images(SYNTHETIC_SIZES[train], seed=0 if train else 1)
        write_idx(raw / images_name, images)
        write_idx(raw / labels_name, labels)
    (raw / SYNTHETIC_MARKER).write_text(
        "These files are SYNTHETIC: class-shaped blobs written by dlperf.data in the\n"
        "Fashion-MNIST IDX format so the real loading code runs without the network.\n"
        "They are not Fashion-MNIST.\n")
    return raw


def _has_files(root: Path) -> bool:
    raw = Path(root) / "FashionMNIST" / "raw"
    return all((raw / name).exists() for pair in IDX_FILES.values() for name in pair)


# ---------------------------------------------------------------- datasets
@dataclass
class FashionMNIST:
    """The train and test splits, and whether they are the real thing."""
    train: data.Dataset
    test: data.Dataset
    synthetic: bool
    root: Path
    note: str = ""

    def describe(self) -> str:
        if self.synthetic:
            what = "SYNTHETIC data in Fashion-MNIST format (class-shaped blobs, not clothing)"
        else:
            what = "Fashion-MNIST"
        text = f"{what}: {len(self.train)} training and {len(self.test)} test images"
        return f"{text}; {self.note}" if self.note else text

    def loaders(self, batch_size: int, num_workers: int = 0,
                max_train: Optional[int] = None, max_test: Optional[int] = None):
        """(train_iter, test_iter); ``max_*`` keep the first examples only (quick profile)."""
        train, test = self.train, self.test
        if max_train is not None and max_train < len(train):
            train = data.Subset(train, range(max_train))
        if max_test is not None and max_test < len(test):
            test = data.Subset(test, range(max_test))
        return (data.DataLoader(train, batch_size, shuffle=True, num_workers=num_workers),
                data.DataLoader(test, batch_size, shuffle=False, num_workers=num_workers))


def _transform(resize):
    steps = [transforms.Resize(resize)] if resize else []
    return transforms.Compose(steps + [transforms.ToTensor()])


def _open(root: Path, resize, synthetic: bool, note: str = "") -> FashionMNIST:
    make = lambda train: torchvision.datasets.FashionMNIST(  # noqa: E731
        root=str(root), train=train, transform=_transform(resize), download=False)
    return FashionMNIST(make(True), make(False), synthetic, Path(root), note)


def _download(root: Path, timeout: float = 20.0) -> None:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        for train in (True, False):
            torchvision.datasets.FashionMNIST(root=str(root), train=train, download=True)
    finally:
        socket.setdefaulttimeout(old)


def fashion_mnist(resize=None, source: Optional[str] = None,
                  root: Optional[Path] = None, verbose: bool = True) -> FashionMNIST:
    """Fashion-MNIST from ``root``, downloading or synthesizing it as ``DLPERF_DATA`` says."""
    source = (source or os.environ.get(SOURCE_ENV_VAR) or "auto").strip().lower()
    if source not in SOURCES:
        raise ValueError(f"{SOURCE_ENV_VAR}={source!r} is not a data source: use one of "
                         f"{', '.join(SOURCES)}.")
    root = Path(root) if root is not None else default_root()
    real_root, synthetic_root = root / "real", root / "synthetic"
    note = ""
    if source != "synthetic":
        if not _has_files(real_root):
            try:
                _download(real_root)
            except Exception as error:  # no network, a proxy, a dead mirror...
                if source == "real":
                    raise RuntimeError(
                        f"Could not download Fashion-MNIST into {real_root}: {error}. Copy the "
                        f"four IDX files into {real_root / 'FashionMNIST' / 'raw'} or set "
                        f"{SOURCE_ENV_VAR}=synthetic.") from error
                note = f"the real set could not be downloaded ({type(error).__name__})"
        if _has_files(real_root):
            result = _open(real_root, resize, synthetic=False)
            if verbose:
                print(result.describe())
            return result
    if not _has_files(synthetic_root):
        write_synthetic_fashion_mnist(synthetic_root)
    result = _open(synthetic_root, resize, synthetic=True, note=note)
    if verbose:
        print(result.describe())
    return result


def load_fashion_mnist(batch_size: int, resize=None, **kwargs):
    """``(train_iter, test_iter)`` as in d2l, from :func:`fashion_mnist`."""
    return fashion_mnist(resize=resize, **kwargs).loaders(batch_size)


def text_labels(indices) -> list:
    return [LABELS[int(i)] for i in indices]
