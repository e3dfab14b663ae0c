"""Indexing, scatter, masks, scans, sort, convolution and pooling on cuda against PyTorch (CPU build)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import kiln
import kiln.nn.functional as F

RNG = np.random.default_rng(3)


def same(k, t, tol=1e-5):
    assert k.device.type == "cuda"
    got = k.detach().cpu()
    got = got.float().numpy() if got.dtype == kiln.bfloat16 else got.numpy()
    want = t.detach()
    want = want.float().numpy() if want.dtype == torch.bfloat16 else want.numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


def pair(a):
    return kiln.tensor(a, device="cuda"), torch.tensor(a)


X = RNG.standard_normal((4, 5)).astype(np.float32)
IDX = np.array([[0, 2, 1, 4, 3], [1, 1, 0, 0, 2], [3, 3, 3, 3, 3], [0, 1, 2, 3, 4]])


def test_gather_scatter_and_their_gradients():
    kx, tx = pair(X)
    ki, ti = pair(IDX)
    same(kx.gather(1, ki), tx.gather(1, ti))
    same(kx.t().gather(0, ki.t()[:, :3] % 4), tx.t().gather(0, ti.t()[:, :3] % 4))  # strided operands
    same(kiln.zeros(4, 5, device="cuda").scatter_add(1, ki, kx), torch.zeros(4, 5).scatter_add(1, ti, tx))
    same(kiln.zeros(4, 5, device="cuda").scatter(1, ki[:, :1], kx), torch.zeros(4, 5).scatter(1, ti[:, :1], tx))
    same(kiln.zeros(4, 5, device="cuda").scatter(1, ki[:, :1], 2.5), torch.zeros(4, 5).scatter(1, ti[:, :1], 2.5))
    a, ta = kx.clone().requires_grad_(), tx.clone().requires_grad_()
    (a.gather(1, ki) * kx).sum().backward()
    (ta.gather(1, ti) * tx).sum().backward()
    same(a.grad, ta.grad)


def test_index_ops_and_negative_indices():
    kx, tx = pair(X)
    kidx, tidx = kiln.tensor([4, 3, 0], device="cuda"), torch.tensor([4, 3, 0])
    same(kx.index_select(1, kidx), tx.index_select(1, tidx))
    src, tsrc = pair(RNG.standard_normal((4, 3)).astype(np.float32))
    same(kx.index_add(1, kidx, src, alpha=2), tx.index_add(1, tidx, tsrc, alpha=2))
    same(kx.index_copy(1, kiln.tensor([0, 2, 4], device="cuda"), src), tx.index_copy(1, torch.tensor([0, 2, 4]), tsrc))
    same(kx.index_fill(1, kidx, -7.0), tx.index_fill(1, tidx, -7.0))
    neg = kx.index_select(1, kiln.tensor([-1, -5], device="cuda"))  # kiln counts negatives from the end
    same(neg, tx.index_select(1, torch.tensor([4, 0])))
    ki8 = kiln.zeros(3, 4, dtype=kiln.int8, device="cuda")  # accumulates in a wider scratch tensor
    same(
        ki8.index_add(0, kiln.tensor([0, 0, 2], device="cuda"), kiln.ones(3, 4, dtype=kiln.int8, device="cuda")),
        torch.zeros(3, 4, dtype=torch.int8).index_add(0, torch.tensor([0, 0, 2]), torch.ones(3, 4, dtype=torch.int8)),
    )


def test_bad_indices_raise_the_cpu_error():
    kx = kiln.tensor(X, device="cuda")
    with pytest.raises(RuntimeError, match="index 10 is out of bounds for dimension 1 with size 5"):
        kx.gather(1, kiln.tensor(IDX + 10, device="cuda"))
    with pytest.raises(IndexError, match="out of"):
        kx[kiln.tensor([7], device="cuda")]
    with pytest.raises((IndexError, RuntimeError)):
        kx.index_select(0, kiln.tensor([4], device="cuda"))


def test_advanced_indexing_and_index_put():
    kx, tx = pair(RNG.standard_normal((4, 5, 3)).astype(np.float32))
    r, tr = kiln.tensor([0, 2, -1], device="cuda"), torch.tensor([0, 2, -1])
    c, tc = kiln.tensor([1, 3, 4], device="cuda"), torch.tensor([1, 3, 4])
    same(kx[r], tx[tr])
    same(kx[:, c], tx[:, tc])
    same(kx[r, c], tx[tr, tc])
    same(kx[r, :, kiln.tensor([0, 1, 2], device="cuda")], tx[tr, :, torch.tensor([0, 1, 2])])  # split: dims first
    same(kx[r[:, None], c], tx[tr[:, None], tc])  # broadcast index tensors
    m, tm = kx > 0, tx > 0
    same(kx[m], tx[tm])
    same(kx[m[:, :, 0]], tx[tm[:, :, 0]])
    k2, t2 = kx.clone(), tx.clone()
    k2[r, c] = 9.0
    t2[tr, tc] = 9.0
    same(k2, t2)
    k2[m] = 0.0
    t2[tm] = 0.0
    same(k2, t2)
    dup, tdup = kiln.tensor([1, 1, 3], device="cuda"), torch.tensor([1, 1, 3])
    same(
        kx.index_put((dup,), kiln.ones(3, 5, 3, device="cuda"), accumulate=True),
        tx.index_put((tdup,), torch.ones(3, 5, 3), accumulate=True),
    )


def test_masks_and_nonzero():
    kx, tx = pair(RNG.standard_normal((3, 4)).astype(np.float32))
    same(kiln.nonzero(kx > 0), torch.nonzero(tx > 0))
    same(kiln.nonzero(kiln.zeros(3, device="cuda")), torch.nonzero(torch.zeros(3)))
    same(kx.masked_select(kx > 0.5), tx.masked_select(tx > 0.5))
    same(
        kx.masked_select(kiln.tensor([True, False, True, False], device="cuda")),
        tx.masked_select(torch.tensor([True, False, True, False])),
    )
    src, tsrc = pair(np.arange(20, dtype=np.float32))
    same(kx.masked_scatter(kx > 0, src), tx.masked_scatter(tx > 0, tsrc))
    same(kx.masked_fill(kx < 0, 0.0), tx.masked_fill(tx < 0, 0.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_scans(dtype):
    kx, tx = pair((RNG.standard_normal((3, 6)) * 3).astype(dtype))
    for d in (0, 1, -1):
        same(kx.cumsum(d), tx.cumsum(d), 1e-4)
        same(kx.cumprod(d), tx.cumprod(d), 1e-4)
        same(kx.cummax(d).values, tx.cummax(d).values)
        same(kx.cummax(d).indices, tx.cummax(d).indices)
        same(kx.cummin(d).indices, tx.cummin(d).indices)
        if dtype != np.int64:
            same(kx.logcumsumexp(d), tx.logcumsumexp(d), 1e-4)
    nan, tnan = pair(np.array([1.0, np.nan, 3.0, np.nan, 0.5], np.float32))
    same(nan.cummax(0).indices, tnan.cummax(0).indices)
    same(nan.cumsum(0), tnan.cumsum(0))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_topk_argsort(descending):
    a = RNG.integers(0, 5, (4, 9)).astype(np.float32)
    a[0, 3] = a[2, 1] = np.nan
    kx, tx = pair(a)
    for d in (0, 1):
        kv, ki = kiln.sort(kx, dim=d, descending=descending, stable=True)
        tv, ti = torch.sort(tx, dim=d, descending=descending, stable=True)
        same(kv, tv)
        same(ki, ti)
    ky, ty = pair(RNG.standard_normal((5, 40)).astype(np.float32))
    same(kiln.topk(ky, 4, largest=not descending).values, torch.topk(ty, 4, largest=not descending).values)
    same(kiln.argsort(ky, dim=1, descending=descending), torch.argsort(ty, dim=1, descending=descending))
    same(kiln.msort(ky), torch.msort(ty))
    same(kiln.median(kx, 1).values, torch.median(tx, 1).values)
    same(kiln.median(kx, 1).indices, torch.median(tx, 1).indices)
    same(kiln.median(ky, 0, keepdim=True).indices, torch.median(ty, 0, keepdim=True).indices)
    same(kiln.median(ky), torch.median(ty))


def test_dropout_masks_and_seeding():
    kiln.cuda.manual_seed(7)
    a = F.dropout(kiln.ones(2000, device="cuda"), 0.25)
    kiln.cuda.manual_seed(7)
    b = F.dropout(kiln.ones(2000, device="cuda"), 0.25)
    c = F.dropout(kiln.ones(2000, device="cuda"), 0.25)
    assert kiln.equal(a, b) and not kiln.equal(b, c)
    kept = (a != 0).float().mean().item()
    assert 0.70 < kept < 0.80 and abs(a.max().item() - 4 / 3) < 1e-6


def test_convolutions_forward_and_backward():
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    kx, kw, kb = (kiln.tensor(v, device="cuda", requires_grad=True) for v in (x, w, b))
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
    kw_, tw_ = (
        dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
        dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
    )
    ky, ty = F.conv2d(kx, kw, kb, **kw_), TF.conv2d(tx, tw, tb, **tw_)
    same(ky, ty, 1e-4)
    (ky * ky).sum().backward()
    (ty * ty).sum().backward()
    for k, t in ((kx, tx), (kw, tw), (kb, tb)):
        same(k.grad, t.grad, 1e-3)
    wt = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    same(
        F.conv_transpose2d(kx.detach(), kiln.tensor(wt, device="cuda"), stride=2, padding=1, output_padding=1),
        TF.conv_transpose2d(tx.detach(), torch.tensor(wt), stride=2, padding=1, output_padding=1),
        1e-4,
    )
    same(
        F.conv1d(kx[:, :, 0].detach(), kw[:, :, 0].detach(), groups=2),
        TF.conv1d(tx[:, :, 0].detach(), tw[:, :, 0].detach(), groups=2),
        1e-4,
    )


def test_pooling_unfold_fold():
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    x[0, 0, 1, 1] = np.nan
    kx, tx = pair(x)
    same(F.max_pool2d(kx, 2), TF.max_pool2d(tx, 2))
    kv, ki = F.max_pool2d(kx, 3, stride=2, padding=1, return_indices=True, ceil_mode=True)
    tv, ti = TF.max_pool2d(tx, 3, stride=2, padding=1, return_indices=True, ceil_mode=True)
    same(kv, tv)
    same(ki, ti)
    same(F.adaptive_max_pool2d(kx, (3, 4)), TF.adaptive_max_pool2d(tx, (3, 4)))
    same(F.max_pool1d(kx[:, :, 0], 2), TF.max_pool1d(tx[:, :, 0], 2))
    same(F.unfold(kx, 3, padding=1), TF.unfold(tx, 3, padding=1))
    cols = TF.unfold(tx, 3, padding=1)
    same(
        F.fold(kiln.tensor(cols.numpy(), device="cuda"), (7, 6), 3, padding=1),
        TF.fold(cols, (7, 6), 3, padding=1),
        1e-4,
    )
    a, ta = kx.clone().requires_grad_(), tx.clone().requires_grad_()
    F.max_pool2d(a, 2).sum().backward()
    TF.max_pool2d(ta, 2).sum().backward()
    same(a.grad, ta.grad)
