"""``affine_grid`` and ``grid_sample`` against torch: every mode, padding mode and ``align_corners``, 4-D and
5-D, values and gradients to input and grid, float64 gradcheck, warnings and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from layer_twins import same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn.functional as F
from kiln.autograd import gradcheck


def k(t: torch.Tensor, grad: bool = False) -> kiln.Tensor:
    return kiln.tensor(to_np(t), requires_grad=grad)


@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 3, 1, 5), (2, 1, 6, 1), (2, 3, 4, 5, 6), (2, 1, 1, 3, 2)])
def test_affine_grid_matches_torch(size, align_corners):
    theta = torch.randn(2, len(size) - 2, len(size) - 1, dtype=torch.float64, requires_grad=True)
    tk = k(theta, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tout, kout = TF.affine_grid(theta, size, align_corners), F.affine_grid(tk, size, align_corners)
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-12, atol=1e-12)
    g = torch.randn(tout.shape, dtype=torch.float64)
    (tout * g).sum().backward()
    (kout * k(g)).sum().backward()
    np.testing.assert_allclose(to_np(tk.grad), theta.grad.numpy(), rtol=1e-10, atol=1e-12)
    if min(size[2:]) > 1:
        assert gradcheck(lambda t: F.affine_grid(t, size, align_corners), (k(theta, True),))


def test_affine_grid_warnings_match_torch():
    theta = torch.randn(2, 2, 3)
    for args in (((2, 3, 4, 5),), ((2, 3, 1, 5), True)):
        with warnings.catch_warnings(record=True) as tw:
            warnings.simplefilter("always")
            TF.affine_grid(theta, *args)
        with warnings.catch_warnings(record=True) as kw:
            warnings.simplefilter("always")
            F.affine_grid(k(theta), *args)
        assert [str(w.message) for w in kw] == [str(w.message) for w in tw] and len(tw) == 1


AFFINE_ERRORS = [
    ((2, 2, 3), "int64", (2, 3, 4, 5)),
    ((2, 2, 3), "float32", (2, 3, 4, 5, 6)),
    ((2, 3, 4), "float32", (2, 3, 4, 5)),
    ((2, 2, 3), "float32", (2, 3, 4)),
    ((2, 2, 3), "float32", (2, 3, 0, 5)),
    ((2, 2, 3), "float32", [2, 3, -1, 5]),
    ((2, 2, 3), "float32", (3, 3, 4, 5)),
    ((2, 3, 4), "float32", (3, 3, 4, 5, 6)),
    ((2, 2), "float32", (2, 3, 4, 5)),
]


@pytest.mark.parametrize(("shape", "dtype", "size"), AFFINE_ERRORS)
def test_affine_grid_errors_match_torch(shape, dtype, size):
    t = torch.randn(*shape).to(getattr(torch, dtype))
    same_error(lambda: F.affine_grid(k(t), size, False), lambda: TF.affine_grid(t, size, False))


MODES = [
    (mode, padding, align)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for align in (True, False)
]


@pytest.mark.parametrize(("mode", "padding_mode", "align_corners"), MODES)
@pytest.mark.parametrize("nd", [2, 3])
def test_grid_sample_matches_torch(nd, mode, padding_mode, align_corners):
    if nd == 3 and mode == "bicubic":
        pytest.skip("bicubic is 4-D only (its error is tested below)")
    x = torch.randn(2, 3, *[4, 5, 6][:nd], dtype=torch.float64)
    x = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # non-contiguous
    grid = torch.rand(2, *[3, 4, 5][:nd], nd, dtype=torch.float64) * 2.8 - 1.4  # some positions outside
    xt, gt = x.clone().requires_grad_(), grid.clone().requires_grad_()
    xk, gk = k(x, True), k(grid, True)
    tout = TF.grid_sample(xt, gt, mode, padding_mode, align_corners)
    kout = F.grid_sample(xk, gk, mode, padding_mode, align_corners)
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    w = torch.randn(tout.shape, dtype=torch.float64)
    (tout * w).sum().backward()
    (kout * k(w)).sum().backward()
    np.testing.assert_allclose(to_np(xk.grad), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert gk.grad is not None  # nearest: zeros, as torch's
    np.testing.assert_allclose(to_np(gk.grad), gt.grad.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(("mode", "padding_mode", "align_corners"), [m for m in MODES if m[0] != "nearest"])
def test_grid_sample_gradcheck(mode, padding_mode, align_corners):
    x = kiln.randn(1, 2, 3, 4, dtype=kiln.float64, requires_grad=True)
    # away from pixel boundaries, where the interpolation is not differentiable
    grid = (kiln.rand(1, 2, 3, 2, dtype=kiln.float64) * 0.8 + 0.05) * kiln.tensor([1.0, -1.0], dtype=kiln.float64)
    grid = grid.detach().requires_grad_()
    assert gradcheck(lambda a, g: F.grid_sample(a, g, mode, padding_mode, align_corners), (x, grid))


def test_grid_sample_float32_half_empty_and_far_outside():
    x, grid = torch.randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2) * 20 - 10
    for pm in ("zeros", "border", "reflection"):
        np.testing.assert_allclose(
            to_np(F.grid_sample(k(x), k(grid), padding_mode=pm, align_corners=False)),
            TF.grid_sample(x, grid, padding_mode=pm, align_corners=False).numpy(),
            rtol=1e-5,
            atol=1e-5,
        )
    xh, gh = x.half(), (torch.rand(2, 4, 3, 2) * 2 - 1).half()
    np.testing.assert_allclose(
        to_np(F.grid_sample(k(xh), k(gh), align_corners=True)).astype(np.float32),
        TF.grid_sample(xh, gh, align_corners=True).float().numpy(),
        atol=1e-2,
    )
    for xs, gs in (((0, 3, 4, 5), (0, 2, 3, 2)), ((2, 0, 4, 5), (2, 2, 3, 2)), ((2, 3, 4, 5), (2, 0, 3, 2))):
        assert (
            F.grid_sample(kiln.randn(*xs), kiln.rand(*gs), align_corners=False).shape
            == TF.grid_sample(torch.randn(*xs), torch.rand(*gs), align_corners=False).shape
        )


def test_grid_sample_default_align_corners_warns_like_torch():
    x, g = torch.randn(1, 1, 3, 3), torch.rand(1, 2, 2, 2)
    with warnings.catch_warnings(record=True) as tw:
        warnings.simplefilter("always")
        tout = TF.grid_sample(x, g)
    with warnings.catch_warnings(record=True) as kw:
        warnings.simplefilter("always")
        kout = F.grid_sample(k(x), k(g))
    assert [str(w.message) for w in kw] == [str(w.message) for w in tw]
    np.testing.assert_allclose(to_np(kout), tout.numpy(), rtol=1e-6)


GRID_ERRORS = [
    ((2, 3, 4, 5), (2, 6, 7, 2), {"mode": "linear"}),
    ((2, 3, 4, 5), (2, 6, 7, 2), {"padding_mode": "circular"}),
    ((2, 3, 4, 5), (1, 6, 7, 2), {}),
    ((2, 3, 4, 5), (2, 6, 7, 1), {}),
    ((3, 4, 5), (6, 7, 2), {}),
    ((2, 3, 4, 5), (1, 2, 6, 7, 2), {}),
    ((2, 3, 0, 5), (2, 6, 7, 2), {}),
    ((2, 3, 4, 5, 6), (2, 3, 4, 5, 3), {"mode": "bicubic"}),
    ((2, 3, 4, 5, 6), (2, 3, 4, 5, 2), {}),
    ((2, 3, 4, 5, 6), (2, 6, 7, 2), {}),
    ((2, 3, 4), (2, 3, 1), {}),
    ((2, 3, 4, 5), (2, 6, 7, 8, 2), {}),
    ((2, 3, 4, 5, 6, 7), (2, 3, 4, 5, 6, 4), {}),
]


@pytest.mark.parametrize(("xs", "gs", "kwargs"), GRID_ERRORS)
def test_grid_sample_errors_match_torch(xs, gs, kwargs):
    x, g = torch.randn(*xs), torch.rand(*gs)
    same_error(
        lambda: F.grid_sample(k(x), k(g), align_corners=False, **kwargs),
        lambda: TF.grid_sample(x, g, align_corners=False, **kwargs),
    )


@pytest.mark.parametrize(("xs", "gs"), [((2, 3, 4, 5), (2, 6, 7, 2)), ((2, 3, 4, 5, 6), (2, 3, 4, 5, 3))])
def test_grid_sample_dtype_errors_match_torch(xs, gs):
    x, g = torch.randn(*xs), torch.rand(*gs)
    same_error(
        lambda: F.grid_sample(k(x), k(g.double()), align_corners=False),
        lambda: TF.grid_sample(x, g.double(), align_corners=False),
    )
    same_error(
        lambda: F.grid_sample(k(x.long()), k(g.long()), align_corners=False),
        lambda: TF.grid_sample(x.long(), g.long(), align_corners=False),
        NotImplementedError,
    )


def test_spatial_transformer_round_trip():
    # the identity transform samples the input back (align_corners=False, pixel centres)
    x = kiln.randn(2, 3, 5, 7)
    theta = kiln.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]] * 2)
    grid = F.affine_grid(theta, [2, 3, 5, 7], align_corners=False)
    np.testing.assert_allclose(to_np(F.grid_sample(x, grid, align_corners=False)), to_np(x), atol=1e-6)
