"""End-to-end: a small CNN and a small Transformer encoder classifier learn synthetic tasks with Adam."""

from __future__ import annotations

import numpy as np
import pytest
from layer_twins import seeded  # noqa: F401

import kiln
import kiln.nn as nn
import kiln.optim

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


def _train(model, opt, loss_fn, x, y, steps):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_small_cnn_learns_quadrant_task():
    """Conv2d-BatchNorm-ReLU-MaxPool-Linear: which quadrant of an 8x8 image holds the bright blob (4 classes)."""
    rng = np.random.default_rng(0)
    n = 64
    labels = rng.integers(0, 4, n)
    imgs = rng.normal(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    for i, c in enumerate(labels):
        r, col = (c // 2) * 4, (c % 2) * 4
        imgs[i, 0, r + 1 : r + 3, col + 1 : col + 3] += 2.0
    x, y = kiln.tensor(imgs), kiln.tensor(labels)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 4),
    )
    opt = kiln.optim.Adam(model.parameters(), lr=1e-2)
    losses = _train(model, opt, nn.CrossEntropyLoss(), x, y, 200)
    assert losses[-1] < losses[0] / 1000, (losses[0], losses[-1])
    model.eval()
    acc = (model(x).argmax(1) == y).float().mean().item()
    assert acc == 1.0
    assert model[1].num_batches_tracked.item() == 200


class _Classifier(nn.Module):
    """Embedding + TransformerEncoder + mean pooling + Linear."""

    def __init__(self, vocab: int, d: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(kiln.randn(1, 6, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos)
        return self.head(h.mean(1))


def test_small_transformer_classifier_learns_token_presence():
    """Label = whether token 1 occurs before token 2 in a length-6 sequence (needs attention over positions)."""
    rng = np.random.default_rng(1)
    n = 64
    toks = rng.integers(3, 10, (n, 6))
    labels = np.zeros(n, dtype=np.int64)
    for i in range(n):
        a, b = rng.choice(6, 2, replace=False)
        toks[i, a], toks[i, b] = 1, 2
        labels[i] = int(a < b)
    x, y = kiln.tensor(toks), kiln.tensor(labels)
    model = _Classifier(10, 16, 2)
    opt = kiln.optim.Adam(model.parameters(), lr=5e-3)
    losses = _train(model, opt, nn.CrossEntropyLoss(), x, y, 200)
    assert losses[-1] < losses[0] / 100, (losses[0], losses[-1])
    model.eval()
    assert (model(x).argmax(1) == y).float().mean().item() == 1.0


def _lockstep(build, x_np, y_np, steps=5, lr=0.1):
    """Train the kiln model and its torch twin side by side; parameters and buffers must agree.

    SGD with momentum rather than Adam: some parameters (a key bias in attention) have a true gradient of 0,
    and Adam would blow the float rounding noise in it up into full-size steps that differ between libraries.
    """
    import torch
    from layer_twins import load_from_torch, to_np

    k, t = build(nn), build(torch.nn)
    load_from_torch(k, t)
    ok = kiln.optim.SGD(k.parameters(), lr=lr, momentum=0.9)
    ot = torch.optim.SGD(t.parameters(), lr=lr, momentum=0.9)
    xk, yk = kiln.tensor(x_np), kiln.tensor(y_np)
    xt, yt = torch.from_numpy(x_np), torch.from_numpy(y_np)
    for _ in range(steps):
        ok.zero_grad()
        ot.zero_grad()
        lk, lt = nn.CrossEntropyLoss()(k(xk), yk), torch.nn.CrossEntropyLoss()(t(xt), yt)
        np.testing.assert_allclose(lk.item(), lt.item(), rtol=1e-4)
        lk.backward()
        lt.backward()
        ok.step()
        ot.step()
    tsd = t.state_dict()
    for name, v in k.state_dict().items():
        np.testing.assert_allclose(to_np(v), to_np(tsd[name]), rtol=1e-3, atol=1e-5, err_msg=name)


def test_cnn_trains_in_lockstep_with_torch():
    rng = np.random.default_rng(2)

    def build(lib):
        return lib.Sequential(
            lib.Conv2d(2, 4, 3, padding=1),
            lib.BatchNorm2d(4),
            lib.ReLU(),
            lib.MaxPool2d(2),
            lib.Flatten(),
            lib.Linear(4 * 3 * 3, 3),
        )

    _lockstep(build, rng.standard_normal((8, 2, 6, 6)).astype(np.float32), rng.integers(0, 3, 8))


def test_lstm_and_transformer_train_in_lockstep_with_torch():
    rng = np.random.default_rng(3)

    class Seq(nn.Module):
        def __init__(self, lib):
            super().__init__()
            self.rnn = lib.LSTM(4, 6, 2, batch_first=True, bidirectional=True)
            self.enc = lib.TransformerEncoderLayer(12, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
            self.head = lib.Linear(12, 3)

        def forward(self, x):
            return self.head(self.enc(self.rnn(x)[0]).mean(1))

    def build(lib):
        if lib is nn:
            return Seq(lib)
        import torch

        class TSeq(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = lib.LSTM(4, 6, 2, batch_first=True, bidirectional=True)
                self.enc = lib.TransformerEncoderLayer(12, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
                self.head = lib.Linear(12, 3)

            def forward(self, x):
                return self.head(self.enc(self.rnn(x)[0]).mean(1))

        return TSeq()

    _lockstep(build, rng.standard_normal((5, 7, 4)).astype(np.float32), rng.integers(0, 3, 5))
