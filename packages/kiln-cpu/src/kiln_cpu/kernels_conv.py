"""kiln-cpu's 2-d convolution forward (groups = 1, not transposed): im2col in Numba, one image per task
(padding written as zeros, no padded copy of the input), then BLAS (``np.matmul``) of the weight matrix
with each image's columns, which lands in NCHW order directly (the reference multiplies the other way
round and transposes the result into place), and the bias added in place.

Handed back to the reference: other dims, groups, transposed convolutions, dtypes other than
float32/float64 (or mixed), small outputs (:data:`kiln_cpu.config.min_numel`), small images (below
``_MIN_PIXELS`` output pixels, unless ``min_numel`` is lower: the tests force every size) and empty
tensors.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import from_array
from kiln_cpu import config
from kiln_cpu.kernels import _GRAIN, _kernels, parallel

FLOAT = (dt.float32, dt.float64)
_MIN_PIXELS = 1024
"""Output pixels per image from which per-image products beat the reference's one product for the batch
(measured: 25-35% faster at 56x56 and 64x64 outputs, 15% slower at 14x14)."""


def _conv_kernel():
    reference = wrap_reference(OPS["convolution"])

    def kernel(spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        args = (spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        d = spec[1]
        shape = spec[0]
        if (
            d not in FLOAT
            or transposed
            or groups != 1
            or len(shape) != 4
            or input._dtype is not d
            or weight._dtype is not d
            or (bias is not None and bias._dtype is not d)
            or math.prod(shape) == 0
            or math.prod(shape) < config.min_numel
            or shape[2] * shape[3] < min(_MIN_PIXELS, config.min_numel)
        ):
            return reference(*args)
        (sh, sw), (ph, pw), (dh, dw), _ = spec[3]
        x = np.ascontiguousarray(input._numpy())
        n, c = x.shape[:2]
        cout, _, kh, kw = weight._shape
        oh, ow = shape[2:]
        ck, pix = c * kh * kw, oh * ow
        cols = np.empty((n, ck, pix), x.dtype)
        grain = max(1, _GRAIN // (kh * kw * pix))
        parallel(_kernels().im2col_2d, (x, cols, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow), n * c, grain)
        wm = np.ascontiguousarray(weight._numpy()).reshape(cout, ck)
        out = np.matmul(wm, cols)  # (N, Cout, P): NCHW
        if bias is not None:
            out += bias._numpy().reshape(cout, 1)
        return from_array(out.reshape(shape), d)

    kernel.__name__ = "kiln_cpu_convolution"
    kernel.__doc__ = "im2col (Numba) + BLAS kernel for 2-d convolution (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The convolution kernels: op name -> (kernel, output dtypes served)."""
    return {"convolution": (_conv_kernel(), FLOAT)}
