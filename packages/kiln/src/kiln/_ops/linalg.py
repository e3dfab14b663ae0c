"""Matrix products: ``matmul`` (every broadcasting case of ``torch.matmul``) and ``mm``."""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, common_device, scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._spec import Spec
from kiln._tensor import Tensor

TOP_LEVEL = (
    "matmul",
    "mm",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

_NP_NAMES = {dt.float32: "float", dt.float64: "double", dt.float16: "c10::Half", dt.bfloat16: "c10::BFloat16"}


def _matmul_meta(input, other):
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        name, x = ("input", input) if not isinstance(input, Tensor) else ("other", other)
        raise TypeError(f"matmul(): argument '{name}' must be Tensor, not {type(x).__name__}")
    a, b = input._shape, other._shape
    if not a or not b:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {len(a)}D and {len(b)}D")
    if input._dtype is not other._dtype:
        raise RuntimeError(
            "expected m1 and m2 to have the same dtype, but got: "
            f"{_NP_NAMES.get(input._dtype, input._dtype.name)} != {_NP_NAMES.get(other._dtype, other._dtype.name)}"
        )
    if input._dtype is dt.bool:
        raise NotImplementedError(f"\"addmm_impl_cpu_\" not implemented for '{scalar_type_name(dt.bool)}'")
    dev = input._device if input._device is other._device else common_device("matmul", input, other)
    if len(a) == 1 and len(b) == 1:
        if a[0] != b[0]:
            raise RuntimeError(
                f"inconsistent tensor size, expected tensor [{a[0]}] and src [{b[0]}] to have the same number of "
                f"elements, but got {a[0]} and {b[0]} elements respectively"
            )
        return Spec(((), input._dtype, dev))
    if len(a) >= 2 and len(b) == 1 and a[-1] != b[0]:
        rows = 1
        for s in a[:-1]:  # PyTorch folds the batch dims into the matrix rows
            rows *= s
        raise RuntimeError(f"size mismatch, got input ({rows}), mat ({rows}x{a[-1]}), vec ({b[0]})")
    if len(a) == 2 and len(b) == 1:
        return Spec(((a[0],), input._dtype, dev))
    if len(a) <= 2 and len(b) == 2:
        k = a[-1]
        if k != b[0]:
            m = a[0] if len(a) == 2 else 1
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {b[0]}x{b[1]})")
        return Spec(((a[0], b[1]) if len(a) == 2 else (b[1],), input._dtype, dev))
    # batched: broadcast the batch dims, 1-D operands take a unit matrix dim
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{_batch(a2, b2)}, {a2[-1]}] but got: "
            f"[{_batch(a2, b2)}, {b2[-2]}]."
        )
    batch = broadcast_pair(a2[:-2], b2[:-2])
    shape = batch + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())
    return Spec((shape, input._dtype, dev))


def _batch(a2, b2) -> int:
    n = 1
    for s in broadcast_pair(a2[:-2], b2[:-2]):
        n *= s
    return n


_MATMUL_NODES = {(2, 2): "MmBackward0", (1, 1): "DotBackward0", (2, 1): "MvBackward0", (1, 2): "SqueezeBackward4"}


def _matmul_ref(spec, a, b):
    compute = _compute_np(spec.dtype)
    if a.dtype is not compute:  # (NumPy's builtin dtypes are singletons; a cast of nothing still costs a call)
        a = a.astype(compute)
    if b.dtype is not compute:
        b = b.astype(compute)
    return np.matmul(a, b)


def _matmul_backward(grad, input, other, input_shape, input_stride, other_shape, other_stride, needs_input_grad):
    # each operand is read (and so saved) only for the other's gradient, as PyTorch saves them
    a = input if needs_input_grad[1] else None
    b = other if needs_input_grad[0] else None
    if len(input_shape) == 1 and len(other_shape) == 1:
        return (grad * b if b is not None else None, grad * a if a is not None else None)
    g = grad
    if len(input_shape) == 1:
        a = a.unsqueeze(0) if a is not None else None
        g = g.unsqueeze(-2)
    if len(other_shape) == 1:
        b = b.unsqueeze(-1) if b is not None else None
        g = g.unsqueeze(-1)
    ga, gb = product_grads(
        matmul, g, a, b, column_major(input_shape, input_stride), column_major(other_shape, other_stride)
    )
    if ga is not None and len(input_shape) == 1:
        ga = ga.squeeze(-2)
    if gb is not None and len(other_shape) == 1:
        gb = gb.squeeze(-1)
    return (ga, gb)


def column_major(shape: tuple, stride: tuple) -> bool:
    """A matrix laid out column by column (a transposed contiguous matrix, such as ``weight.t()``)."""
    return len(shape) == 2 and stride[0] == 1 and stride[1] == shape[0] and shape[0] > 1


def product_grads(product, g: Tensor, a: Tensor | None, b: Tensor | None, a_column: bool, b_column: bool) -> tuple:
    """The gradients ``g @ b^T`` (of ``a``, when ``b`` is given) and ``a^T @ g`` (of ``b``, when ``a`` is
    given) of ``a @ b``, each computed in its operand's layout where that operand is a column-major matrix
    (``a_column``, ``b_column``), as PyTorch's mm backward does: the gradient of ``weight.t()`` comes out
    transposed, so a ``Linear`` weight's gradient arrives contiguous and is not copied to fit the
    parameter's layout. An operand is needed only for the other's gradient: the formulas pass it only then,
    so autograd saves it only then."""
    ga = gb = None
    if b is not None:
        ga = product(b, g.mT).mT if a_column else product(g, b.mT)
    if a is not None:
        gb = product(g.mT, a).mT if b_column else product(a.mT, g)
    return ga, gb


@op(
    tags=("linalg",),
    meta=_matmul_meta,
    reference=_matmul_ref,
    backward=_matmul_backward,
    autocast="lower",
    methods=("matmul", "__matmul__"),
    grad_fn_name=lambda args: _MATMUL_NODES.get((args[0].dim(), args[1].dim()), "UnsafeViewBackward0"),
)
def matmul(input: Tensor, other: Tensor) -> Tensor:
    """Matrix product with NumPy/PyTorch broadcasting: dot, mv, mm and batched cases (``torch.matmul``)."""


def _rmatmul(self, other):
    return matmul(other, self)


Tensor.__rmatmul__ = _rmatmul


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """Product of two 2-D matrices (no broadcasting)."""
    if not isinstance(input, Tensor) or not isinstance(mat2, Tensor):
        raise TypeError("mm(): arguments must be Tensors")
    if input.dim() != 2:
        raise RuntimeError("self must be a matrix")
    if mat2.dim() != 2:
        raise RuntimeError("mat2 must be a matrix")
    return matmul(input, mat2)


Tensor.mm = mm
