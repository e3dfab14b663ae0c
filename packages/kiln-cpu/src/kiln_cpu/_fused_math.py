"""The functions kiln-compile's fused expressions call (``exp``, ``log``, ``sqrt``, ``tanh``, ``sin``, ``cos``,
``expm1``, ``log1p``, ``erf``, ``erfc``, ``sigmoid``), typed by their argument: float32 through kiln-cpu's
vectorisable float32 math (:mod:`kiln_cpu._jit_f32math`, the eager kernels' own), float64 through ``math``.
Generated fusion modules (:mod:`kiln_cpu.fusion`) import them all."""

from __future__ import annotations

import math

from numba import types
from numba.extending import overload, register_jitable

from kiln_cpu._jit_f32math import erf_f32, exp_f32, log_f32, sigmoid_f32, tanh_f32

__all__ = ["cos", "erf", "erfc", "exp", "expm1", "log", "log1p", "sigmoid", "sin", "sqrt", "tanh"]


@register_jitable
def _sigmoid64(x):
    return 1.0 / (1.0 + math.exp(-x))


def _typed(name: str, f32, f64):
    """A function for jitted code: ``f32`` on float32 arguments, ``f64`` otherwise."""

    def stub(x):
        raise NotImplementedError(f"{name} runs in jitted code only")

    stub.__name__ = name

    @overload(stub, jit_options={"cache": True})
    def _impl(x):
        if x == types.float32:
            return lambda x: f32(x)
        return lambda x: f64(x)

    return stub


exp = _typed("exp", exp_f32, math.exp)
log = _typed("log", log_f32, math.log)
tanh = _typed("tanh", tanh_f32, math.tanh)
erf = _typed("erf", erf_f32, math.erf)
sigmoid = _typed("sigmoid", sigmoid_f32, _sigmoid64)
sqrt, sin, cos, expm1, log1p, erfc = math.sqrt, math.sin, math.cos, math.expm1, math.log1p, math.erfc
