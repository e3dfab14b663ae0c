"""pow's kernel against PyTorch (the oracle) and the reference: the special exponents bit for bit, float32
to other exponents within 1 ulp, integers bit for bit (wrapping), every layout, and the cases that stay
with the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kiln_cpu_helpers import assert_same, make, reference, ulp_distance

import kiln
from kiln_cpu import _jit_pow, _opcodes, config

FLOAT = [kiln.float32, kiln.float64]
INTS = [kiln.int32, kiln.int64]
SPECIAL = [2, 3, 0.5, -0.5, -1, -2.0]


def _torch(t: kiln.Tensor) -> torch.Tensor:
    """The same values as a (contiguous) torch tensor: layouts are checked against the reference."""
    return torch.from_numpy(np.array(t.numpy()))


def _torch_dtype(d: kiln.dtype) -> torch.dtype:
    return getattr(torch, str(d).removeprefix("kiln."))


def _layouts(dtype):
    """name -> (tensor, the Numba layout expected: "flat", "strided", or None for the reference)."""
    return {
        "contiguous": (make((6, 7), dtype), "flat"),
        "transposed": (make((7, 6), dtype).t(), "flat"),
        "strided": (make((6, 14), dtype)[:, 1::2], "strided"),
        "expand": (make((1, 7), dtype).expand(6, 7), "strided"),
        "0-d": (make((), dtype), "flat"),
        "5-d": (make((2, 3, 2, 4, 2), dtype).permute(4, 3, 2, 1, 0)[:, ::2], None),
    }


def _assert_matches_torch(got: kiln.Tensor, expected: torch.Tensor, ulps: int) -> None:
    e = expected.numpy()
    a = got.numpy()
    assert a.dtype == e.dtype and a.shape == e.shape
    if a.dtype.kind != "f":
        np.testing.assert_array_equal(a, e)
        return
    nan = np.isnan(e)
    np.testing.assert_array_equal(np.isnan(a), nan)
    far = ulp_distance(a[~nan], e[~nan]) > ulps
    assert not far.any(), f"{far.sum()} elements: {a[~nan][far][:5]} vs {e[~nan][far][:5]}"


@pytest.fixture
def ipow_spy(monkeypatch):
    """Records each call of the integer loop ``ipow_scalar`` (its exponent)."""
    calls = []
    real = _jit_pow.ipow_scalar

    def record(a, e, out, lo, hi):
        calls.append(int(e))
        return real(a, e, out, lo, hi)

    monkeypatch.setattr(_jit_pow, "ipow_scalar", record)
    return calls


# ------------------------------------------------------------------------------- special exponents


@pytest.mark.parametrize("layout", list(_layouts(kiln.float32)))
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("exponent", SPECIAL)
def test_special_exponents_bit_for_bit(exponent, dtype, layout, spy):
    """2, 3, 0.5, -0.5, -1 and -2 are x*x, x*x*x, sqrt, 1/sqrt, 1/x and 1/(x*x), as PyTorch computes them
    (and the reference): bit for bit, NaN, infinities, -0.0 and denormals included. Except 0.5: kiln's
    square root is correctly rounded (the reference's, ``kiln.sqrt``'s); PyTorch's (its ``torch.sqrt``
    too) is 1 ulp off for a sixth of float32 values on an AVX-512 build."""
    x, expected_layout = _layouts(dtype)[layout]
    got = kiln.pow(x, exponent)
    assert_same(got, reference(kiln.pow, x, exponent))
    _assert_matches_torch(got, torch.pow(_torch(x), exponent), ulps=1 if exponent == 0.5 else 0)
    code = _opcodes.POW_EXPONENTS[exponent]
    assert spy == ([("unary", code, expected_layout)] if expected_layout else [])
    if exponent == 0.5:
        assert_same(got, kiln.sqrt(x))


# ------------------------------------------------------------------------------ float32, any exponent

GENERAL = [2.7, -1.3, 0.25, 1.5, -2.5, 4.0, 5, -3, 7.0, 100.0, -100.0, 1e-30, 0.0, 1, float("inf"), -float("inf")]


def _float_values(n: int, seed: int = 0) -> np.ndarray:
    """float32 values over the whole range, both signs, integers among them, and C99's special cases."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(-20, 20, n)) * rng.choice([-1.0, 1.0], n)
    x[::7] = np.round(x[::7] % 9)  # small integers, for the integral exponents of negative bases
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 1e-40, -1e-40, 3.4e38, -3.4e38, 0.5]
    x[: len(specials)] = specials
    return x.astype(np.float32)


@pytest.mark.parametrize("exponent", GENERAL + [float("nan"), 1e40])
def test_float32_general_exponent_within_one_ulp(exponent, spy):
    """float32 to any other number: within 1 ulp of PyTorch's pow (mostly the same bits), C99's special
    cases exactly. PyTorch's vectorised loop rounds the exponent to float32 (its scalar tail does not):
    kiln does, so the oracle gets the exponent as float32 too."""
    x = kiln.from_numpy(_float_values(4099))
    got = kiln.pow(x, exponent)
    with np.errstate(over="ignore"):
        e32 = float(np.float32(exponent))
    _assert_matches_torch(got, torch.pow(_torch(x), e32), ulps=1)
    code = _opcodes.POW_EXPONENTS.get(exponent)
    assert spy == [("binary", _opcodes.POW, "scalar")] if code is None else [("unary", code, "flat")]


def test_float32_exponent_rounds_as_pytorchs_vector_loop():
    """With the exponent as given (2.7, not a float32), a contiguous 4096-element tensor matches
    PyTorch's vectorised loop within 1 ulp: that loop rounds the exponent to float32, as kiln (and
    NumPy's power, the reference) do."""
    x = kiln.from_numpy(np.abs(_float_values(4096, seed=3)))
    _assert_matches_torch(kiln.pow(x, 2.7), torch.pow(_torch(x), 2.7), ulps=1)


@pytest.mark.parametrize("layout", list(_layouts(kiln.float32)))
def test_float32_general_exponent_layouts(layout, spy):
    """Every layout: the result's layout is the reference's, the values PyTorch's within 1 ulp."""
    x, expected_layout = _layouts(kiln.float32)[layout]
    got = kiln.pow(x, 2.5)
    assert_same(got, reference(kiln.pow, x, 2.5), ulps=1)
    _assert_matches_torch(got, torch.pow(_torch(x), 2.5), ulps=1)
    expected = {"flat": "scalar", "strided": "strided"}.get(expected_layout)
    assert spy == ([("binary", _opcodes.POW, expected)] if expected else [])


@pytest.mark.parametrize("case", ["same shape", "transposed", "broadcast", "scalar-shaped exponent"])
def test_float32_tensor_exponents(case, spy):
    """A float32 tensor to a float32 tensor of exponents, broadcasting: within 1 ulp of PyTorch's."""
    rng = np.random.default_rng(1)
    x = kiln.from_numpy(_float_values(6 * 40).reshape(6, 40))
    e = {
        "same shape": rng.uniform(-4, 4, (6, 40)),
        "transposed": rng.uniform(-4, 4, (40, 6)).T,
        "broadcast": rng.uniform(-4, 4, (40,)),
        "scalar-shaped exponent": np.array(2.5),
    }[case]
    e = kiln.from_numpy(np.array(e, dtype=np.float32))
    if case == "same shape":  # exact integers and the special cases among the exponents
        e[0, :6] = kiln.tensor([0.0, 1.0, 2.0, float("nan"), float("inf"), -3.0])
    if case == "transposed":
        x = x.t().contiguous().t()
    got = kiln.pow(x, e)
    _assert_matches_torch(got, torch.pow(_torch(x), _torch(e)), ulps=1)
    assert spy and all(c[:2] == ("binary", _opcodes.POW) for c in spy)


# ---------------------------------------------------------------------------------------- integers

INT_EXPONENTS = [0, 1, 2, 3, 5, 13, 31, 32, 62, 63, 64, 1000, 2**31 - 1]


@pytest.mark.parametrize("exponent", INT_EXPONENTS)
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_powers_wrap_as_pytorch(dtype, exponent, ipow_spy):
    """int32/int64 to a non-negative integer: PyTorch's values bit for bit, products wrapping (the
    extremes, -1, 0 and +-1000 included)."""
    x = make((67, 31), dtype)
    got = kiln.pow(x, exponent)
    _assert_matches_torch(got, torch.pow(_torch(x), exponent), ulps=0)
    assert_same(got, reference(kiln.pow, x, exponent))
    assert ipow_spy == [exponent]


@pytest.mark.parametrize("layout", list(_layouts(kiln.int64)))
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_powers_layouts(dtype, layout, ipow_spy, spy):
    """Dense layouts run the vector loop, the others the binary loop's ``POW`` code: the same values."""
    x, expected_layout = _layouts(dtype)[layout]
    got = kiln.pow(x, 3)
    assert_same(got, reference(kiln.pow, x, 3))
    _assert_matches_torch(got, torch.pow(_torch(x), 3), ulps=0)
    assert ipow_spy == ([3] if expected_layout == "flat" else [])
    assert spy == ([("binary", _opcodes.POW, "strided")] if expected_layout == "strided" else [])


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_tensor_exponents(dtype, spy):
    """An integer tensor to a tensor of its dtype: negative exponents give PyTorch's truncated 1/x**-y
    (1 for 1, +-1 for -1, 0 otherwise, 0 itself included)."""
    rng = np.random.default_rng(2)
    x = kiln.from_numpy(rng.integers(-4, 5, (9, 50)).astype(dtype.numpy))
    e = kiln.from_numpy(rng.integers(-6, 70, (9, 50)).astype(dtype.numpy))
    got = kiln.pow(x, e)
    _assert_matches_torch(got, torch.pow(_torch(x), _torch(e)), ulps=0)
    assert_same(got, reference(kiln.pow, x, e))
    assert spy == [("binary", _opcodes.POW, "flat")]


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_negative_number_exponent_raises(dtype):
    """As PyTorch: an integer tensor to a negative integer is refused before any kernel runs."""
    x = make((40, 40), dtype)
    with pytest.raises(RuntimeError, match=r"^Integers to negative integer powers are not allowed\.$"):
        kiln.pow(x, -2)
    with pytest.raises(RuntimeError, match=r"^Integers to negative integer powers are not allowed\.$"):
        torch.pow(_torch(x), -2)


# ------------------------------------------------------------------------- what stays with the reference


@pytest.mark.parametrize(
    "case",
    [
        "float64 general exponent",
        "float64 tensor exponent",
        "bool exponent",
        "number base",
        "float16",
        "bfloat16",
        "integer tensor, float exponent",
        "int32 exponent beyond int32",
        "mixed dtypes",
        "empty",
    ],
)
def test_other_cases_run_the_reference(case, spy, ipow_spy):
    """Every other pow runs the reference kernel: no Numba loop, the reference's result (and PyTorch's
    dtype)."""
    x = make((6, 7), kiln.float32)
    args = {
        "float64 general exponent": (make((6, 7), kiln.float64), 2.5),
        "float64 tensor exponent": (make((6, 7), kiln.float64), kiln.full((6, 7), 2.5, dtype=kiln.float64)),
        "bool exponent": (x, True),
        "number base": (2.0, x),
        "float16": (make((6, 7), kiln.float16), 2.5),
        "bfloat16": (make((6, 7), kiln.bfloat16), 3),
        "integer tensor, float exponent": (make((6, 7), kiln.int64), 2.5),
        "int32 exponent beyond int32": (make((6, 7), kiln.int32), 2**31),
        "mixed dtypes": (x, kiln.full((6, 7), 2.0, dtype=kiln.float64)),
        "empty": (make((0, 7), kiln.float32), 2.7),
    }[case]
    got = kiln.pow(*args)
    assert_same(got, reference(kiln.pow, *args))
    if case != "int32 exponent beyond int32":  # PyTorch refuses the conversion of the exponent
        like = [
            torch.zeros(tuple(a.shape), dtype=_torch_dtype(a.dtype)) if isinstance(a, kiln.Tensor) else a for a in args
        ]
        assert _torch_dtype(got.dtype) == torch.pow(*like).dtype
    assert spy == [] and ipow_spy == []


def test_threshold(monkeypatch, spy):
    """With the default sizes, pow runs its loops from ``multipass_min_numel`` elements (the reference's
    expressions make several passes), not from ``min_numel``."""
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    small = make((config.multipass_min_numel - 1,), kiln.float32)
    kiln.pow(small, 3)
    assert spy == []
    kiln.pow(make((config.multipass_min_numel,), kiln.float32), 3)
    assert spy == [("unary", _opcodes.CUBE, "flat")]


def test_inplace_and_autograd():
    """``pow_`` writes the kernel's result into its input; the gradient of ``x ** 2.7`` is PyTorch's."""
    # 2048 elements: PyTorch's vectorised loop covers all of them (its scalar tail keeps the exponent
    # in float64, up to a dozen ulps away from the vector loop's result on large values)
    data = np.abs(_float_values(2048 + 20, seed=4)[20:]) + 0.5
    x = kiln.from_numpy(data.copy())
    x.pow_(2.7)
    _assert_matches_torch(x, torch.from_numpy(data.copy()).pow_(2.7), ulps=1)
    k = kiln.from_numpy(data.copy()).requires_grad_()
    t = torch.from_numpy(data.copy()).requires_grad_()
    kiln.pow(k, 2.7).sum().backward()
    torch.pow(t, 2.7).sum().backward()
    _assert_matches_torch(k.grad, t.grad, ulps=2)
