"""addmm and baddbmm against the reference kernels: bias shapes that broadcast, alpha and beta (beta = 0
ignores NaN in the input), transposed and strided operands, and the cases left to the reference."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, reference

import kiln
from kiln import _plugins

FLOAT = [kiln.float32, kiln.float64]


def _rand(shape, dtype, seed):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype.numpy))


SCALES = [(1, 1), (0.5, 2.0), (0, 1), (2, -1), (1, 0)]


@pytest.mark.parametrize("beta,alpha", SCALES)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_addmm_matches_reference(dtype, beta, alpha):
    a, b = _rand((9, 13), dtype, 0), _rand((13, 7), dtype, 1)
    wide = _rand((13, 14), dtype, 5)
    nan_bias = _rand((7,), dtype, 6)
    nan_bias[2] = float("nan")
    for base in (_rand((7,), dtype, 2), _rand((9, 7), dtype, 3), _rand((9, 1), dtype, 4), nan_bias):
        for x, y in ((a, b), (a.t().contiguous().t(), b), (a, wide[:, ::2])):  # dense, transposed, strided
            fn = lambda s, p, q: kiln.addmm(s, p, q, beta=beta, alpha=alpha)
            assert_same(fn(base, x, y), reference(fn, base, x, y), ulps=4, atol=1e-12)
    assert _plugins.kernel_owner("addmm", "cpu", dtype) == "cpu"


@pytest.mark.parametrize("beta,alpha", SCALES)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_baddbmm_matches_reference(dtype, beta, alpha):
    a, b = _rand((3, 5, 6), dtype, 0), _rand((3, 6, 4), dtype, 1)
    bt = _rand((3, 4, 6), dtype, 7).transpose(1, 2)
    for base in (_rand((4,), dtype, 2), _rand((3, 5, 4), dtype, 3), _rand((1, 5, 1), dtype, 4)):
        for y in (b, bt):
            fn = lambda s, p, q: kiln.baddbmm(s, p, q, beta=beta, alpha=alpha)
            assert_same(fn(base, a, y), reference(fn, base, a, y), ulps=4, atol=1e-12)


def test_numpy_scalars_and_other_dtypes_go_to_the_reference():
    a, b, c = _rand((4, 5), kiln.float32, 0), _rand((5, 3), kiln.float32, 1), _rand((3,), kiln.float32, 2)
    fn = lambda s, p, q: kiln.addmm(s, p, q, alpha=np.float64(0.1), beta=np.float64(0.3))
    assert_same(fn(c, a, b), reference(fn, c, a, b))
    h = [t.to(kiln.float16) for t in (c, a, b)]
    assert_same(kiln.addmm(*h), reference(kiln.addmm, *h))
    assert _plugins.kernel_owner("addmm", "cpu", kiln.float16) == _plugins.REFERENCE_PLUGIN


def test_addmm_result_is_fresh_and_contiguous():
    a, b, c = _rand((4, 5), kiln.float64, 0), _rand((5, 3), kiln.float64, 1), _rand((4, 3), kiln.float64, 2)
    r = kiln.addmm(c, a, b)
    assert r.is_contiguous()
    r[0, 0] = 100.0  # writable, and not the input's storage
    assert c[0, 0].item() != 100.0
