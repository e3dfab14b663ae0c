"""kiln-cpu's gradient-scaling kernel (``_amp_non_finite_check_and_unscale_``, kiln-amp's GradScaler): one
Numba pass that unscales and finds infs and NaNs, bit for bit the reference's; half dtypes and
non-dense gradients go to the reference. The conformance kit compares it on its sample cases too."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.backend as kb
from kiln import _plugins

UNSCALE = kb.op("_amp_non_finite_check_and_unscale_")
REFERENCE = kb.reference_kernel("_amp_non_finite_check_and_unscale_")


def _both(values: np.ndarray, dtype, inv: float = 0.125, layout=lambda t: t):
    """(kiln-cpu's gradient and flag, the reference's) after one call on the same values."""
    out = []
    for run in (lambda g, f, i: UNSCALE(g, f, i), lambda g, f, i: REFERENCE(None, g, f, i)):
        g = layout(kiln.tensor(values, dtype=dtype))
        f, i = kiln.zeros(()), kiln.full((), inv)
        assert run(g, f, i) is g
        out.append((g.numpy().copy(), f.item()))
    return out


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_the_numba_kernel_serves_float32_and_float64(dtype):
    assert _plugins.kernel_owner("_amp_non_finite_check_and_unscale_", "cpu", dtype) == "cpu"
    assert (
        _plugins.kernel_owner("_amp_non_finite_check_and_unscale_", "cpu", kiln.bfloat16) == _plugins.REFERENCE_PLUGIN
    )


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.bfloat16])
@pytest.mark.parametrize("bad", [None, "inf", "-inf", "nan"])
@pytest.mark.parametrize("where", [0, 4096, -1])
def test_matches_the_reference_bit_for_bit(dtype, bad, where):
    values = np.random.default_rng(1).standard_normal(10_001) * 1e4
    if bad is not None:
        values[where] = float(bad)
    (ours, our_flag), (ref, ref_flag) = _both(values, dtype)
    assert our_flag == ref_flag == (0.0 if bad is None else 1.0)
    np.testing.assert_array_equal(ours.view(np.uint8), ref.view(np.uint8))


TRANSPOSED, EVERY_OTHER_COLUMN = (lambda t: t.t()), (lambda t: t[:, ::2])


@pytest.mark.parametrize(
    ("nan_column", "layout", "flag"), [(7, TRANSPOSED, 1.0), (8, EVERY_OTHER_COLUMN, 1.0), (7, EVERY_OTHER_COLUMN, 0.0)]
)
def test_transposed_and_strided_gradients(nan_column, layout, flag):
    values = np.random.default_rng(2).standard_normal((64, 33))
    values[3, nan_column] = np.nan
    (ours, our_flag), (ref, ref_flag) = _both(values, kiln.float32, layout=layout)
    assert our_flag == ref_flag == flag  # a NaN outside the strided view is not the gradient's
    np.testing.assert_array_equal(ours, ref)


def test_a_flag_already_set_stays_set():
    f = kiln.ones(())
    UNSCALE(kiln.ones(100), f, kiln.full((), 0.5))
    assert f.item() == 1.0
