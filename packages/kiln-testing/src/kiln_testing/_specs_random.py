"""Conformance specs of the samplers (``_normal``, ``_bernoulli``, ``poisson``, ``binomial``: their draws come
from a generator, so a case compares shapes, dtypes and devices, and the errors) and of the sliding-window
view ``_unfold_view`` (``Tensor.unfold``), merged into ``_specs.SPECS``."""

from __future__ import annotations

from kiln_testing._specs import Case, Ctx, explicit


def _normal(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("tensor-tensor", (x((3, 4)), x((3, 4), low=0.5, high=2.0)), values=False),
        Case("broadcast", (x((3, 1)), x((4,), low=0.5, high=2.0)), values=False),
        Case("tensor-float", (x((2, 3), layout="transposed"), 2.0), values=False),
        Case("float-tensor", (1.5, x((2, 3), layout="strided", low=0.0, high=1.0)), values=False),
        Case("0-d", (x(()), 1.0), values=False),
        Case("empty", (x((0, 3)), x((3,), low=0.5, high=1.0)), values=False),
        Case("negative-std", (x((3,)), -1.0), values=False),
        Case("shape-mismatch", (x((2,)), x((3,), low=0.5, high=1.0)), values=False),
    ]


def _bernoulli(c: Ctx) -> list[Case]:
    def p(shape, **k):
        return c.t(shape, low=0.0, high=1.0, **k)

    return [
        Case("probabilities", (p((3, 4)),), values=False),
        Case("probabilities-transposed", (p((3, 4), layout="transposed"),), values=False),
        Case("probabilities-expanded", (p((3, 4), layout="expanded"),), values=False),
        Case("one-p", (c.t((2, 3), layout="strided"), 0.3), values=False),
        Case("0-d", (p(()),), values=False),
        Case("empty", (p((0, 2)),), values=False),
        Case("p-out-of-range", (c.t((3,)), 1.5), values=False),
    ]


def _poisson(c: Ctx) -> list[Case]:
    return [
        Case("rates", (c.t((3, 4), low=0.0, high=5.0),), values=False),
        Case("strided", (c.t((3, 4), layout="strided", low=0.0, high=5.0),), values=False),
        Case("0-d", (c.t((), low=0.0, high=5.0),), values=False),
        Case("empty", (c.t((0, 3), low=0.0, high=5.0),), values=False),
    ]


def _binomial(c: Ctx) -> list[Case]:
    def n(shape, **k):
        return c.t(shape, low=0.0, high=10.0, grad=False, **k)

    def p(shape, **k):
        return c.t(shape, low=0.0, high=1.0, grad=False, **k)

    return [
        Case("counts", (n((3, 4)), p((3, 4))), values=False, grad=False),
        Case("broadcast", (n((3, 1)), p((4,), layout="strided")), values=False, grad=False),
        Case("0-d", (n(()), p(())), values=False, grad=False),
        Case("empty", (n((0, 2)), p((0, 2))), values=False, grad=False),
        Case("shape-mismatch", (n((2,)), p((3,))), values=False, grad=False),
    ]


def _unfold_view(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("windows", (x((3, 5)), 1, 2, 1)),
        Case("step", (x((3, 7), layout="transposed"), -1, 3, 2)),
        Case("dim-0", (x((4, 3), layout="strided"), 0, 2, 2)),
        Case("whole", (x((3, 4)), 1, 4, 1)),
        Case("size-0", (x((2, 3)), 1, 0, 1)),
        Case("0-d", (x(()), 0, 1, 1)),
        Case("empty", (x((0, 3)), 0, 0, 1)),
        Case("too-large", (x((3, 4)), 1, 5, 1)),
        Case("zero-step", (x((3, 4)), 1, 2, 0)),
    ]


SPECS = {
    "_normal": explicit(_normal),
    "_bernoulli": explicit(_bernoulli),
    "poisson": explicit(_poisson),
    "binomial": explicit(_binomial),
    "_unfold_view": explicit(_unfold_view),
}
