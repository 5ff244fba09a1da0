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
import textwrap
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


# Version of the synthetic set: files written by an older version are written again.
SYNTHETIC_VERSION = 2
# How hard the synthetic set is. Version 1 (distinct blobs, little noise) was learned to 99%
# test accuracy in one epoch, so training curves were flat; these settings keep a small
# LeNet well below that after one epoch and let its accuracy rise over several.
SYNTHETIC_DIFFICULTY = dict(
    shift=3,            # random translation, up to this many pixels each way
    blend=0.3,          # each image mixes in up to this share of another class's shape
    noise=0.2,          # standard deviation of the pixel noise (on a 0..1 scale)
    occlude=0.3,        # share of images with a blacked-out rectangle of 6 to 12 pixels a side
    label_noise=0.05,   # share of labels drawn at random (so about 4.5% are wrong)
)


def _class_templates(rng: np.random.Generator, size: int = 28, parts: int = 12,
                     per_class: int = 3) -> np.ndarray:
    """Ten smooth shapes, one per class, each the sum of 3 of 12 shared Gaussian bumps, so
    that classes overlap in some of their parts as garments do (sleeves, collars, soles)."""
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1) * 2 - 1
    bumps = []
    for _ in range(parts):
        cx, cy = rng.uniform(-0.55, 0.55, 2)
        sx, sy = rng.uniform(0.15, 0.45, 2)
        bumps.append(np.exp(-((xx - cx) ** 2 / sx ** 2 + (yy - cy) ** 2 / sy ** 2)))
    bumps = np.stack(bumps)
    templates = []
    for _ in range(len(LABELS)):
        chosen = rng.choice(parts, per_class, replace=False)
        field = (rng.uniform(0.5, 1.0, per_class)[:, None, None] * bumps[chosen]).sum(0)
        templates.append(field / field.max())
    return np.stack(templates)


def synthetic_images(n: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 uint8 images and labels: a class's shape blended with another's, shifted,
    dimmed, noisy and sometimes partly blacked out; a few labels are random (see
    ``SYNTHETIC_DIFFICULTY``)."""
    d = SYNTHETIC_DIFFICULTY
    templates = _class_templates(np.random.default_rng(1234))  # same shapes for train and test
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(LABELS), n)
    others = rng.integers(0, len(LABELS), n)
    mix = rng.uniform(0, d["blend"], (n, 1, 1))
    images = (1 - mix) * templates[labels] + mix * templates[others]
    shifts = rng.integers(-d["shift"], d["shift"] + 1, (n, 2))
    images = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(images, shifts)])
    images = images * rng.uniform(0.5, 1.0, (n, 1, 1)) + rng.normal(0, d["noise"], images.shape)
    size = images.shape[1]
    for i in np.flatnonzero(rng.random(n) < d["occlude"]):
        h, w = rng.integers(6, 13, 2)
        top, left = rng.integers(0, size - h + 1), rng.integers(0, size - w + 1)
        images[i, top:top + h, left:left + w] = 0
    relabel = rng.random(n) < d["label_noise"]
    labels = np.where(relabel, rng.integers(0, len(LABELS), n), labels)
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels.astype(np.uint8)


def _marker_text() -> str:
    return (f"These files are SYNTHETIC (dlperf.data, version {SYNTHETIC_VERSION}): noisy,\n"
            "overlapping class-shaped blobs written in the Fashion-MNIST IDX format so the real\n"
            "loading code runs without the network. They are not Fashion-MNIST.\n")


def write_synthetic_fashion_mnist(root: Path) -> Path:
    """Write the synthetic set under ``root`` in torchvision's layout; returns the raw folder.

    Each file is written under a temporary name and then renamed, so a process that reads
    the set while another writes it sees whole files."""
    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for train, (images_name, labels_name) in IDX_FILES.items():
        images, labels = synthetic_images(SYNTHETIC_SIZES[train], seed=0 if train else 1)
        for name, array in ((images_name, images), (labels_name, labels)):
            partial = raw / f".{name}.{os.getpid()}.partial"
            write_idx(partial, array)
            os.replace(partial, raw / name)
    (raw / SYNTHETIC_MARKER).write_text(_marker_text())
    return raw


def _synthetic_is_current(root: Path) -> bool:
    marker = Path(root) / "FashionMNIST" / "raw" / SYNTHETIC_MARKER
    return marker.exists() and marker.read_text() == _marker_text()


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
            what = ("SYNTHETIC data in Fashion-MNIST format: noisy, overlapping class-shaped "
                    "blobs, not clothing")
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
                print(textwrap.fill(result.describe(), 88))
            return result
    if not (_has_files(synthetic_root) and _synthetic_is_current(synthetic_root)):
        write_synthetic_fashion_mnist(synthetic_root)
    result = _open(synthetic_root, resize, synthetic=True, note=note)
    if verbose:
        print(textwrap.fill(result.describe(), 88))
    return result


def load_fashion_mnist(batch_size: int, resize=None, **kwargs):
    """``(train_iter, test_iter)`` as in d2l, from :func:`fashion_mnist`."""
    return fashion_mnist(resize=resize, **kwargs).loaders(batch_size)


def text_labels(indices) -> list:
    return [LABELS[int(i)] for i in indices]
