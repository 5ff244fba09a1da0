import numpy as np
import pytest
import torch
import torchvision

import dlperf.data as data_module
from dlperf.data import (IDX_FILES, LABELS, SYNTHETIC_MARKER, SYNTHETIC_SIZES, fashion_mnist,
                         synthetic_images, write_idx, write_synthetic_fashion_mnist)


def test_synthetic_set_reads_back_through_torchvisions_own_class(tmp_path):
    raw = write_synthetic_fashion_mnist(tmp_path)
    assert (raw / SYNTHETIC_MARKER).read_text().startswith("These files are SYNTHETIC")
    for train in (True, False):
        ds = torchvision.datasets.FashionMNIST(str(tmp_path), train=train, download=False)
        images, labels = synthetic_images(SYNTHETIC_SIZES[train], seed=0 if train else 1)
        assert ds.data.shape == (SYNTHETIC_SIZES[train], 28, 28)
        assert ds.data.dtype == torch.uint8 and ds.targets.dtype == torch.int64
        assert torch.equal(ds.data, torch.from_numpy(images))
        assert torch.equal(ds.targets, torch.from_numpy(labels).long())
        assert set(ds.targets.tolist()) == set(range(len(LABELS)))


def test_idx_header_is_the_mnist_format(tmp_path):
    write_idx(tmp_path / "x", np.arange(6, dtype=np.uint8).reshape(1, 2, 3))
    raw = (tmp_path / "x").read_bytes()
    assert raw[:4] == bytes([0, 0, 8, 3])
    assert int.from_bytes(raw[4:8], "big") == 1 and int.from_bytes(raw[12:16], "big") == 3
    assert raw[16:] == bytes(range(6))


def test_synthetic_source_says_so_and_never_downloads(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data_module, "_download", lambda root: pytest.fail("tried the network"))
    ds = fashion_mnist(source="synthetic", root=tmp_path)
    assert ds.synthetic and "SYNTHETIC" in capsys.readouterr().out
    x, y = ds.train[0]
    assert x.shape == (1, 28, 28) and 0 <= x.min() and x.max() <= 1 and 0 <= y < 10
    assert ds.root == tmp_path / "synthetic"


def test_auto_falls_back_to_synthetic_when_download_fails(tmp_path, monkeypatch, capsys):
    def offline(root):
        raise OSError("Temporary failure in name resolution")
    monkeypatch.setattr(data_module, "_download", offline)
    ds = fashion_mnist(source="auto", root=tmp_path)
    out = capsys.readouterr().out
    assert ds.synthetic and "SYNTHETIC" in out and "could not be downloaded" in out
    # nothing synthetic was written where the real set belongs
    assert not (tmp_path / "real" / "FashionMNIST" / "raw" / SYNTHETIC_MARKER).exists()


def test_real_source_without_network_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "_download", lambda root: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(RuntimeError, match="Could not download.*DLPERF_DATA=synthetic"):
        fashion_mnist(source="real", root=tmp_path)


def test_real_files_when_present_are_used_as_real(tmp_path, monkeypatch, capsys):
    raw = tmp_path / "real" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for train, (images_name, labels_name) in IDX_FILES.items():
        write_idx(raw / images_name, np.zeros((4, 28, 28), np.uint8))
        write_idx(raw / labels_name, np.arange(4, dtype=np.uint8))
    monkeypatch.setattr(data_module, "_download", lambda root: pytest.fail("files were there"))
    ds = fashion_mnist(source="auto", root=tmp_path)
    assert not ds.synthetic and len(ds.train) == 4
    assert "SYNTHETIC" not in capsys.readouterr().out


def test_unknown_source_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="auto, real, synthetic"):
        fashion_mnist(source="imagenet", root=tmp_path)


def test_loaders_limit_and_resize(tmp_path):
    ds = fashion_mnist(resize=32, source="synthetic", root=tmp_path, verbose=False)
    train_iter, test_iter = ds.loaders(64, max_train=128, max_test=64)
    X, y = next(iter(train_iter))
    assert X.shape == (64, 1, 32, 32) and y.shape == (64,)
    assert len(train_iter.dataset) == 128 and len(test_iter.dataset) == 64


def test_synthetic_classes_are_learnable():
    """A nearest-class-mean rule must beat chance by far, so the pages' models can learn."""
    train_x, train_y = synthetic_images(2000, seed=0)
    test_x, test_y = synthetic_images(500, seed=1)
    means = np.stack([train_x[train_y == c].mean(0) for c in range(10)]).reshape(10, -1)
    dists = ((test_x.reshape(len(test_x), 1, -1) - means[None]) ** 2).sum(-1)
    accuracy = (dists.argmin(1) == test_y).mean()
    assert accuracy > 0.5, accuracy


def _lenet_accuracies(epochs: int):
    """Test accuracy after each epoch of the pages' LeNet on the synthetic set (seeded SGD)."""
    import torch.nn.functional as F

    from dlperf.models import lenet, lenet_params

    def tensors(n, seed):
        images, labels = synthetic_images(n, seed)
        return (torch.from_numpy(images).float().div(255).unsqueeze(1),
                torch.from_numpy(labels).long())

    train_x, train_y = tensors(SYNTHETIC_SIZES[True], seed=0)
    test_x, test_y = tensors(SYNTHETIC_SIZES[False], seed=1)
    params = [p.requires_grad_() for p in lenet_params(seed=0)]
    order = torch.Generator().manual_seed(0)
    accuracies = []
    for _ in range(epochs):
        for batch in torch.randperm(len(train_x), generator=order).split(128):
            F.cross_entropy(lenet(train_x[batch], params), train_y[batch]).backward()
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
                    p.grad = None
        with torch.no_grad():
            accuracies.append(float((lenet(test_x, params).argmax(1) == test_y).float().mean()))
    return accuracies


def test_synthetic_set_is_hard_enough_for_curves_that_move():
    """One epoch must not be enough (version 1 of the set reached 0.99 in one), yet the model
    must clearly learn (chance is 0.1) and keep improving over the pages' few epochs."""
    first, _, third = _lenet_accuracies(epochs=3)
    assert 0.3 < first < 0.9, first
    assert third > first + 0.1, (first, third)


def test_an_outdated_synthetic_set_is_written_again(tmp_path):
    raw = write_synthetic_fashion_mnist(tmp_path / "synthetic")
    (raw / SYNTHETIC_MARKER).write_text("These files are SYNTHETIC: an older version.\n")
    write_idx(raw / IDX_FILES[True][1], np.zeros(3, np.uint8))
    ds = fashion_mnist(source="synthetic", root=tmp_path, verbose=False)
    assert len(ds.train) == SYNTHETIC_SIZES[True]
    assert "version" in (raw / SYNTHETIC_MARKER).read_text()
