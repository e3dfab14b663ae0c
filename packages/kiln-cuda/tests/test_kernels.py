"""kiln-cuda's generated kernels against PyTorch (CPU build, the oracle) on random, non-contiguous,
broadcast, empty and 0-d inputs; gradients through them in float64 with gradcheck."""

import numpy as np
import pytest
import torch

import kiln

RNG = np.random.default_rng(0)
DTYPES = {
    "float32": (kiln.float32, torch.float32),
    "float64": (kiln.float64, torch.float64),
    "float16": (kiln.float16, torch.float16),
    "bfloat16": (kiln.bfloat16, torch.bfloat16),
    "int64": (kiln.int64, torch.int64),
    "int8": (kiln.int8, torch.int8),
    "uint8": (kiln.uint8, torch.uint8),
    "bool": (kiln.bool, torch.bool),
}


def pair(shape, dtype, *, low=-3, high=3, transpose=False):
    """The same values as a kiln cuda tensor and a torch CPU tensor (transposed views when asked)."""
    k, t = DTYPES[dtype]
    if dtype == "bool":
        a = RNG.random(shape) > 0.5
    elif k.is_floating_point:
        a = RNG.uniform(low, high, shape)
    else:
        a = RNG.integers(max(low, 0) if dtype == "uint8" else low, high, shape)
    tt = torch.tensor(a).to(t)
    kt = kiln.tensor(a, device="cuda").to(k)
    if transpose:
        tt, kt = tt.transpose(0, -1), kt.transpose(0, -1)
    return kt, tt


def same(k_out, t_out, tol=None):
    assert k_out.device.type == "cuda"
    got = torch.from_numpy(
        np.asarray(k_out.cpu().float().numpy() if k_out.dtype == kiln.bfloat16 else k_out.cpu().numpy())
    )
    want = t_out.float() if t_out.dtype == torch.bfloat16 else t_out
    assert tuple(got.shape) == tuple(want.shape)
    if tol is None:
        tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(t_out.dtype, 1e-6)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=tol, atol=tol, equal_nan=True)


UNARY = ["exp", "log", "sqrt", "sin", "tanh", "expm1", "log1p", "erf", "abs", "neg", "floor", "sign", "reciprocal"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_unary(name, dtype):
    k, t = pair((3, 5), dtype, transpose=True)
    same(getattr(kiln, name)(k), getattr(torch, name)(t))


def test_unary_specials_do_not_raise():
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30]
    k, t = kiln.tensor(vals, device="cuda"), torch.tensor(vals)
    for name in ("exp", "log", "sqrt", "log1p", "asin", "acosh", "atanh", "lgamma", "tan", "floor", "sign"):
        same(getattr(kiln, name)(k), getattr(torch, name)(t))


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "remainder", "fmod", "atan2", "eq", "lt", "ge"]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int8"])
def test_binary_broadcast(name, dtype):
    if name == "atan2" and dtype.startswith("int"):
        pytest.skip("atan2 promotes integers (covered by the conformance suite)")
    a, ta = pair((4, 1, 3), dtype, low=1 if name in ("pow", "remainder", "fmod") else -3)
    b, tb = pair((5, 1), dtype, low=1, high=4)
    same(getattr(kiln, name)(a, b), getattr(torch, name)(ta, tb))


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_binary_with_scalars_and_zero_d(dtype):
    a, ta = pair((3, 4), dtype, transpose=True)
    s = True if dtype == "bool" else 2
    same(a * s, ta * s)
    same(a + kiln.tensor(s), ta + torch.tensor(s))  # a 0-d CPU tensor meets a cuda tensor
    if dtype != "bool":
        same(kiln.add(a, a, alpha=3), torch.add(ta, ta, alpha=3))
    if dtype == "uint8":
        same(a + -3, ta + -3)  # wraps as PyTorch does


def test_division_modes_and_integer_zero():
    a, ta = pair((6,), "int64", low=-9, high=9)
    b = kiln.tensor([3, -2, 4, -5, 7, 2], device="cuda")
    tb = torch.tensor([3, -2, 4, -5, 7, 2])
    for mode in (None, "trunc", "floor"):
        same(kiln.div(a, b, rounding_mode=mode), torch.div(ta, tb, rounding_mode=mode))
    fa, tfa = pair((6,), "float64", low=-9, high=9)
    for mode in ("trunc", "floor"):
        same(kiln.div(fa, b.double(), rounding_mode=mode), torch.div(tfa, tb.double(), rounding_mode=mode))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        kiln.div(a, kiln.zeros(6, dtype=kiln.int64, device="cuda"), rounding_mode="floor")


def test_where_clamp_round_shifts():
    a, ta = pair((4, 5), "float32", transpose=True)
    same(kiln.where(a > 0, a, kiln.tensor(0.5)), torch.where(ta > 0, ta, torch.tensor(0.5)))
    same(a.clamp(-1, 1), ta.clamp(-1, 1))
    same(a.clamp(min=0.5), ta.clamp(min=0.5))
    same(kiln.round(a * 10, decimals=-1), torch.round(ta * 10, decimals=-1))
    same(kiln.round(a, decimals=2), torch.round(ta, decimals=2))
    i, ti = pair((8,), "int64", low=-100, high=100)
    sh = kiln.tensor([0, 1, 3, 63, 64, 70, 2, 5], device="cuda")
    tsh = torch.tensor([0, 1, 3, 63, 64, 70, 2, 5])
    same(i >> sh, ti >> tsh)
    same(i << sh, ti << tsh)


def test_empty_and_zero_d():
    e = kiln.empty(0, 3, device="cuda")
    assert (e + 1).shape == (0, 3) and e.sum().item() == 0 and e.sum(0).cpu().tolist() == [0, 0, 0]
    z, tz = kiln.tensor(2.5, device="cuda"), torch.tensor(2.5)
    same(z.exp(), tz.exp())
    same(z.sum(), tz.sum())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "bool"])
@pytest.mark.parametrize("dims", [None, 0, 1, (0, 2), -1])
def test_reductions(dtype, dims):
    a, ta = pair((3, 4, 5), dtype)
    kwargs = {} if dims is None else {"dim": dims}
    same(a.sum(**kwargs), ta.sum(**kwargs), tol=5e-2 if dtype == "bfloat16" else None)
    same(
        a.sum(**kwargs, keepdim=True) if dims is not None else a.sum(),
        ta.sum(**kwargs, keepdim=True) if dims is not None else ta.sum(),
        tol=5e-2 if dtype == "bfloat16" else None,
    )
    if dtype != "bool":
        am = {} if dims is None else {"dim": dims}
        same(a.amax(**am), ta.amax(**am))
        same(a.amin(**am), ta.amin(**am))
    if isinstance(dims, int) or dims is None:
        d = {} if dims is None else {"dim": dims}
        if dtype != "bool":
            same(a.argmax(**d), ta.argmax(**d))
            same(a.argmin(**d), ta.argmin(**d))
        same(
            a.prod(**d) if dims is not None else a.prod(),
            ta.prod(**d) if dims is not None else ta.prod(),
            tol=5e-2 if dtype in ("bfloat16", "float16") else 1e-5,
        )


def test_reduction_nan_rules_and_ties():
    vals = [[1.0, float("nan"), 3.0, float("nan")], [2.0, 2.0, 1.0, 2.0]]
    k, t = kiln.tensor(vals, device="cuda"), torch.tensor(vals)
    for fn in ("amax", "amin", "argmax", "argmin", "sum"):
        same(getattr(k, fn)(1), getattr(t, fn)(1))
    big, tbig = pair((1000,), "float32")  # longer than a block: several rounds of the tree
    same(big.sum(), tbig.sum(), tol=1e-4)
    same(big.argmax(), tbig.argmax())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64"])
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((5, 7), (7, 3)),
        ((7,), (7, 3)),
        ((5, 7), (7,)),
        ((7,), (7,)),
        ((2, 1, 5, 7), (3, 7, 4)),
        ((0, 4), (4, 2)),
        ((3, 0), (0, 2)),
    ],
)
def test_matmul(dtype, sa, sb):
    a, ta = pair(sa, dtype)
    b, tb = pair(sb, dtype)
    if dtype == "float16":
        same(a @ b, (ta.float() @ tb.float()).half(), tol=1e-2)
    else:
        same(a @ b, ta @ tb, tol=1e-5)


def test_matmul_transposed_operands():
    a, ta = pair((6, 5), "float32", transpose=True)
    b, tb = pair((6, 4), "float32")
    same(a @ b, ta @ tb, tol=1e-5)


def test_cat_copies_and_conversions():
    a, ta = pair((2, 3), "float32")
    b, tb = pair((4, 3), "int64")
    same(kiln.cat([a, b], 0), torch.cat([ta, tb], 0))
    same(kiln.cat([a.t(), a.t()], 1), torch.cat([ta.t(), ta.t()], 1))
    same(a.to(kiln.float16), ta.to(torch.float16))
    same(a.to(kiln.bfloat16), ta.to(torch.bfloat16))
    same(a.t().contiguous(), ta.t().contiguous())
    same(
        kiln.full((2, 2), -3, dtype=kiln.uint8, device="cuda") if False else kiln.full((2, 2), 7, device="cuda"),
        torch.full((2, 2), 7.0),
    )


def test_autograd_runs_on_the_device():
    x = kiln.randn(4, 3, dtype=kiln.float64, device="cuda", requires_grad=True)
    w = kiln.randn(3, 2, dtype=kiln.float64, device="cuda", requires_grad=True)
    assert kiln.autograd.gradcheck(lambda x, w: ((x @ w).tanh() * x.sum(1, keepdim=True)).exp().sum(), (x, w))
    y = (x @ w).relu().sum()
    y.backward()
    assert x.grad.device.type == "cuda" and w.grad.device.type == "cuda"
    tx = torch.tensor(x.detach().cpu().numpy(), requires_grad=True)
    tw = torch.tensor(w.detach().cpu().numpy(), requires_grad=True)
    (tx @ tw).relu().sum().backward()
    same(x.grad, tx.grad, tol=1e-10)
    same(w.grad, tw.grad, tol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_digamma_and_erfinv(dtype):
    v = np.array([0.0, -0.0, -1.0, -2.5, 0.3, 1.0, 2.5, 7.3, 15.0, 120.0, 1e-3, np.nan, np.inf, -0.7], dtype)
    same(kiln.digamma(kiln.tensor(v, device="cuda")), torch.digamma(torch.tensor(v)), tol=1e-5)
    u = np.array([-1.0, -0.999, -0.5, 0.0, 0.1, 0.5, 0.9, 0.99999, 1.0, 1.5, np.nan], dtype)
    same(kiln.erfinv(kiln.tensor(u, device="cuda")), torch.erfinv(torch.tensor(u)), tol=1e-5)
    x = kiln.tensor([0.5, 2.0, 3.3], dtype=kiln.float64, device="cuda", requires_grad=True)
    assert kiln.autograd.gradcheck(lambda x: (kiln.lgamma(x) + kiln.erfinv(x / 4)).sum(), (x,))
