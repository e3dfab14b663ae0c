"""Conformance specs of the math and linear-algebra ops whose signatures the kit cannot infer: ``heaviside``,
``frexp``, the running extremes and ``logcumsumexp``, the triangular, Cholesky, LU and LDL factorizations and
solves, and the pseudo-inverse (merged into ``_specs.SPECS``)."""

from __future__ import annotations

import numpy as np

import kiln
from kiln_testing._specs import Case, Ctx, OpSpec, T, explicit, unary


def _heaviside(c: Ctx) -> list[Case]:
    # ``values`` must have the input's dtype; small integers make zeros (where ``values`` shows) frequent
    def x(shape, **k):
        return c.t(shape, low=-2, high=2, **k)

    return [
        Case("same-shape", (x((3, 4)), x((3, 4)))),
        Case("broadcast", (x((2, 1, 4), layout="strided"), x((3, 1)))),
        Case("0-d-values", (x((3, 4), layout="transposed"), x(()))),
        Case("empty", (x((0, 4)), x((4,)))),
        Case("specials", (c.specials(), c.specials())) if c.dtype.is_floating_point else Case("0-d", (x(()), x(()))),
    ]


def _scan(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("dim0", (x((3, 4)), 0)),
        Case("dim-1-transposed", (x((3, 4), layout="transposed"), -1)),
        Case("strided", (x((2, 3, 4), layout="strided"), 1)),
        Case("0-d", (x(()), 0)),
        Case("empty", (x((0, 3)), 0)),
    ] + ([Case("specials", (c.specials(), 0), grad=False)] if c.dtype.is_floating_point else [])


def _matrix(c: Ctx, batch: tuple, n: int, *, kind: str = "general", m: int | None = None) -> T:
    """A (batch of) ``m x n`` matrices of the case's dtype: well conditioned, triangular-friendly or SPD."""
    rng = np.random.default_rng(len(batch) * 7 + n)
    a = rng.standard_normal(batch + (m or n, n))
    if kind == "spd":
        a = a @ np.swapaxes(a, -1, -2) + n * np.eye(n)
    elif kind == "symmetric":
        a = a + np.swapaxes(a, -1, -2)
    elif m is None:
        a = a + 3 * n * np.eye(n)
    d = c.dtype
    return T(base=a.astype(d.numpy), dtype=d, shape=a.shape)


def _solve_triangular(c: Ctx) -> list[Case]:
    a, b = _matrix(c, (), 3), c.t((3, 2))
    return [
        Case("upper", (a, b), {"upper": True}),
        Case(
            "lower-unit",
            (_matrix(c, (2,), 3), c.t((3, 2), layout="transposed")),
            {"upper": False, "unitriangular": True},
        ),
        Case("right", (a, c.t((2, 3))), {"upper": True, "left": False}),
        Case("broadcast", (_matrix(c, (2,), 3), c.t((3, 1))), {"upper": False}),
        Case("empty", (_matrix(c, (0,), 3), c.t((3, 2))), {"upper": True}),
        Case("mismatch", (a, c.t((2, 2))), {"upper": True}, grad=False),
    ]


def _cholesky_ex(c: Ctx) -> list[Case]:
    return [
        Case("spd", (_matrix(c, (), 3, kind="spd"),)),
        Case("upper-batched", (_matrix(c, (2,), 3, kind="spd"), True)),
        Case("not-pd", (_matrix(c, (), 3, kind="symmetric"),), grad=False),
        Case("empty", (_matrix(c, (0,), 3, kind="spd"),), grad=False),
    ]


def _cholesky_solve(c: Ctx) -> list[Case]:
    a = np.random.default_rng(3).standard_normal((3, 3))
    lower = np.linalg.cholesky(a @ a.T + 3 * np.eye(3))
    factor = T(base=lower.astype(c.dtype.numpy), dtype=c.dtype, shape=(3, 3))
    upper = T(base=lower.T.astype(c.dtype.numpy), dtype=c.dtype, shape=(3, 3))
    return [
        Case("lower", (c.t((3, 2)), factor)),
        Case("upper", (c.t((3, 2), layout="transposed"), upper, True)),
        Case("broadcast", (c.t((2, 3, 1)), factor)),
        Case("mismatch", (c.t((2, 1)), factor), grad=False),
    ]


def _lu_factor(c: Ctx) -> list[Case]:
    return [
        Case("square", (_matrix(c, (), 4),)),
        Case("batched", (_matrix(c, (2,), 3),)),
        Case("wide", (_matrix(c, (), 4, m=3),)),
        Case("tall", (_matrix(c, (), 3, m=5),)),
        Case("singular", (T(base=np.zeros((3, 3), c.dtype.numpy), dtype=c.dtype, shape=(3, 3)),), grad=False),
        Case("empty", (c.t((0, 0)),), grad=False),
    ]


def _pinv(c: Ctx) -> list[Case]:
    return [
        Case("wide", (_matrix(c, (), 4, m=3),)),
        Case("tall-batched", (_matrix(c, (2,), 2, m=4),)),
        Case("hermitian", (_matrix(c, (), 3, kind="spd"), None, None, True), grad=False),
        Case("atol", (_matrix(c, (), 3), 1.0, None)),
        Case("empty", (c.t((0, 3)),), grad=False),
    ]


def _ldl_factor(c: Ctx) -> list[Case]:
    return [
        Case("symmetric", (_matrix(c, (), 4, kind="symmetric"),), grad=False),
        Case("batched", (_matrix(c, (2,), 3, kind="symmetric"),), grad=False),
        Case("zero", (T(base=np.zeros((2, 2), c.dtype.numpy), dtype=c.dtype, shape=(2, 2)),), grad=False),
    ]


def _ldl_solve(c: Ctx) -> list[Case]:
    # the factor of a 3x3 symmetric matrix with a 2x2 block first (pivots -3, -3, 3): LAPACK's format
    ld = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.5, 0.5, -3.0]])
    pivots = np.array([-3, -3, 3], np.int32)
    factor = T(base=ld.astype(c.dtype.numpy), dtype=c.dtype, shape=(3, 3), grad=False)
    piv = T(base=pivots, dtype=kiln.int32, shape=(3,), grad=False)
    return [
        Case("two-by-two", (factor, piv, c.t((3, 2))), grad=False),
        Case("broadcast", (factor, piv, c.t((2, 3, 1))), grad=False),
    ]


SPECS: dict[str, OpSpec] = {
    "heaviside": explicit(_heaviside),
    "_frexp": unary(),
    "_cummax": explicit(_scan),
    "_cummin": explicit(_scan),
    "logcumsumexp": explicit(_scan),
    "solve_triangular": explicit(_solve_triangular, rtol=1e-4, atol=1e-4),
    "_cholesky_ex": explicit(_cholesky_ex),
    "cholesky_solve": explicit(_cholesky_solve, rtol=1e-4, atol=1e-4),
    "_linalg_lu_factor_ex": explicit(_lu_factor, rtol=1e-4, atol=1e-4),
    "_linalg_pinv": explicit(_pinv, rtol=1e-4, atol=1e-4),
    "_linalg_ldl_factor_ex": explicit(_ldl_factor),
    "ldl_solve": explicit(_ldl_solve),
}
