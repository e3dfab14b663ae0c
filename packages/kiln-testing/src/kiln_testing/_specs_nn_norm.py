"""Conformance specs of the nn primitives: softmax family, normalization, embedding and dropout (merged into ``_specs.SPECS``).

Dropout and the other compositions (``softmin``, ``instance_norm``, ``rms_norm``, ``normalize``) are built
from ops and need no spec of their own; the fused ops below do.
"""

from __future__ import annotations

import numpy as np

import kiln
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


SPECS: dict[str, OpSpec] = {
    "_softmax": explicit(_softmax),
    "_log_softmax": explicit(_softmax),
    "_native_batch_norm": explicit(_native_batch_norm, rtol=1e-4, atol=1e-5),
    "_native_layer_norm": explicit(_native_layer_norm, rtol=1e-4, atol=1e-5),
    "_native_group_norm": explicit(_native_group_norm, rtol=1e-4, atol=1e-5),
    "_embedding": explicit(_embedding),
    "_embedding_bag": explicit(_embedding_bag),
}
