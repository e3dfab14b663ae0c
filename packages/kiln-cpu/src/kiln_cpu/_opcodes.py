"""The integer codes the kernels pass to the Numba loop factories: elementwise, ternary, scan and
reduction op codes, and the half-precision storage kinds.

Plain Python (no Numba): the kernels read these codes without importing the jitted modules. A code is a
closure constant of the loop a factory builds, so Numba specialises the scalar function at typing time.
"""

from __future__ import annotations

ADD, SUB, MUL, DIV, FLOOR_DIV, TRUNC_DIV, MAXIMUM, MINIMUM = range(8)
EQ, NE, LT, LE, GT, GE = range(8, 14)
ADD_ALPHA, SUB_ALPHA = 14, 15  # x + y * c, x - y * c (the product rounded first, as the reference)
RELU_GRAD = 16  # 0 where y <= 0, else x (NaN: x): relu's backward (``_threshold_backward(grad, output)``)
POW = 17  # x ** y (float32 in float64, rounded once; integers wrap): kiln_cpu._jit_pow.power

NEG, ABS, RELU, EXP, LOG, SQRT, SIN, COS, TANH, SIGMOID, ERF, GELU, GELU_TANH = range(13)
CAST = 13  # the value itself: with another output dtype, a conversion
# the transcendentals: kiln-cpu's own polynomials, within a few ulps of the reference's NumPy (the other
# unary loops, like the binary and ternary ones, give the reference's bits)
TRANSCENDENTAL = frozenset((EXP, LOG, SIN, COS, TANH, SIGMOID, ERF, GELU, GELU_TANH))
# x ** e for the exponents PyTorch computes without the general pow: x*x, x*x*x, 1/x, 1/sqrt(x), 1/(x*x)
SQUARE, CUBE, RECIPROCAL, RSQRT, INV_SQUARE = range(14, 19)

# ternary op codes (their own numbering): where(c, x, y); x + value*y*z; x + value*y/z; lerp(x, y, weight z);
# clamp(x, low y, high z)
WHERE, ADDCMUL, ADDCDIV, LERP, CLAMP = range(5)

# reductions
SUM, AMAX, AMIN = range(3)

F16, BF16 = 1, 2  # half-precision kinds (0: the storage dtype is the compute dtype)

# scans
CUMSUM, CUMPROD = range(2)

# the ops whose kernel is one code of the loops above, by op name: the kernels look codes up here, never by
# spelling an op's name (a kiln-cpu test checks every name is an op of the core's registry)
COMPARISONS = {"eq": EQ, "ne": NE, "lt": LT, "le": LE, "gt": GT, "ge": GE}
UNARY_ARITHMETIC = {"neg": NEG, "abs": ABS, "relu": RELU}  # every arithmetic dtype
UNARY_FLOATING = {
    "exp": EXP,
    "log": LOG,
    "sqrt": SQRT,
    "sin": SIN,
    "cos": COS,
    "tanh": TANH,
    "sigmoid": SIGMOID,
    "erf": ERF,
}
# pow with a Python-number exponent: the exponents with a loop of their own, by value (others: the reference)
POW_EXPONENTS = {2: SQUARE, 3: CUBE, 0.5: SQRT, -0.5: RSQRT, -1: RECIPROCAL, -2: INV_SQUARE}
REDUCTIONS = {"sum": SUM, "amax": AMAX, "amin": AMIN, "_max_all": AMAX, "_min_all": AMIN}  # mean: SUM, then a division
SCANS = {"cumsum": CUMSUM, "cumprod": CUMPROD}
