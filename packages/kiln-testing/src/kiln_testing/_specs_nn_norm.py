"""Conformance specs of the nn primitives: softmax family, normalization, embedding and dropout (merged into ``_specs.SPECS``).

Dropout and the other compositions (``softmin``, ``instance_norm``, ``rms_norm``, ``normalize``) are built
from ops and need no spec of their own; the fused ops below do, their fused backward ops
(``_softmax_backward_data``, ``_log_softmax_backward_data``, ``_native_norm_backward``) and batch norm's
statistics (``_batch_norm_stats``) included.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.backend import batch_norm_layout as _channel_layout
from kiln.backend import group_norm_layout as _group_layout
from kiln.backend import layer_norm_layout as _layer_layout
from kiln_testing._specs import Case, Ctx, OpSpec, T, explicit


def _softmax(c: Ctx) -> list[Case]:
    specials = [Case("specials", (c.specials(), 0), grad=False)] if c.dtype.is_floating_point else []
    return specials + [
        Case("dim1", (c.t((3, 4)), 1)),
        Case("dim0-transposed", (c.t((3, 4), layout="transposed"), 0)),
        Case("last-strided", (c.t((2, 3, 4), layout="strided"), -1)),
        Case("middle-expanded", (c.t((2, 3, 4), layout="expanded"), 1)),
        Case("0-d", (c.t(()), 0)),
        Case("empty-batch", (c.t((0, 3)), 1)),
        Case("empty-dim", (c.t((3, 0)), 1)),
        Case("bad-dim", (c.t((3, 4)), 2)),
    ]


def _param(c: Ctx, n: int) -> T:
    return c.t((n,), low=-1.0, high=1.0)


def _native_batch_norm(c: Ctx) -> list[Case]:
    rm, rv = c.t((3,), grad=False), c.t((3,), low=0.5, high=2.0, grad=False)
    return [
        Case("train-2d", (c.t((4, 3)), _param(c, 3), _param(c, 3), None, None, True, 1e-5)),
        Case("train-3d-transposed", (c.t((4, 3, 5), layout="transposed"), None, None, None, None, True, 1e-5)),
        Case("train-4d-strided", (c.t((2, 3, 2, 3), layout="strided"), _param(c, 3), None, None, None, True, 1e-3)),
        Case("eval-4d", (c.t((2, 3, 2, 2)), _param(c, 3), _param(c, 3), rm, rv, False, 1e-5)),
        Case("eval-expanded", (c.t((4, 3), layout="expanded"), None, None, rm, rv, False, 1e-5)),
        Case("empty-batch", (c.t((0, 3, 2)), _param(c, 3), _param(c, 3), None, None, True, 1e-5)),
        Case("weight-size", (c.t((4, 3)), _param(c, 4), None, None, None, True, 1e-5)),
        Case("eval-without-stats", (c.t((4, 3)), None, None, None, None, False, 1e-5)),
    ]


def _native_layer_norm(c: Ctx) -> list[Case]:
    return [
        Case("last", (c.t((3, 4)), (4,), c.t((4,)), c.t((4,)), 1e-5)),
        Case("two-transposed", (c.t((2, 3, 4), layout="transposed"), (3, 4), None, c.t((3, 4)), 1e-5)),
        Case("strided-no-affine", (c.t((2, 3, 4), layout="strided"), (4,), None, None, 1e-3)),
        Case("expanded", (c.t((3, 4), layout="expanded"), (3, 4), c.t((3, 4)), None, 1e-5)),
        Case("empty-batch", (c.t((0, 4)), (4,), c.t((4,)), c.t((4,)), 1e-5)),
        Case("shape-mismatch", (c.t((3, 4)), (5,), None, None, 1e-5)),
    ]


def _native_group_norm(c: Ctx) -> list[Case]:
    return [
        Case("3d", (c.t((2, 6, 3)), 3, c.t((6,)), c.t((6,)), 1e-5)),
        Case("4d-transposed", (c.t((2, 4, 2, 3), layout="transposed"), 2, None, c.t((4,)), 1e-5)),
        Case("strided-one-group", (c.t((2, 4, 3), layout="strided"), 1, c.t((4,)), None, 1e-3)),
        Case("2d", (c.t((3, 4)), 2, None, None, 1e-5)),
        Case("empty-batch", (c.t((0, 4, 2)), 2, c.t((4,)), c.t((4,)), 1e-5)),
        Case("indivisible", (c.t((2, 6, 3)), 4, None, None, 1e-5)),
    ]


def _softmax_backward(c: Ctx) -> list[Case]:
    """(grad_output, output, dim): the output's values need not come from a softmax."""
    out = {"low": 0.0, "high": 1.0}
    specials = [Case("specials", (c.t((10,)), c.specials(), 0), grad=False)] if c.dtype.is_floating_point else []
    return specials + [
        Case("dim1", (c.t((3, 4)), c.t((3, 4), **out), 1)),
        Case("dim0-transposed", (c.t((3, 4), layout="transposed"), c.t((3, 4), **out), 0)),
        Case("last-strided", (c.t((2, 3, 4)), c.t((2, 3, 4), layout="strided", **out), -1)),
        Case("middle-expanded-grad", (c.t((2, 3, 4), layout="expanded"), c.t((2, 3, 4), **out), 1)),
        Case("0-d", (c.t(()), c.t((), **out), 0)),
        Case("empty-batch", (c.t((0, 3)), c.t((0, 3), **out), 1)),
        Case("shape-mismatch", (c.t((3, 4)), c.t((4, 3), **out), 1)),
        Case("bad-dim", (c.t((3, 4)), c.t((3, 4), **out), 2)),
    ]


def _batch_norm_stats(c: Ctx) -> list[Case]:
    constant = T(base=np.full((3, 2, 4), 1.5, c.dtype.numpy), dtype=c.dtype, shape=(3, 2, 4), grad=False)
    return [
        Case("3d", (c.t((4, 3, 5)),)),
        Case("2d-transposed", (c.t((6, 3), layout="transposed"),)),
        Case("4d-strided", (c.t((2, 3, 2, 3), layout="strided"),)),
        Case("constant-channels", (constant,)),
        Case("one-channel", (c.t((4, 1, 3)),)),
        Case("empty-batch", (c.t((0, 3, 2)),)),
        Case("no-channel-dim", (c.t((4,)),)),
    ]


def _native_norm_backward(c: Ctx) -> list[Case]:
    """(grad, input, weight, mean, var, eps, layout, output_mask) for batch (training and eval), layer
    and group norm layouts."""
    all3 = (True, True, True)

    def stats(n):
        return c.t((n,), grad=False), c.t((n,), low=0.5, high=2.0, grad=False)

    bn3, bn4, ln, gn = (4, 3, 5), (2, 3, 2, 3), (2, 3, 4), (2, 6, 3)
    return [
        Case("batch-train", (c.t(bn3), c.t(bn3), _param(c, 3), None, None, 1e-5, _channel_layout(bn3), all3)),
        Case(
            "batch-train-strided-no-weight",
            (c.t(bn4), c.t(bn4, layout="strided"), None, None, None, 1e-3, _channel_layout(bn4), (True, False, True)),
        ),
        Case("batch-eval", (c.t(bn4), c.t(bn4), _param(c, 3), *stats(3), 1e-5, _channel_layout(bn4), all3)),
        Case(
            "batch-eval-2d-transposed",
            (c.t((4, 3), layout="transposed"), c.t((4, 3)), None, *stats(3), 1e-5, _channel_layout((4, 3)), all3),
        ),
        Case("layer", (c.t(ln), c.t(ln), c.t((4,)), None, None, 1e-5, _layer_layout(ln, (4,)), all3)),
        Case(
            "layer-two-dims-transposed",
            (c.t(ln), c.t(ln, layout="transposed"), c.t((3, 4)), None, None, 1e-5, _layer_layout(ln, (3, 4)), all3),
        ),
        Case(
            "layer-params-only",
            (c.t(ln), c.t(ln), c.t((4,)), None, None, 1e-5, _layer_layout(ln, (4,)), (False, True, True)),
        ),
        Case("group", (c.t(gn), c.t(gn), c.t((6,)), None, None, 1e-5, _group_layout(gn, 3), all3)),
        Case(
            "group-expanded-grad-input-only",
            (
                c.t(gn, layout="expanded"),
                c.t(gn),
                c.t((6,)),
                None,
                None,
                1e-5,
                _group_layout(gn, 2),
                (True, False, False),
            ),
        ),
        Case(
            "empty-batch",
            (c.t((0, 3, 2)), c.t((0, 3, 2)), _param(c, 3), None, None, 1e-5, _channel_layout((0, 3, 2)), all3),
        ),
        Case("shape-mismatch", (c.t((4, 3)), c.t((3, 4)), None, None, None, 1e-5, _channel_layout((3, 4)), all3)),
    ]


def _ix(values, dtype=None) -> T:
    a = np.asarray(values, dtype=np.int64)
    return T(base=a, dtype=dtype or kiln.int64, shape=a.shape, grad=False)


def _embedding(c: Ctx) -> list[Case]:
    return [
        Case("2d-indices", (c.t((5, 3)), _ix([[0, 4, 2], [2, 2, 1]]))),
        Case("int32-transposed", (c.t((5, 3), layout="transposed"), _ix([3, 0, 3], kiln.int32))),
        Case("padding", (c.t((5, 3), layout="strided"), _ix([1, 2, 1]), 1)),
        Case("scale-grad-by-freq", (c.t((4, 2)), _ix([[1, 1], [3, 0]]), -1, True)),
        Case("0-d-index", (c.t((4, 2)), _ix(3))),
        Case("empty-indices", (c.t((4, 2)), _ix(np.zeros((0, 2))))),
        Case("out-of-range", (c.t((4, 2)), _ix([0, 4]))),
    ]


def _embedding_bag(c: Ctx) -> list[Case]:
    idx = _ix([0, 2, 4, 1, 1, 3])
    offsets = _ix([0, 2, 2, 5])
    psw = c.t((6,))
    return [
        Case("mean", (c.t((5, 3)), idx, offsets, "mean", None, False, -1, False)),
        Case("sum-weights-transposed", (c.t((5, 3), layout="transposed"), idx, offsets, "sum", psw, False, -1, False)),
        Case("max-strided", (c.t((5, 3), layout="strided"), idx, offsets, "max", None, False, -1, False)),
        Case("last-offset-padding", (c.t((5, 3)), idx, _ix([0, 2, 6], kiln.int32), "mean", None, True, 1, False)),
        Case("scale-grad-by-freq", (c.t((5, 3)), idx, offsets, "sum", None, False, -1, True)),
        Case("empty", (c.t((5, 3)), _ix(np.zeros(0)), _ix([0, 0]), "sum", None, False, -1, False)),
        Case("bad-mode", (c.t((5, 3)), idx, offsets, "min", None, False, -1, False)),
    ]


def _fused_dropout(c: Ctx) -> list[Case]:
    def u(shape, **k):
        return c.t(shape, dtype=kiln.float64, low=0.0, high=1.0, grad=False, **k)

    return [
        Case("p0.3", (c.t((4, 5)), u((4, 5)), 0.3)),
        Case("transposed", (c.t((4, 5), layout="transposed"), u((4, 5)), 0.5)),
        Case("strided-uniform", (c.t((3, 4)), u((3, 4), layout="strided"), 0.25)),
        Case("0-d", (c.t(()), u(()), 0.5)),
        Case("empty", (c.t((0, 3)), u((0, 3)), 0.5)),
        Case("shape-mismatch", (c.t((2, 3)), u((3, 2)), 0.5)),
    ]


SPECS: dict[str, OpSpec] = {
    "_fused_dropout": explicit(_fused_dropout),
    "_softmax": explicit(_softmax),
    "_log_softmax": explicit(_softmax),
    "_softmax_backward_data": explicit(_softmax_backward),
    "_log_softmax_backward_data": explicit(_softmax_backward),
    "_native_norm_backward": explicit(_native_norm_backward, rtol=1e-4, atol=1e-5),
    "_native_batch_norm": explicit(_native_batch_norm, rtol=1e-4, atol=1e-5),
    "_batch_norm_stats": explicit(_batch_norm_stats, rtol=1e-4, atol=1e-5),
    "_native_layer_norm": explicit(_native_layer_norm, rtol=1e-4, atol=1e-5),
    "_native_group_norm": explicit(_native_group_norm, rtol=1e-4, atol=1e-5),
    "_embedding": explicit(_embedding),
    "_embedding_bag": explicit(_embedding_bag),
}
