"""Dtype conversion (``Tensor.to``) and cumsum/cumprod against the reference kernels: every dtype pair and
layout, float16/bfloat16 rounding (nearest-even, NumPy's and ml_dtypes' NaN conventions) over every
half-precision value and over float32 bit patterns around each rounding boundary, and the cases handed
back to the reference."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
from kiln_cpu import _jit_elementwise, _jit_scan

DTYPES = [kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16, kiln.int32, kiln.int64]
SOURCES = DTYPES + [kiln.bool]
HALF = [kiln.float16, kiln.bfloat16]


def _layouts(dtype):
    return {
        "contiguous": make((6, 8), dtype),
        "transposed": make((8, 6), dtype).t(),
        "strided": make((6, 16), dtype)[:, 1::2],
        "expanded": make((1, 8), dtype).expand(6, 8),
        "3-d permuted": make((3, 4, 5), dtype).permute(2, 0, 1),
        "empty": make((0, 4), dtype),
    }


@pytest.fixture
def cast_spy(monkeypatch):
    calls: list[tuple] = []
    real = _jit_elementwise.cast
    monkeypatch.setattr(_jit_elementwise, "cast", lambda *a: calls.append(a) or real(*a))
    return calls


@pytest.mark.parametrize("layout", list(_layouts(kiln.float32)))
@pytest.mark.parametrize("dst", DTYPES, ids=str)
@pytest.mark.parametrize("src", SOURCES, ids=str)
def test_conversion_matches_reference(src, dst, layout, cast_spy):
    x = _layouts(src)[layout]
    assert_same(x.to(dst), reference(lambda t: t.to(dst), x))
    exact = dst in HALF and src in (kiln.float32, *HALF, kiln.bool)
    exact = exact or (dst in (kiln.int32, kiln.int64) and src in (kiln.int32, kiln.int64, kiln.bool))
    exact = exact or (dst in (kiln.float32, kiln.float64) and src is not dst)
    taken = exact and src is not dst and x.numel() > 0
    assert bool(cast_spy) == taken


def _f32_from_bits(b):
    return kiln.from_numpy(np.asarray(b, np.uint32).view(np.float32).copy())


def _boundaries(mantissa_bits: int) -> np.ndarray:
    """float32 bit patterns at and around every rounding boundary of a format keeping ``mantissa_bits``
    of float32's 23 (ties, one below, one above), over every exponent, both signs, plus NaN payloads."""
    drop = 23 - mantissa_bits
    rng = np.random.default_rng(0)
    kept = rng.integers(0, 1 << mantissa_bits, 4096, dtype=np.uint32) << np.uint32(drop)
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    base = (exps[:, None] | kept[None, :16]).reshape(-1)
    half_ulp = np.uint32(1 << (drop - 1))
    pats = np.concatenate([base, base | half_ulp, base | (half_ulp - 1), base | (half_ulp + 1)])
    pats = np.concatenate([pats, pats | np.uint32(0x80000000), [0x7F800001, 0xFFC00001, 0x7FBFFFFF, 0x7FC00000]])
    return pats.astype(np.uint32)


@pytest.mark.parametrize(("dst", "kept"), [(kiln.float16, 10), (kiln.bfloat16, 7)], ids=["float16", "bfloat16"])
def test_rounding_to_half_precision_is_numpys(dst, kept, cast_spy):
    x = _f32_from_bits(_boundaries(kept))
    got = x.to(dst).numpy().view(np.uint16)
    expected = reference(lambda t: t.to(dst), x).numpy().view(np.uint16)
    np.testing.assert_array_equal(got, expected)  # bits, NaN payloads included
    assert cast_spy


@pytest.mark.parametrize("src", HALF, ids=str)
def test_every_half_precision_value_widens_exactly(src, cast_spy):
    x = kiln.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(src.numpy).copy())
    got = x.to(kiln.float32).numpy().view(np.uint32)
    expected = reference(lambda t: t.to(kiln.float32), x).numpy().view(np.uint32)
    np.testing.assert_array_equal(got, expected)
    assert cast_spy


def test_float64_to_half_goes_to_the_reference(cast_spy):
    # 1 + 2**-11 + 2**-40 rounds up to float16 directly, but to the tie 1 + 2**-11 (then down) via float32
    x = kiln.tensor([1 + 2**-11 + 2**-40] * 8, dtype=kiln.float64)
    assert x.to(kiln.float16).numpy()[0] == np.float16(1 + 2**-10)
    assert cast_spy == []


# ----------------------------------------------------------------------------------------------- scans


@pytest.fixture
def scan_spy(monkeypatch):
    calls: list[tuple] = []
    real = _jit_scan.scan
    monkeypatch.setattr(_jit_scan, "scan", lambda *a: calls.append(a) or real(*a))
    return calls


SCAN_DTYPES = [kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16, kiln.int64]


@pytest.mark.parametrize("layout", [k for k in _layouts(kiln.float32) if k != "empty"])
@pytest.mark.parametrize("dtype", SCAN_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_matches_reference_bit_for_bit(name, dtype, layout, scan_spy):
    x = _layouts(dtype)[layout]
    for dim in range(-x.dim(), x.dim()):
        fn = lambda t, dim=dim: getattr(kiln, name)(t, dim)
        assert_same(fn(x), reference(fn, x))
    assert len(scan_spy) == x.dim() * 2


def test_long_rows_accumulate_in_order(scan_spy):
    x = kiln.from_numpy(np.random.default_rng(1).standard_normal(100_000).astype(np.float32))
    assert_same(kiln.cumsum(x, 0), reference(lambda t: kiln.cumsum(t, 0), x))
    h = x.to(kiln.float16)
    assert_same(kiln.cumsum(h, 0), reference(lambda t: kiln.cumsum(t, 0), h))  # float32 accumulator
    assert len(scan_spy) == 2


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: kiln.cumsum(t.to(kiln.int32), 0),  # int32 accumulates in int64
        lambda t: kiln.cumsum(t, 0, dtype=kiln.float64),
        lambda t: kiln.cumsum(t[0, 0], 0),  # 0-d
        lambda t: kiln.cumprod(t[:0], 1),  # empty
    ],
    ids=["int32", "dtype", "0-d", "empty"],
)
def test_scan_hand_backs(fn, scan_spy):
    x = make((4, 5), kiln.float32)
    assert_same(fn(x), reference(fn, x))
    assert scan_spy == []


def test_scan_gradients_are_unchanged():
    x = make((5, 6), kiln.float64).requires_grad_()
    (kiln.cumprod(x, 1) * kiln.arange(6.0)).sum().backward()
    expected = reference(lambda t: kiln.autograd.grad((kiln.cumprod(t, 1) * kiln.arange(6.0)).sum(), t)[0], x)
    assert_same(x.grad, expected, ulps=4)


def test_integer_half_conversions_match_numpy_bit_for_bit():
    """The integer-arithmetic conversions, which CPUs without a float16 instruction run (this one may use
    its own): every float16 value widened, float32 rounding boundaries and NaN payloads narrowed."""
    from numba import njit

    from kiln_cpu._jit_half import f16_to_f32_bits, f32_to_f16_bits

    @njit
    def widen(h, out):
        for i in range(h.shape[0]):
            out[i] = f16_to_f32_bits(h[i])

    @njit
    def narrow(f, out):
        for i in range(f.shape[0]):
            out[i] = f32_to_f16_bits(f[i])

    halves = np.arange(1 << 16, dtype=np.uint16)
    wide = np.empty(halves.size, np.float32)
    widen(halves, wide)
    np.testing.assert_array_equal(wide.view(np.uint32), halves.view(np.float16).astype(np.float32).view(np.uint32))
    pats = _boundaries(10).view(np.float32)
    bits = np.empty(pats.size, np.uint16)
    narrow(pats, bits)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(bits, pats.astype(np.float16).view(np.uint16))
