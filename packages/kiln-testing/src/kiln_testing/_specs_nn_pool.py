"""Conformance specs of the nn primitives: pooling, interpolation and padding (merged into ``_specs.SPECS``).

The public functions (``max_pool2d``, ``avg_pool2d``, ``interpolate``, ``pad``...) normalise their
arguments and call the ops below; pixel (un)shuffle are view compositions and need no spec.
"""

from __future__ import annotations

import numpy as np

from kiln_testing._specs import Case, Ctx, OpSpec, _ix, explicit


def _max_pool(c: Ctx) -> list[Case]:
    return [
        Case("2d", (c.t((2, 3, 6, 5)), (2, 2), (2, 2), (0, 0), (1, 1), False)),
        Case("2d-pad-ceil-transposed", (c.t((2, 3, 6, 5), layout="transposed"), (3, 2), (2, 1), (1, 1), (1, 1), True)),
        Case("2d-dilated-strided", (c.t((1, 2, 7, 6), layout="strided"), (2, 2), (1, 2), (1, 0), (2, 1), False)),
        Case("1d-unbatched", (c.t((3, 8)), (3,), (2,), (1,), (1,), True)),
        Case("3d", (c.t((1, 2, 4, 4, 5)), (2, 2, 2), (2, 2, 2), (0, 1, 0), (1, 1, 1), False)),
        Case("empty-batch", (c.t((0, 2, 4, 4)), (2, 2), (2, 2), (0, 0), (1, 1), False)),
        Case("bad-pad", (c.t((1, 2, 4, 4)), (2, 2), (2, 2), (2, 2), (1, 1), False)),
    ]


def _adaptive_max_pool(c: Ctx) -> list[Case]:
    return [
        Case("2d", (c.t((2, 3, 7, 5)), (3, 2))),
        Case("2d-up-transposed", (c.t((2, 2, 3, 4), layout="transposed"), (5, 6))),
        Case("1d-strided", (c.t((2, 3, 9), layout="strided"), (4,))),
        Case("unbatched", (c.t((3, 6, 6)), (4, 4))),
        Case("empty-batch", (c.t((0, 2, 4, 4)), (2, 2))),
        Case("bad-rank", (c.t((4, 4)), (2, 2))),
    ]


def _argmax_scatter(c: Ctx) -> list[Case]:
    return [
        Case("planes", (c.t((2, 3, 4)), _ix([[[0, 5, 2, 7]] * 3] * 2), 9)),
        Case("duplicates-transposed", (c.t((3, 4), layout="transposed"), _ix([[1, 1, 0, 1]] * 3), 2)),
        Case("strided", (c.t((2, 3), layout="strided"), _ix([[4, 0, 4], [2, 2, 2]]), 5)),
        Case("empty-planes", (c.t((0, 3)), _ix(np.zeros((0, 3))), 4)),
    ]


def _avg(k, s, p, ceil=False, count=True, div=None) -> tuple:
    return (k, s, p, ceil, count, div)


def _separable(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("avg2d", (x((2, 3, 6, 5)), "avg_pool", _avg((2, 2), (2, 2), (0, 0)))),
        Case("avg2d-pad-ceil", (x((2, 3, 7, 6), layout="transposed"), "avg_pool", _avg((3, 3), (2, 2), (1, 1), True))),
        Case("avg2d-nocount", (x((1, 2, 7, 6)), "avg_pool", _avg((3, 2), (2, 1), (1, 1), True, False))),
        Case("avg2d-divisor", (x((1, 2, 6, 6), layout="strided"), "avg_pool", _avg((3, 3), (2, 2), (1, 1), div=4))),
        Case("avg1d-unbatched", (x((3, 8)), "avg_pool", _avg((3,), (2,), (1,)))),
        Case("avg2d-empty-batch", (x((0, 2, 4, 4)), "avg_pool", _avg((2, 2), (2, 2), (0, 0)))),
        Case("adaptive-avg2d", (x((2, 3, 7, 5)), "adaptive_avg_pool", ((3, 4),))),
        Case("adaptive-avg1d", (x((2, 3, 5), layout="transposed"), "adaptive_avg_pool", ((7,),))),
        Case("nearest2d", (x((2, 3, 4, 5)), "upsample_nearest", ((7, 3), (None, None)))),
        Case("nearest1d-scale", (x((2, 3, 5), layout="strided"), "upsample_nearest", ((8,), (1.7,)))),
        Case("nearest-exact2d", (x((1, 2, 5, 6)), "upsample_nearest_exact", ((3, 10), (None, None)))),
        Case("bilinear", (x((2, 3, 4, 5)), "upsample_linear", ((7, 3), False, (None, None)))),
        Case("bilinear-align", (x((1, 2, 4, 5), layout="transposed"), "upsample_linear", ((6, 9), True, (None, None)))),
        Case("bilinear-aa", (x((1, 2, 9, 7)), "upsample_bilinear_aa", ((3, 4), False, (None, None)))),
        Case("bicubic", (x((1, 2, 4, 5)), "upsample_bicubic", ((7, 3), False, (None, None)))),
        Case("trilinear", (x((1, 2, 3, 4, 3)), "upsample_linear", ((5, 2, 4), True, (None, None, None)))),
        Case("nearest3d", (x((1, 2, 3, 4, 3), layout="strided"), "upsample_nearest", ((5, 2, 4), (None, None, None)))),
        Case("linear-scale", (x((2, 3, 5)), "upsample_linear", ((12,), False, (2.5,)))),
        Case("reflect2d", (x((2, 3, 4, 5)), "reflection_pad", ((1, 2, 3, 0),))),
        Case("reflect1d-unbatched", (x((3, 5), layout="transposed"), "reflection_pad", ((3, 1),))),
        Case("replicate2d", (x((2, 3, 4, 5), layout="strided"), "replication_pad", ((1, 2, 5, 0),))),
        Case("replicate3d", (x((1, 2, 3, 4, 3)), "replication_pad", ((1, 2, 2, 1, 3, 0),))),
        Case("circular2d", (x((2, 3, 4, 5)), "circular_pad", ((1, 2, 4, 0),))),
        Case("circular-crop", (x((2, 3, 4, 5)), "circular_pad", ((-1, 2, 1, -2),))),
        Case("bad-reflect", (x((1, 1, 3, 3)), "reflection_pad", ((3, 3, 1, 1),))),
    ]


def _separable_backward(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("avg2d", (x((2, 3, 3, 2)), (2, 3, 6, 5), "avg_pool", _avg((2, 2), (2, 2), (0, 0)))),
        Case(
            "avg2d-pad-ceil",
            (x((2, 3, 4, 4), layout="transposed"), (2, 3, 7, 6), "avg_pool", _avg((3, 3), (2, 2), (1, 1), True)),
        ),
        Case("adaptive-avg2d", (x((2, 3, 3, 4), layout="strided"), (2, 3, 7, 5), "adaptive_avg_pool", ((3, 4),))),
        Case("nearest2d", (x((2, 3, 7, 3)), (2, 3, 4, 5), "upsample_nearest", ((7, 3), (None, None)))),
        Case("bilinear", (x((2, 3, 7, 3)), (2, 3, 4, 5), "upsample_linear", ((7, 3), False, (None, None)))),
        Case("reflect2d", (x((2, 3, 7, 8)), (2, 3, 4, 5), "reflection_pad", ((1, 2, 3, 0),))),
        Case("circular-crop", (x((2, 3, 3, 6)), (2, 3, 4, 5), "circular_pad", ((-1, 2, 1, -2),))),
        Case("bad-grad-shape", (x((2, 3, 3, 3)), (2, 3, 6, 5), "avg_pool", _avg((2, 2), (2, 2), (0, 0)))),
    ]


def _constant_pad_nd(c: Ctx) -> list[Case]:
    return [
        Case("last", (c.t((2, 3, 4)), (1, 2))),
        Case("value-transposed", (c.t((3, 4), layout="transposed"), (1, 0, 2, 1), 1)),
        Case("crop-strided", (c.t((2, 3, 4), layout="strided"), (-1, 2, 1, -1))),
        Case("all-dims-expanded", (c.t((2, 3, 4), layout="expanded"), (1, 0, 0, 1, 2, 1))),
        Case("0-d-no-pad", (c.t(()), ())),
        Case("empty", (c.t((0, 3)), (1, 1))),
        Case("too-much-crop", (c.t((2, 3)), (-2, -2))),
    ]


SPECS: dict[str, OpSpec] = {
    "_max_pool": explicit(_max_pool),
    "_adaptive_max_pool": explicit(_adaptive_max_pool),
    "_argmax_scatter": explicit(_argmax_scatter),
    "_separable": explicit(_separable),
    "_separable_backward": explicit(_separable_backward),
    "constant_pad_nd": explicit(_constant_pad_nd),
}
