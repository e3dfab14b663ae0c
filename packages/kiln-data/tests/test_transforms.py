"""kiln.data.transforms against PyTorch (interpolate for resizing) and NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.data import transforms as T


def image(c=3, h=10, w=12, seed=0, batch=None):
    rng = np.random.default_rng(seed)
    shape = (c, h, w) if batch is None else (batch, c, h, w)
    return rng.random(shape, dtype=np.float32)


def test_to_tensor_and_normalize():
    hwc = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    t = T.ToTensor()(hwc)
    assert t.shape == (3, 4, 5) and t.dtype == kiln.float32
    np.testing.assert_allclose(t.numpy(), hwc.transpose(2, 0, 1) / 255.0, rtol=1e-6)
    assert T.ToTensor()(hwc[:, :, 0]).shape == (1, 4, 5)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.3, 0.4]
    for a in (image(), image(batch=2)):
        got = T.Normalize(mean, std)(kiln.from_numpy(a.copy()))
        want = (torch.from_numpy(a) - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    with pytest.raises(TypeError, match="Input tensor should be a float tensor"):
        T.Normalize(mean, std)(kiln.zeros(3, 2, 2, dtype=kiln.uint8))


@pytest.mark.parametrize("size", [(5, 6), (20, 7), (10, 12), (3, 30)])
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("batch", [None, 2])
def test_resize_matches_torch_interpolate(size, antialias, batch):
    a = image(batch=batch)
    got = T.Resize(size, antialias=antialias)(kiln.from_numpy(a.copy()))
    x = torch.from_numpy(a if batch else a[None])
    want = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=antialias)
    want = want if batch else want[0]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_resize_int_keeps_aspect_and_uint8():
    a = (image(1, 10, 20) * 255).astype(np.uint8)
    out = T.Resize(5)(kiln.from_numpy(a))
    assert out.shape == (1, 5, 10) and out.dtype == kiln.uint8


def test_crops_and_flip():
    a = image()
    t = kiln.from_numpy(a.copy())
    np.testing.assert_array_equal(T.CenterCrop(4)(t).numpy(), a[:, 3:7, 4:8])
    np.testing.assert_array_equal(T.CenterCrop((12, 12))(t).numpy()[:, 1:11, :], a)  # padded with zeros
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=1.0)(t).numpy(), a[:, :, ::-1])
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=0.0)(t).numpy(), a)
    kiln.manual_seed(0)
    crops = [T.RandomCrop(8, padding=2)(t) for _ in range(20)]
    padded = np.pad(a, [(0, 0), (2, 2), (2, 2)])
    windows = {
        (i, j)
        for i in range(7)
        for j in range(9)
        for c in crops
        if np.array_equal(c.numpy(), padded[:, i : i + 8, j : j + 8])
    }
    assert len(windows) > 3
    assert T.RandomCrop(20, pad_if_needed=True, padding_mode="reflect")(t).shape == (3, 20, 20)
    out = T.RandomResizedCrop(6)(t)
    assert out.shape == (3, 6, 6)
    assert T.RandomResizedCrop((4, 5))(kiln.from_numpy(image(batch=2))).shape == (2, 3, 4, 5)


def test_random_rotation():
    a = image(2, 8, 8)
    t = kiln.from_numpy(a.copy())
    np.testing.assert_array_equal(T.RandomRotation((90, 90))(t).numpy(), np.rot90(a, 1, axes=(1, 2)))
    np.testing.assert_array_equal(T.RandomRotation((0, 0))(t).numpy(), a)
    out = T.RandomRotation((45, 45), fill=-1.0)(t).numpy()
    assert out[0, 0, 0] == -1.0 and out[0, 4, 4] != -1.0


def test_color_jitter():
    a = image()
    t = kiln.from_numpy(a.copy())
    np.testing.assert_allclose(T.ColorJitter(brightness=(0.5, 0.5))(t).numpy(), a * 0.5, rtol=1e-6)
    np.testing.assert_allclose(T.ColorJitter(hue=(0.0, 0.0))(t).numpy(), a, atol=1e-6)  # HSV round trip
    gray = T.ColorJitter(saturation=(0.0, 0.0))(t).numpy()
    np.testing.assert_allclose(gray[0], gray[1], atol=1e-6)
    out = T.ColorJitter(0.4, 0.4, 0.4, 0.1)(t)
    assert out.shape == t.shape and out.min().item() >= 0 and out.max().item() <= 1
    with pytest.raises(ValueError, match="hue values should be between"):
        T.ColorJitter(hue=0.7)


def test_random_erasing_and_lambda_compose():
    t = kiln.ones(3, 16, 16)
    out = T.RandomErasing(p=1.0, value=0)(t)
    zeros = (out == 0).float().sum().item()
    assert 0 < zeros < 3 * 256 and t.min().item() == 1.0
    assert T.RandomErasing(p=0.0)(t) is t
    pipe = T.Compose([T.Lambda(lambda x: x * 2), T.Normalize([1, 1, 1], [1, 1, 1])])
    assert pipe(t).tolist() == kiln.ones(3, 16, 16).tolist()
    assert "Lambda" in repr(pipe) or "Compose" in repr(pipe)


def test_randomness_follows_kiln_seed():
    t = kiln.from_numpy(image())
    pipe = T.Compose([T.RandomResizedCrop(6), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3, 0.3, 0.05)])
    kiln.manual_seed(5)
    a = pipe(t).numpy()
    kiln.manual_seed(5)
    np.testing.assert_array_equal(pipe(t).numpy(), a)
