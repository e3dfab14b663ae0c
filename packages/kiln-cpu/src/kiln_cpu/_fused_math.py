"""The functions kiln-compile's fused expressions call (``exp``, ``log``, ``sqrt``, ``tanh``, ``sin``, ``cos``,
``expm1``, ``log1p``, ``erf``, ``erfc``, ``sigmoid``), typed by their argument: float32 through kiln-cpu's
vectorisable float32 math (:mod:`kiln_cpu._jit_f32math`, the eager kernels' own), float64 through ``math``.
Generated fusion modules (:mod:`kiln_cpu.fusion`) import them all."""

from __future__ import annotations

import math

from numba import njit, types
from numba.extending import overload, register_jitable

from kiln_cpu._jit_f32math import erf_f32, exp_f32, log_f32, sigmoid_f32, tanh_f32

__all__ = ["cos", "erf", "erfc", "exp", "expm1", "log", "log1p", "sigmoid", "sin", "sqrt", "sum_run", "tanh"]


@register_jitable
def _sigmoid64(x):
    return 1.0 / (1.0 + math.exp(-x))


def _typed(name: str, f32, f64):
    """A function for jitted code: ``f32`` on float32 arguments, ``f64`` otherwise."""

    def stub(x):
        raise NotImplementedError(f"{name} runs in jitted code only")

    stub.__name__ = name

    # contract: the polynomials may use FMA, as kiln-cpu's eager kernels do (the same results as they give,
    # from min_numel up, where they run; and a third faster). An overload is compiled apart, with its own
    # flags, so the generated loop's own arithmetic still rounds op by op as eager kiln does; LLVM inlines
    # it and the flags stay on its instructions.
    @overload(stub, jit_options={"cache": True, "fastmath": {"contract"}})
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


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def sum_run(buf, m):
    """The float64 sum of ``buf[:m]``, a run of a fused loop's values (at most a row or 1024 of them).

    Compiled apart with ``reassoc``, so that LLVM sums in vector lanes (a strict left-to-right sum is one
    chain of dependent additions, ~1 ns per 3 elements here); the generated loop's own arithmetic keeps
    eager kiln's rounding. The order within a run is LLVM's; the runs add in order."""
    s = 0.0
    for j in range(m):
        s += buf[j]
    return s
