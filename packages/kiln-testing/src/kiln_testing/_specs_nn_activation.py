"""Conformance specs of the nn primitives: activation functions, attention and distances (merged into ``_specs.SPECS``)."""

from __future__ import annotations

import numpy as np

import kiln
from kiln_testing._specs import Case, Ctx, OpSpec, T, explicit, unary


def _int64(values) -> T:
    a = np.asarray(values, dtype=np.int64)
    return T(base=a, dtype=kiln.int64, shape=a.shape, grad=False)


def _prelu(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("per-channel", (x((2, 3, 4)), x((3,), low=0.05, high=0.5))),
        Case("shared", (x((2, 3), layout="transposed"), x((1,), low=0.05, high=0.5))),
        Case("0-d-weight", (x((2, 3, 2), layout="strided"), x((), low=0.05, high=0.5))),
        Case("1-d-input", (x((5,)), x((1,)))),
        Case("0-d-input", (x(()), x((1,)))),
        Case("empty", (x((0, 3)), x((3,)))),
        Case("channel-mismatch", (x((2, 3)), x((4,)))),
    ]


def _rrelu_with_noise(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("eval", (x((3, 4)), None, 0.1, 0.3, False)),
        Case("eval-strided", (x((2, 3, 4), layout="strided"), None)),
        Case("training", (x((3, 4)), x((3, 4), low=0.1, high=0.3, grad=False), 0.1, 0.3, True)),
        Case(
            "training-transposed",
            (x((3, 4), layout="transposed"), x((3, 4), low=0.1, high=0.3, grad=False)),
            {"training": True},
        ),
        Case("0-d", (x(()), None)),
        Case("empty", (x((0, 3)), None)),
        Case("bad-bounds", (x((3,)), None, 0.5, 0.1, False)),
    ]


def _glu(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("last", (x((3, 4)),)),
        Case("dim0-transposed", (x((4, 3), layout="transposed"), 0)),
        Case("strided", (x((2, 6, 2), layout="strided"), 1)),
        Case("empty", (x((0, 4)), 1)),
        Case("odd", (x((2, 3)),)),
        Case("0-d", (x(()),)),
    ]


def _one_hot(c: Ctx) -> list[Case]:
    return [
        Case("inferred", (_int64([0, 2, 1]),)),
        Case("given", (_int64([[0, 3], [1, 1]]), 5)),
        Case("0-d", (_int64(2),)),
        Case("empty", (_int64(np.zeros((0,))), 3)),
        Case("too-large", (_int64([0, 4]), 3)),
        Case("negative", (_int64([0, -1]),)),
    ]


SPECS: dict[str, OpSpec] = {
    "gelu": unary(variants=({}, {"approximate": "tanh"})),
    "elu": unary(variants=({}, {"alpha": 0.5}, {"alpha": 1.6732632423543772, "scale": 1.0507009873554805})),
    "celu": unary(variants=({}, {"alpha": 2.0})),
    "leaky_relu": unary(variants=({}, {"negative_slope": 0.2})),
    "hardtanh": unary(variants=({}, {"min_val": 0.0, "max_val": 6.0})),
    "hardswish": unary(-5.0, 5.0),
    "hardsigmoid": unary(-5.0, 5.0),
    "softplus": unary(variants=({}, {"beta": 2.0, "threshold": 3.0})),
    "softshrink": unary(variants=({}, {"lambd": 1.0})),
    "hardshrink": unary(variants=({}, {"lambd": 1.0})),
    "threshold": unary(variants=({"threshold": 0.5, "value": -1.0},)),
    "prelu": explicit(_prelu),
    "rrelu_with_noise": explicit(_rrelu_with_noise),
    "glu": explicit(_glu),
    "one_hot": explicit(_one_hot),
}
