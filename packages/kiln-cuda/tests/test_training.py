"""A held-out-style training loop on the GPU: a small CNN and an MLP trained for a few steps on ``cuda`` and on
the CPU from the same weights and batches must end with the same weights and losses."""

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


def _cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.0),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3),
    )  # fmt: skip


def _mlp():
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 3))


def _train(model, device, data, optimizer):
    model = model.to(device)
    opt = optimizer(model.parameters())
    losses = []
    for x, y in data:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        kiln.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize(
    "make,shape,optimizer",
    [
        (_cnn, (6, 1, 8, 8), lambda p: kiln.optim.Adam(p, lr=1e-2)),
        (_mlp, (6, 12), lambda p: kiln.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)),
        (_mlp, (6, 12), lambda p: kiln.optim.AdamW(p, lr=1e-2)),
    ],
    ids=["cnn-adam", "mlp-sgd", "mlp-adamw"],
)
def test_training_matches_the_cpu(make, shape, optimizer):
    rng = np.random.default_rng(1)
    data = [
        (kiln.tensor(rng.standard_normal(shape).astype(np.float32)), kiln.tensor(rng.integers(0, 3, shape[0])))
        for _ in range(3)
    ]
    kiln.manual_seed(0)
    cpu_model = make()
    gpu_model = make()
    gpu_model.load_state_dict(cpu_model.state_dict())
    cpu_model, cpu_losses = _train(cpu_model, "cpu", data, optimizer)
    gpu_model, gpu_losses = _train(gpu_model, "cuda", data, optimizer)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for (name, p_cpu), p_gpu in zip(cpu_model.state_dict().items(), gpu_model.state_dict().values()):
        assert p_gpu.device.type == "cuda", name
        np.testing.assert_allclose(p_gpu.cpu().numpy(), p_cpu.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_checkpoint_round_trip(tmp_path):
    model = _mlp().cuda()
    kiln.save(model.state_dict(), tmp_path / "m.pt")
    loaded = kiln.load(tmp_path / "m.pt", map_location="cpu", weights_only=True)
    assert all(v.device.type == "cpu" for v in loaded.values())
    back = kiln.load(tmp_path / "m.pt", weights_only=True)
    assert all(v.device.type == "cuda" for v in back.values())
    for k, v in model.state_dict().items():
        assert back[k].cpu().tolist() == v.cpu().tolist()


def test_eval_mode_and_no_grad():
    model = _cnn().cuda().eval()
    with kiln.no_grad():
        out = model(kiln.randn(2, 1, 8, 8, device="cuda"))
    assert out.shape == (2, 3) and out.device.type == "cuda" and not out.requires_grad
    probs = F.softmax(out, -1)
    assert kiln.allclose(probs.sum(-1), kiln.ones(2, device="cuda"))
