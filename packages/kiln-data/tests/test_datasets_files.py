"""kiln.data.datasets: the embedded digits, downloads from a local HTTP server, file-backed datasets."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import os
import pickle
import tarfile
import threading

import numpy as np
import pytest

import kiln
from kiln.data import DataLoader
from kiln.data.datasets import (
    CIFAR10,
    MNIST,
    CSVDataset,
    Digits,
    FashionMNIST,
    ImageFolder,
    NumpyDataset,
    download_url,
    read_idx,
)


def test_digits_embedded():
    ds = Digits()
    assert len(ds) == 1797
    x, y = ds[0]
    assert x.shape == (1, 8, 8) and x.dtype == kiln.float32 and y == 0
    assert x.min().item() >= 0.0 and x.max().item() <= 1.0
    assert np.bincount(ds.targets).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert ds.data.dtype == np.uint8 and ds.data.max() == 16
    xb, yb = next(iter(DataLoader(ds, batch_size=64, shuffle=True)))
    assert xb.shape == (64, 1, 8, 8) and yb.dtype == kiln.int64


# ------------------------------------------------------------------------------- local HTTP server


@pytest.fixture
def server(tmp_path):
    """Serves ``tmp_path/www`` on 127.0.0.1; yields (base URL, folder)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", www
    httpd.shutdown()
    httpd.server_close()


def idx_bytes(a: np.ndarray) -> bytes:
    code = {np.dtype(np.uint8): 0x08}[a.dtype]
    header = bytes([0, 0, code, a.ndim]) + b"".join(d.to_bytes(4, "big") for d in a.shape)
    return header + a.tobytes()


def write_mnist(folder, n_train=5, n_test=3, seed=0):
    rng = np.random.default_rng(seed)
    table = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for kind, arr in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
            name = f"{prefix}-{kind}.gz"
            blob = gzip.compress(idx_bytes(arr))
            (folder / name).write_bytes(blob)
            table.append((name, hashlib.md5(blob).hexdigest()))
    return table


@pytest.mark.parametrize("cls", [MNIST, FashionMNIST])
def test_mnist_download_and_read(server, tmp_path, monkeypatch, cls):
    url, www = server
    table = write_mnist(www)
    monkeypatch.setattr(cls, "mirrors", [url + "missing/", url])  # the first mirror 404s
    monkeypatch.setattr(cls, "resources", table)
    root = tmp_path / "data"
    with pytest.raises(RuntimeError, match="Dataset not found"):
        cls(root)
    train = cls(root, download=True)
    test = cls(root, train=False)
    assert len(train) == 5 and len(test) == 3
    img, label = train[0]
    assert img.shape == (28, 28) and img.dtype == np.uint8 and 0 <= label < 10
    assert sorted(os.listdir(root / cls.__name__ / "raw")) == sorted(n for n, _ in table)
    raw = read_idx(root / cls.__name__ / "raw" / "train-images-idx3-ubyte.gz")
    assert np.array_equal(raw[0], img)


def test_download_checksum_mismatch_leaves_nothing(server, tmp_path):
    url, www = server
    (www / "f.bin").write_bytes(b"hello")
    target = tmp_path / "out" / "f.bin"
    with pytest.raises(RuntimeError, match="md5 checksum mismatch"):
        download_url(url + "f.bin", target, md5="0" * 32)
    assert not target.parent.exists() or os.listdir(target.parent) == []
    good = hashlib.sha256(b"hello").hexdigest()
    assert download_url(url + "f.bin", target, sha256=good).read_bytes() == b"hello"
    assert os.listdir(target.parent) == ["f.bin"]


def test_cifar10_download_and_read(server, tmp_path, monkeypatch):
    url, www = server
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:

        def add(name, obj):
            blob = pickle.dumps(obj)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))

        for name in [*CIFAR10.train_list, *CIFAR10.test_list]:
            add(
                name,
                {
                    "data": rng.integers(0, 256, size=(4, 3072), dtype=np.uint8),
                    "labels": rng.integers(0, 10, 4).tolist(),
                },
            )
        add("batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    (www / "cifar.tar.gz").write_bytes(buf.getvalue())
    monkeypatch.setattr(CIFAR10, "url", url + "cifar.tar.gz")
    monkeypatch.setattr(CIFAR10, "tgz_md5", hashlib.md5(buf.getvalue()).hexdigest())
    root = tmp_path / "data"
    train = CIFAR10(root, download=True)
    test = CIFAR10(root, train=False)
    assert len(train) == 20 and len(test) == 4
    img, _ = train[0]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    assert train.classes[0] == "class0" and train.class_to_idx["class9"] == 9


def test_image_folder(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    for cls, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (tmp_path / cls).mkdir()
        for i in range(2):
            pil.new("RGB", (6, 4), color).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    from kiln.data.transforms import ToTensor

    ds = ImageFolder(tmp_path, transform=ToTensor())
    assert ds.classes == ["cat", "dog"] and len(ds) == 4 and ds.targets == [0, 0, 1, 1]
    x, y = ds[3]
    assert x.shape == (3, 4, 6) and y == 1 and x[2].mean().item() == 1.0
    xb, yb = next(iter(DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 3, 4, 6) and yb.tolist() == [0, 0, 1, 1]


def test_csv_and_numpy_datasets(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("a,b,label\n1.5,2,0\n3,4.25,1\n5,6,1\n")
    ds = CSVDataset(csv, target_column="label")
    assert len(ds) == 3 and ds.columns == ["a", "b", "label"]
    x, y = ds[1]
    assert x.tolist() == [3.0, 4.25] and y == 1 and isinstance(y, int)
    assert CSVDataset(csv, target_column=None)[0].tolist() == [1.5, 2.0, 0.0]
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    np.save(tmp_path / "y.npy", np.arange(4))
    nd = NumpyDataset(tmp_path / "x.npy", tmp_path / "y.npy")
    assert len(nd) == 4
    a, b = nd[2]
    assert a.tolist() == [6.0, 7.0, 8.0] and b.item() == 2
    np.savez(tmp_path / "d.npz", x=np.ones((2, 2)), y=np.zeros(2))
    assert [t.tolist() for t in NumpyDataset(tmp_path / "d.npz", keys=["y", "x"])[1]] == [0.0, [1.0, 1.0]]
    xb, yb = next(iter(DataLoader(nd, batch_size=4, num_workers=1)))
    assert xb.shape == (4, 3) and yb.tolist() == [0, 1, 2, 3]
