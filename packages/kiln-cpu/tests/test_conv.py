"""2-d convolutions against the reference kernel: the forward (strides, padding, dilation, bias, groups,
1x1 and large kernels), the transposed convolution (the input's gradient: stride, padding,
output_padding, dilation, bias, groups), the weight-gradient form (weight larger than the output), the
whole backward of conv2d through kiln.autograd, non-contiguous, expanded and empty inputs, both ways of
running the blocks (on the pool with single-threaded BLAS, or in order on the calling thread), blocks of
rows and of whole images, the direct loops of small groups (depthwise), and what goes to the reference
(1-d, 3-d, float16, mixed dtypes, small sizes)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, reference

import kiln
from kiln._ops import nn_conv
from kiln_cpu import _blas, _jit_conv, _threads, config, kernels_conv

FLOAT = [kiln.float32, kiln.float64]


@pytest.fixture
def conv_spy(monkeypatch):
    """A list receiving the name of every Numba loop the convolution kernels call, and the paths taken."""
    calls: list[str] = []
    loops = (
        "conv_blocks",
        "conv_transpose_blocks",
        "conv_by_weight_blocks",
        "conv_direct_2d",
        "conv_transpose_direct_2d",
    )
    for name in loops:
        real = getattr(_jit_conv, name)
        monkeypatch.setattr(_jit_conv, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    real_by_weight = kernels_conv._conv_by_weight
    monkeypatch.setattr(kernels_conv, "_conv_by_weight", lambda *a: calls.append("by_weight") or real_by_weight(*a))
    return calls


@pytest.fixture(params=["pool", "serial", "deep", "apart", "flip", "apart-flip"])
def blocks(request, monkeypatch):
    """Run the blocks on the pool (two threads, single-threaded BLAS) or on the calling thread (one
    thread), with small blocks: rows of an image, several images; "deep": products of many images, the
    weight-gradient form's rows split instead. The images of a block share one product, copied side by
    side, except with "apart": one product per image, in place; "flip": the weight-gradient form's
    output gradient copied transposed (else read transposed)."""
    mode = request.param
    monkeypatch.setattr(_threads, "get_num_threads", lambda: 1 if mode == "serial" else 2)
    monkeypatch.setattr(kernels_conv, "_BLOCK_BYTES", 4096)
    monkeypatch.setattr(kernels_conv, "_MIN_DEPTH", 8 if mode in ("pool", "serial") else 512)
    apart = 1 if mode.startswith("apart") else 1 << 30
    monkeypatch.setattr(kernels_conv, "_APART_WIDTH", apart)
    monkeypatch.setattr(kernels_conv, "_APART_DEPTH", apart)
    monkeypatch.setattr(kernels_conv, "_FLIP_ROWS", 0)
    monkeypatch.setattr(kernels_conv, "_FLIP_MACS", 1 << 60 if mode.endswith("flip") else -1)
    if _blas.gemm_function(np.float32) is None:
        pytest.skip("NumPy's BLAS has no openblas_set_num_threads_local")
    return request.param


def _rand(shape, dtype, seed):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype.numpy))


def _tol(dtype):
    """Products summed in another order than the reference's (BLAS blocks its own way)."""
    return {"ulps": 64, "atol": 1e-5} if dtype is kiln.float32 else {"ulps": 64, "atol": 1e-12}


CASES = {
    # input shape, weight shape, stride, padding, dilation, groups
    "plain": ((2, 3, 9, 11), (4, 3, 3, 3), 1, 0, 1, 1),
    "pad": ((2, 3, 9, 11), (4, 3, 3, 3), 1, 1, 1, 1),
    "stride-pad-rect": ((1, 2, 10, 7), (5, 2, 3, 2), (2, 3), (1, 2), 1, 1),
    "dilated": ((2, 4, 12, 12), (3, 4, 3, 3), 1, 2, 2, 1),
    "1x1": ((3, 5, 6, 6), (7, 5, 1, 1), 1, 0, 1, 1),
    "wide-pad": ((1, 1, 5, 5), (2, 1, 5, 5), 2, 3, 1, 1),  # padding wider than the kernel reaches
    "stride-dilation": ((2, 2, 5, 7), (2, 2, 3, 3), 3, 0, (1, 2), 1),
    "groups": ((2, 6, 8, 9), (12, 2, 3, 3), 1, 1, 1, 3),
    "groups-many-pixels": ((2, 4, 20, 20), (8, 2, 3, 3), 1, 1, 1, 2),  # row blocks of one image
}


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_conv2d_matches_reference(dtype, case, with_bias, conv_spy):
    xs, ws, stride, padding, dilation, groups = CASES[case]
    x, w = _rand(xs, dtype, 1), _rand(ws, dtype, 2)
    b = _rand((ws[0],), dtype, 3) if with_bias else None
    fn = lambda t: F.conv2d(t, w, b, stride, padding, dilation, groups)
    assert_same(fn(x), reference(fn, x), **_tol(dtype))
    forward = "conv_blocks" in conv_spy or "conv_by_weight_blocks" in conv_spy  # "wide-pad": the second form
    assert forward and "conv_transpose_blocks" not in conv_spy


NONCONTIGUOUS = {
    "transposed": lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),
    "channels-last": lambda x: x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
    "strided": lambda x: kiln.cat([x, x], 3)[:, :, :, ::2],
    "batch-permuted": lambda x: x.transpose(0, 1).contiguous().transpose(0, 1),
    "expanded": lambda x: x[:1].expand(3, *x.shape[1:]),
}


@pytest.mark.parametrize("layout", NONCONTIGUOUS)
def test_noncontiguous_input_read_in_place(layout, conv_spy):
    x = NONCONTIGUOUS[layout](_rand((3, 4, 7, 9), kiln.float32, 1))
    assert not x.is_contiguous()
    w, b = _rand((5, 4, 3, 3), kiln.float32, 2), _rand((5,), kiln.float32, 3)
    fn = lambda t: F.conv2d(t, w, b, 2, 1)
    assert_same(fn(x), reference(fn, x), **_tol(kiln.float32))
    fnt = lambda t: F.conv_transpose2d(t, w.transpose(0, 1), b, 2, 1, 1)
    assert_same(fnt(x), reference(fnt, x), **_tol(kiln.float32))
    assert "conv_blocks" in conv_spy and "conv_transpose_blocks" in conv_spy


TRANSPOSED = {
    # input shape, weight shape (Cin, Cout/groups, kh, kw), stride, padding, output_padding, dilation, groups
    "plain": ((2, 3, 5, 6), (3, 4, 3, 3), 1, 0, 0, 1, 1),
    "stride-out-pad": ((2, 3, 5, 6), (3, 2, 3, 3), 2, 1, 1, 1, 1),
    "rect": ((1, 4, 4, 7), (4, 3, 2, 3), (3, 2), (0, 2), (2, 0), 1, 1),
    "dilated": ((2, 2, 6, 5), (2, 3, 3, 2), 1, 2, 0, (2, 3), 1),
    "dilated-out-pad": ((1, 2, 4, 4), (2, 2, 3, 3), 1, 0, 1, 2, 1),
    "groups": ((2, 6, 5, 5), (6, 3, 3, 3), 2, 1, 1, 1, 2),
}


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", TRANSPOSED)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_conv_transpose2d_matches_reference(dtype, case, with_bias, conv_spy):
    xs, ws, stride, padding, out_pad, dilation, groups = TRANSPOSED[case]
    x, w = _rand(xs, dtype, 1), _rand(ws, dtype, 2)
    b = _rand((ws[1] * groups,), dtype, 3) if with_bias else None
    fn = lambda t: F.conv_transpose2d(t, w, b, stride, padding, out_pad, groups, dilation)
    assert_same(fn(x), reference(fn, x), **_tol(dtype))
    assert conv_spy and set(conv_spy) == {"conv_transpose_blocks"}


DIRECT = {
    # input shape, weight shape, stride, padding, dilation, groups: per group fewer than 64 multiply-adds
    "depthwise": ((2, 4, 9, 11), (4, 1, 3, 3), 1, 1, 1, 4),
    "depthwise-multiplier": ((2, 3, 8, 8), (6, 1, 3, 3), 2, 1, 1, 3),
    "small-groups": ((2, 6, 10, 7), (12, 2, 3, 2), (2, 3), (1, 2), (1, 2), 3),
}


@pytest.mark.parametrize("case", DIRECT)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_small_groups_run_the_direct_loops(dtype, case, conv_spy):
    xs, ws, stride, padding, dilation, groups = DIRECT[case]
    x, w, b = _rand(xs, dtype, 1), _rand(ws, dtype, 2), _rand((ws[0],), dtype, 3)
    fn = lambda t: F.conv2d(t, w, b, stride, padding, dilation, groups)
    for t in (x, NONCONTIGUOUS["transposed"](x)):
        assert_same(fn(t), reference(fn, t), **_tol(dtype))
    wt, bt = _rand((xs[1], ws[1], *ws[2:]), dtype, 4), _rand((ws[1] * groups,), dtype, 5)
    fnt = lambda t: F.conv_transpose2d(t, wt, bt, stride, padding, 0, groups, dilation)
    for t in (x, NONCONTIGUOUS["transposed"](x)):
        assert_same(fnt(t), reference(fnt, t), **_tol(dtype))
    assert set(conv_spy) == {"conv_direct_2d", "conv_transpose_direct_2d"}


WEIGHT_GRAD = {
    # input shape, weight shape, stride, padding, dilation, groups
    "plain": ((3, 4, 9, 9), (5, 4, 3, 3), 1, 1, 1, 1),
    "stride-uneven": ((2, 3, 10, 9), (4, 3, 3, 2), 2, 1, 1, 1),  # the result is narrowed to the weight
    "dilated": ((2, 2, 11, 10), (3, 2, 3, 3), (1, 2), (2, 0), (2, 1), 1),
    "groups": ((2, 6, 8, 8), (4, 3, 3, 3), 1, 1, 1, 2),
    "depthwise": ((2, 3, 8, 8), (3, 1, 3, 3), 1, 1, 1, 3),
    "many-pixels": ((2, 2, 16, 16), (3, 2, 3, 3), 1, 1, 1, 1),  # row blocks of the columns' grid
}


@pytest.mark.parametrize("case", WEIGHT_GRAD)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_weight_gradient_form(dtype, case, conv_spy, blocks):
    xs, ws, stride, padding, dilation, groups = WEIGHT_GRAD[case]
    s, p, d, _ = nn_conv._conv_params(_rand(ws, dtype, 0), stride, padding, dilation, 0)
    x = _rand(xs, dtype, 1)
    out_hw = [nn_conv._conv_output_size(xs[2 + i], ws[2 + i], s[i], p[i], d[i], False, 0) for i in range(2)]
    g = _rand((xs[0], ws[0], *out_hw), dtype, 2)
    fn = lambda x, g: nn_conv._weight_grad(x, g, ws, s, p, d, groups)
    assert_same(fn(x, g), reference(fn, x, g), **_tol(dtype))
    assert "by_weight" in conv_spy and "conv_by_weight_blocks" in conv_spy


@pytest.mark.parametrize("b, kk, side, cg, cog", [(1, 9, 28, 64, 16), (3, 25, 32, 8, 64)], ids=["small-cin", "wide"])
def test_weight_gradient_blocks_of_large_images_keep_both_operands_in_the_cache(b, kk, side, cg, cog):
    # a block's product reads its columns (channels*kk rows) and the output's gradient (cog rows) over the
    # same pixels; counting the columns alone made 9x14112x16 products at a quarter of BLAS's speed
    isz = 4
    imgs, chans, rows = kernels_conv._by_weight_plan(b, kk, side, side, cg, cog, isz)
    depth = imgs * rows * side
    assert chans == b and 1 <= imgs <= cg and 1 <= rows <= side and depth >= kernels_conv._MIN_DEPTH
    assert (b * kk + cog) * depth * isz <= kernels_conv._BLOCK_BYTES


def _im2col_numpy(x, kh, kw, ph, pw, dh, dw, y0, rows):
    """The columns im2col_2d writes for output rows [y0, y0 + rows) at unit stride, from a zero-padded copy."""
    n, c, h, w = x.shape
    ow = w + 2 * pw - dw * (kw - 1)
    padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
    padded[:, :, ph : ph + h, pw : pw + w] = x
    cols = np.empty((kh * kw * c, n, rows, ow), x.dtype)  # (rows of the product, images, pixels)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                win = padded[:, ci, y0 + i * dh : y0 + i * dh + rows, j * dw : j * dw + ow]
                cols[(ci * kh + i) * kw + j] = win
    return cols.transpose(1, 0, 2, 3)  # (images, rows of the product, pixels): the (n, c) pairs' order


IM2COL = [
    ((2, 3, 14, 14), 3, 3, 1, 1, 1, 1, 0, 14),  # "same" 3x3: the valid rows copied as one span
    ((2, 2, 6, 6), 3, 3, 1, 1, 1, 1, 2, 3),  # a block of rows inside the image
    ((1, 2, 5, 5), 3, 3, 2, 2, 2, 2, 0, 5),  # dilation 2
    ((1, 1, 1, 1), 5, 5, 2, 2, 1, 1, 0, 1),  # offsets past both ends of a one-pixel row
    ((1, 2, 3, 7), 7, 7, 3, 3, 1, 1, 1, 2),  # padding wider than the image is high
    ((2, 2, 6, 6), 3, 3, 1, 2, 1, 1, 0, 6),  # wider output: the row-by-row loops
]


def _im2col(x, kh, kw, ph, pw, dh, dw, y0, rows, ow):
    """im2col_2d of all of ``x`` at unit stride into a new flat buffer (NaN where it writes nothing)."""
    n, c, h, w = x.shape
    rp = rows * ow
    cols = np.full(c * kh * kw * n * rp, np.nan, x.dtype)
    st = tuple(s // x.itemsize for s in x.strides)
    geom = (kh, kw, 1, 1, ph, pw, dh, dw, y0, rows, ow)
    _jit_conv.im2col_2d(x.reshape(-1), 0, st, c, h, w, cols, (rp, n * rp), *geom, 0, n * c)
    return cols


@pytest.mark.parametrize("shape, kh, kw, ph, pw, dh, dw, y0, rows", IM2COL)
def test_im2col_matches_a_padded_copy(shape, kh, kw, ph, pw, dh, dw, y0, rows):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    n, c = shape[:2]
    want = _im2col_numpy(x, kh, kw, ph, pw, dh, dw, y0, rows)
    cols = _im2col(x, kh, kw, ph, pw, dh, dw, y0, rows, want.shape[-1])
    got = cols.reshape(c * kh * kw, n, -1).transpose(1, 0, 2).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, kh, kw, ph, pw, dh, dw, y0, rows", IM2COL)
def test_col2im_adds_the_columns_inside_the_image_only(shape, kh, kw, ph, pw, dh, dw, y0, rows):
    # col2im is im2col's adjoint: every column adds where im2col read it from, and the columns im2col
    # filled with padding add nothing (here NaN, which must not reach the image)
    n, c, h, w = shape
    ow = w + 2 * pw - dw * (kw - 1)
    inside = _im2col(np.ones(shape, np.float32), kh, kw, ph, pw, dh, dw, y0, rows, ow) == 1
    cols = np.random.default_rng(1).standard_normal(inside.size).astype(np.float32)
    cols[~inside] = np.nan
    padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32)
    by_offset = np.where(inside, cols, 0).reshape(c, kh, kw, n, rows, ow)
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, y0 + i * dh : y0 + i * dh + rows, j * dw : j * dw + ow]
            window += by_offset[:, i, j].transpose(1, 0, 2, 3)
    out = np.zeros(shape, np.float32)
    geom = (kh, kw, 1, 1, ph, pw, dh, dw, y0, rows, ow)
    _jit_conv.col2im_2d(cols, (rows * ow, n * rows * ow), out, *geom, 0, n * c)
    np.testing.assert_allclose(out, padded[:, :, ph : ph + h, pw : pw + w], rtol=1e-6, atol=1e-6)


BACKWARD = {
    # input shape, weight shape, stride, padding, dilation, groups
    "pad": ((2, 3, 8, 9), (4, 3, 3, 3), 1, 1, 1, 1),
    "stride-dilation": ((2, 2, 11, 10), (3, 2, 3, 2), 2, (1, 0), (2, 1), 1),
    "groups": ((2, 4, 7, 7), (8, 2, 3, 3), 1, 1, 1, 2),
    "depthwise": ((2, 3, 7, 6), (3, 1, 3, 3), 1, 1, 1, 3),
}


@pytest.mark.parametrize("case", BACKWARD)
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_conv2d_backward(dtype, case, conv_spy, blocks):
    xs, ws, stride, padding, dilation, groups = BACKWARD[case]
    x, w, b = _rand(xs, dtype, 1), _rand(ws, dtype, 2), _rand((ws[0],), dtype, 3)

    def grads(x, w, b):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        out = F.conv2d(x, w, b, stride, padding, dilation, groups)
        (out * _rand(out.shape, dtype, 4)).sum().backward()
        return x.grad, w.grad, b.grad

    for got, want in zip(grads(x, w, b), reference(grads, x, w, b)):
        assert_same(got, want, **_tol(dtype))
    assert "by_weight" in conv_spy
    if case == "depthwise":
        assert {"conv_direct_2d", "conv_transpose_direct_2d"} <= set(conv_spy)
    else:
        assert {"conv_blocks", "conv_transpose_blocks", "conv_by_weight_blocks"} <= set(conv_spy)


def _grads_of_a_sum(x, w):
    """The gradients of ``conv2d(x, w, padding=1).sum()`` (an expanded output gradient)."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    F.conv2d(x, w, padding=1).sum().backward()
    return x.grad, w.grad


def test_backward_of_a_sum_takes_the_expanded_gradient(conv_spy):
    x, w = _rand((2, 3, 8, 8), kiln.float32, 1), _rand((4, 3, 3, 3), kiln.float32, 2)
    for got, want in zip(_grads_of_a_sum(x, w), reference(_grads_of_a_sum, x, w)):
        assert_same(got, want, **_tol(kiln.float32))
    assert {"conv_blocks", "conv_transpose_blocks", "conv_by_weight_blocks"} <= set(conv_spy)


@pytest.mark.parametrize("form", ["weight-gradient", "forward"])
def test_overlapping_rows_of_the_larger_operand_are_copied_first(form, conv_spy):
    """The weight-gradient form reads the larger operand's rows in place, their stride as a product's
    leading dimension: rows that overlap (as_strided) are copied first (BLAS refuses a leading dimension
    below the product's depth and writes nothing)."""
    storage = _rand((40 * 196 + 16,), kiln.float64, 2)
    if form == "weight-gradient":  # a conv2d's output gradient whose channels overlap
        x = _rand((8, 3, 14, 14), kiln.float64, 1)
        g = storage.as_strided((8, 4, 14, 14), (392, 1, 14, 1))
        fn = lambda x, g: nn_conv._weight_grad(x, g, (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    else:  # a kernel larger than the output, whose output channels overlap
        x = _rand((4, 40, 16, 16), kiln.float64, 1)
        g = storage.as_strided((2, 40, 14, 14), (1, 196, 14, 1))
        fn = lambda x, w: F.conv2d(x, w)
    assert_same(fn(x, g), reference(fn, x, g), **_tol(kiln.float64))
    assert "conv_by_weight_blocks" in conv_spy


@pytest.mark.parametrize("apart", [False, True], ids=["side-by-side", "apart"])
@pytest.mark.parametrize("form", ["forward", "transposed", "weight-gradient"])
def test_blocks_of_several_images_on_the_pool(form, apart, conv_spy, monkeypatch):
    if _blas.functions() is None:
        pytest.skip("NumPy's BLAS has no openblas_set_num_threads_local")
    (setter, getter, lib), set_calls = _blas.functions(), []
    monkeypatch.setattr(_blas, "_found", (lambda n: set_calls.append(n) or setter(n), getter, lib))
    monkeypatch.setattr(_threads, "get_num_threads", lambda: 2)
    monkeypatch.setattr(kernels_conv, "_BLOCK_BYTES", 3 * 27 * 20 * 8)  # 2-3 images of 27-36 rows x 20 pixels
    monkeypatch.setattr(kernels_conv, "_MIN_DEPTH", 16)
    monkeypatch.setattr(kernels_conv, "_APART_WIDTH", 1 if apart else 1 << 30)  # a product per image, or shared
    monkeypatch.setattr(kernels_conv, "_APART_DEPTH", 1 if apart else 1 << 30)
    x, w = _rand((7, 3, 4, 5), kiln.float64, 1), _rand((4, 3, 3, 3), kiln.float64, 2)
    if form == "forward":
        fn = lambda x, w: F.conv2d(x, w, padding=1)
    elif form == "transposed":
        fn = lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1), padding=1)
    else:
        fn = lambda x, g: nn_conv._weight_grad(x, g, (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1)
        w = _rand((7, 4, 4, 5), kiln.float64, 2)  # the output's gradient
    before = setter(3)
    try:
        assert_same(fn(x, w), reference(fn, x, w), **_tol(kiln.float64))
    finally:
        assert setter(before) == 3
    assert conv_spy and set_calls[:2] == [1, 3]  # the blocks ran on the pool, BLAS single-threaded


@pytest.mark.parametrize("callers", [1, 3])
def test_blocks_restore_the_blas_thread_count(callers, monkeypatch):
    """OpenBLAS's count is process-wide: concurrent calls from several threads leave it as it was."""
    if _blas.functions() is None:
        pytest.skip("NumPy's BLAS has no openblas_set_num_threads_local")
    setter = _blas.functions()[0]
    monkeypatch.setattr(_threads, "get_num_threads", lambda: 2)
    monkeypatch.setattr(kernels_conv, "_BLOCK_BYTES", 4096)
    monkeypatch.setattr(kernels_conv, "_MIN_DEPTH", 8)
    x, w = _rand((4, 3, 8, 8), kiln.float32, 1), _rand((4, 3, 3, 3), kiln.float32, 2)
    errors: list[BaseException] = []

    def convolve():
        try:
            for _ in range(5):
                F.conv2d(x, w, padding=1)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    before = setter(3)
    try:
        threads = [threading.Thread(target=convolve) for _ in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        assert setter(before) == 3
    assert not errors


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_nan_and_inf_reach_the_output(dtype, conv_spy):
    x = _rand((1, 2, 6, 6), dtype, 0)
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 0, 0] = float("inf")
    w = _rand((3, 2, 3, 3), dtype, 1)
    fn = lambda t: F.conv2d(t, w, padding=1)
    assert_same(fn(x), reference(fn, x), **_tol(dtype))
    fnt = lambda t: F.conv_transpose2d(t, w.transpose(0, 1), padding=1)
    assert_same(fnt(x), reference(fnt, x), **_tol(dtype))
    assert {"conv_blocks", "conv_transpose_blocks"} <= set(conv_spy)


def test_a_blas_whose_gemm_cannot_be_called_leaves_convolutions_to_the_reference(conv_spy, monkeypatch):
    monkeypatch.setattr(_blas, "_found", None)  # e.g. NumPy on another BLAS: no thread count, no gemm to call
    x, w = _rand((2, 3, 8, 8), kiln.float32, 1), _rand((4, 3, 3, 3), kiln.float32, 2)
    for got, want in zip(_grads_of_a_sum(x, w), reference(_grads_of_a_sum, x, w)):
        assert_same(got, want)
    assert conv_spy == []


def test_empty_batch_goes_to_the_reference(conv_spy):
    x, w = _rand((0, 3, 6, 6), kiln.float32, 0), _rand((4, 3, 3, 3), kiln.float32, 1)
    assert_same(F.conv2d(x, w, padding=1), reference(F.conv2d, x, w, padding=1))
    wt = _rand((3, 2, 3, 3), kiln.float32, 2)
    assert_same(F.conv_transpose2d(x, wt), reference(F.conv_transpose2d, x, wt))
    assert conv_spy == []


HANDED_BACK = {
    "conv1d": lambda: (F.conv1d, _rand((2, 3, 9), kiln.float32, 0), _rand((4, 3, 3), kiln.float32, 1)),
    "conv3d": lambda: (F.conv3d, _rand((1, 2, 4, 4, 4), kiln.float32, 0), _rand((3, 2, 2, 2, 2), kiln.float32, 1)),
    "float16-expanded": lambda: (
        F.conv2d,
        _rand((1, 4, 6, 6), kiln.float16, 0).expand(2, 4, 6, 6),  # half precision widened only when dense
        _rand((3, 4, 3, 3), kiln.float16, 1),
    ),
    "transposed-mixed-bias": lambda: (
        lambda x, w: F.conv_transpose2d(x, w, _rand((2,), kiln.float32, 2)),
        _rand((2, 3, 5, 5), kiln.float64, 0),
        _rand((3, 2, 3, 3), kiln.float64, 1),
    ),
}


@pytest.mark.parametrize("case", HANDED_BACK)
def test_other_convolutions_go_to_the_reference(case, conv_spy):
    fn, x, w = HANDED_BACK[case]()
    assert_same(fn(x, w), reference(fn, x, w))
    assert conv_spy == []


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16], ids=str)
def test_half_precision_through_the_float32_loops(dtype, conv_spy):
    """float16/bfloat16 convolutions, forward (with a bias), transposed, and both gradients through autograd:
    the operands widened to float32, the float32 loops, the results rounded once, as the reference
    computes them; within one half-precision ulp (the float32 sums run in BLAS's order)."""
    x = _rand((2, 4, 9, 9), kiln.float32, 0).to(dtype).requires_grad_()
    w = (_rand((6, 4, 3, 3), kiln.float32, 1) * 0.3).to(dtype).requires_grad_()
    b = _rand((6,), kiln.float32, 2).to(dtype)
    wt = (_rand((4, 3, 3, 3), kiln.float32, 3) * 0.3).to(dtype)
    g = _rand((2, 6, 5, 5), kiln.float32, 4).to(dtype)
    tol = {"ulps": 1, "atol": 1e-2}

    def conv(x, w):
        return F.conv2d(x, w, b, stride=2, padding=1)

    xd, wd = x.detach(), w.detach()
    assert_same(conv(xd, wd), reference(conv, xd, wd), **tol)
    tr = lambda x: F.conv_transpose2d(x, wt, stride=2, padding=1)
    assert_same(tr(xd), reference(tr, xd), **tol)
    grads = lambda x, w: kiln.autograd.grad(conv(x, w), (x, w), g)
    for got, want in zip(grads(x, w), reference(grads, x, w)):
        assert got.dtype == dtype
        assert_same(got, want, ulps=2, atol=2e-2)
    assert {"conv_blocks", "conv_transpose_blocks", "conv_by_weight_blocks"} <= set(conv_spy)


def test_small_sizes_go_to_the_reference(conv_spy, monkeypatch):
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    x, w = _rand((2, 3, 9, 11), kiln.float32, 0), _rand((4, 3, 3, 3), kiln.float32, 1)
    assert_same(F.conv2d(x, w), reference(F.conv2d, x, w))
    assert conv_spy == []
