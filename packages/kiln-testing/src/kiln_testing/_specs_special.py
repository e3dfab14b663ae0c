"""Conformance specs of the special functions (``kiln.special``, ``lgamma``/``polygamma``/``mvlgamma``...)
whose signatures or domains the kit cannot infer: ``polygamma(n, input)``, ``mvlgamma(input, p)``, the
orthogonal polynomials ``f(input, n)``, and the functions defined on part of the line (merged into
``_specs.SPECS``)."""

from __future__ import annotations

import kiln
from kiln_testing._specs import Case, Ctx, OpSpec, binary, explicit, unary

_POSITIVE = {"low": 0.1, "high": 5.0}


def _polygamma(c: Ctx) -> list[Case]:
    def x(shape, **k):
        return c.t(shape, low=-2.5, high=4.0, **k)

    cases = []
    for n in (0, 1, 2, 3):
        cases += [
            Case(f"n={n}", (n, x((3, 4)))),
            Case(f"n={n}-transposed", (n, x((3, 4), layout="transposed"))),
            Case(f"n={n}-strided", (n, x((2, 3, 4), layout="strided"))),
            Case(f"n={n}-0-d", (n, x(()))),
        ]
    cases += [Case("expanded", (2, x((3, 4), layout="expanded"))), Case("empty", (1, x((0, 3))))]
    if c.dtype.is_floating_point:
        cases += [Case(f"n={n}-specials", (n, c.specials()), grad=False) for n in (0, 1, 4)]
    return cases + [Case("negative-n", (-1, x((3,))))]


def _mvlgamma(c: Ctx) -> list[Case]:
    def x(shape, **k):
        return c.t(shape, low=2.0, high=5.0, **k)

    return [
        Case("p=1", (x((3, 4)), 1)),
        Case("p=2-transposed", (x((3, 4), layout="transposed"), 2)),
        Case("p=3-strided", (x((2, 3, 4), layout="strided"), 3)),
        Case("p=4-expanded", (x((3, 4), layout="expanded"), 4)),
        Case("0-d", (x(()), 2)),
        Case("empty", (x((0, 3)), 3)),
        Case("p=0", (x((3,)), 0)),
    ]


def _polynomial(c: Ctx) -> list[Case]:
    """``f(input, n)``: degrees 0 to 12 (both the recurrence and the trigonometric forms of the Chebyshev
    polynomials), as a tensor of the case's dtype or int64, or a number; and a number ``input``."""

    def x(shape, **k):
        return c.t(shape, low=-1.2, high=1.2, grad=False, **k)

    def n(shape, **k):
        return c.t(shape, low=0, high=12, grad=False, **k)

    degrees = c.t((3, 4), dtype=kiln.int64, low=0, high=12, grad=False)
    return [
        Case("same-shape", (x((3, 4)), n((3, 4)))),
        Case("int64-degrees", (x((3, 4), layout="transposed"), degrees)),
        Case("broadcast", (x((2, 1, 4), layout="strided"), n((3, 1)))),
        Case("expanded", (x((3, 4), layout="expanded"), n((4,)))),
        Case("0-d", (x(()), n(()))),
        Case("number-degree", (x((3, 4)), 9)),
        Case("number-input", (0.25, degrees)),
        Case("empty", (x((0, 4)), n((4,)))),
    ]


_POLYNOMIALS = [f"{prefix}chebyshev_polynomial_{kind}" for prefix in ("", "shifted_") for kind in "tuvw"] + [
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

SPECS: dict[str, OpSpec] = {
    "polygamma": explicit(_polygamma),
    "mvlgamma": explicit(_mvlgamma),
    **{name: explicit(_polynomial) for name in _POLYNOMIALS},
    "ndtri": unary(low=0.02, high=0.98),
    "entr": unary(low=0.05, high=3.0),
    "modified_bessel_k0": unary(**_POSITIVE),
    "modified_bessel_k1": unary(**_POSITIVE),
    "scaled_modified_bessel_k0": unary(**_POSITIVE),
    "scaled_modified_bessel_k1": unary(**_POSITIVE),
    "bessel_y0": unary(**_POSITIVE),
    "bessel_y1": unary(**_POSITIVE),
    "igamma": binary(low=0.1, high=5.0, tensor_only=True),
    "igammac": binary(low=0.1, high=5.0, tensor_only=True),
    "zeta": binary(low=1.1, high=5.0, other_low=0.5, other_high=4.0, scalars=(2, 3.5)),
    "xlogy": binary(other_low=0.1, other_high=3.0),
    "xlog1py": binary(other_low=-0.5, other_high=3.0),
}
