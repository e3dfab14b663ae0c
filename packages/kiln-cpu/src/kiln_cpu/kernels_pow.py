"""pow's kernel: a float32/float64 tensor to PyTorch's special exponents (2, 3, 0.5, -0.5, -1, -2: the
unary loops of x*x, x*x*x, sqrt, 1/sqrt, 1/x and 1/(x*x)), a float32 tensor to any other number or to a
float32 tensor (:func:`kiln_cpu._jit_pow.pow_f32`), and an int32/int64 tensor to a non-negative integer
(:func:`kiln_cpu._jit_pow.ipow_scalar`) or to a tensor of its dtype.

Unlike the single-pass elementwise ops, pow runs its loops from
:data:`kiln_cpu.config.multipass_min_numel` elements: the reference's expressions make one to three
NumPy passes with temporaries (``x ** 3`` on 131k float32: 28 us, the loop 7 us) and NumPy's integer
power is scalar; below the thread grain the loops run on the calling thread.

The rest runs the reference: float64 to a general exponent (NumPy's power: SIMD where NumPy has it,
and within 1 ulp of PyTorch's), float16 and bfloat16, a number base, bool operands, operands of another
dtype than the result's, integer exponents out of the tensor's range.
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _opcodes, config
from kiln_cpu._kernel_support import _GRAIN, _INTS, FLOAT, _flat, loops, parallel
from kiln_cpu.kernels_elementwise import run_binary, run_unary

_pow_loops = loops("_jit_pow")


def _float_pow(a: Tensor, b, d: kiln.dtype, shape: tuple) -> Tensor | None:
    """``a ** b`` for a float32/float64 tensor ``a`` and a Python number ``b``; None: not taken."""
    code = _opcodes.POW_EXPONENTS.get(b)
    if code is not None:
        return run_unary(code, a, d)
    if d is not kiln.float32:
        return None
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as NumPy's cast of the reference
        exponent = np.float32(b)
    return run_binary(_opcodes.POW, a, exponent, np.float32(0), shape, d)


def _int_pow(a: Tensor, b: int, d: kiln.dtype, shape: tuple) -> Tensor | None:
    """``a ** b`` for an int32/int64 tensor ``a`` and a Python int ``b`` in ``[0, max of d]``; None: not
    taken."""
    if not 0 <= b <= np.iinfo(d.numpy).max:  # negative: the meta raised; larger: the reference's rule
        return None
    exponent = d.numpy.type(b)
    x = a._numpy()
    fx = _flat(x)
    if fx is not None:
        out = np.empty_like(x)
        fo = _flat(out)
        if fo is not None:
            parallel(_pow_loops().ipow_scalar, (fx, exponent, fo), fo.size, _GRAIN)
            return from_array(out, d)
    return run_binary(_opcodes.POW, a, exponent, d.numpy.type(0), shape, d)


def _pow_kernel():
    reference = reference_kernel("pow")

    def kernel(spec, a, b):
        d = spec.dtype
        shape = spec.shape
        if (
            d not in SERVED
            or not isinstance(a, Tensor)
            or a._dtype is not d
            or config.too_small(math.prod(shape), multipass=True)
        ):
            return reference(spec, a, b)
        out = None
        if b.__class__ in (int, float):  # not bools, NumPy scalars or tensors
            if d in FLOAT:
                out = _float_pow(a, b, d, shape)
            elif b.__class__ is int:
                out = _int_pow(a, b, d, shape)
        elif isinstance(b, Tensor) and b._dtype is d and d is not kiln.float64:
            out = run_binary(_opcodes.POW, a, b, d.numpy.type(0), shape, d)
        return reference(spec, a, b) if out is None else out

    kernel.__name__ = "kiln_cpu_pow"
    kernel.__doc__ = (
        "Numba kernel for pow (kiln-cpu): special exponents as PyTorch computes them, float32 through "
        "float64, integers by repeated squaring."
    )
    return kernel


SERVED = FLOAT + _INTS


def kernels() -> dict[str, tuple]:
    """pow's kernel: op name -> (kernel, output dtypes served)."""
    return {"pow": (_pow_kernel(), SERVED)}
