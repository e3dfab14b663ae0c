"""Matrix and vector products: the matmul family (``bmm``, ``mv``, ``dot``, ``outer``/``ger``, ``addmm``,
``addmv``, ``baddbmm``, ``addbmm``), ``trace``, ``tensordot``, ``vecdot`` and ``cross``.

``bmm``, ``addmm`` and ``baddbmm`` are ops of their own (a backend can fuse them; PyTorch's node names);
the other products are composites over :func:`kiln.matmul` (their gradients come from its formula).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import composite, op, with_out
from kiln._ops._meta import scalar_type_name
from kiln._ops.linalg import _matmul_meta, _matmul_ref, column_major, matmul, product_grads
from kiln._tensor import Tensor

__all__ = [
    "bmm",
    "mv",
    "dot",
    "outer",
    "ger",
    "addmm",
    "addmv",
    "baddbmm",
    "addbmm",
    "trace",
    "tensordot",
    "vecdot",
    "cross",
]

TOP_LEVEL = (
    "addbmm",
    "addmm",
    "addmv",
    "baddbmm",
    "bmm",
    "dot",
    "ger",
    "mv",
    "outer",
    "tensordot",
    "trace",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


# ---------------------------------------------------------------------------------------- products


def _check_tensors(name, **tensors):
    for arg, x in tensors.items():
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def _bmm_meta(input, mat2):
    _check_tensors("bmm", input=input, mat2=mat2)
    if input.dim() != 3:
        raise RuntimeError("batch1 must be a 3D tensor")
    if mat2.dim() != 3:
        raise RuntimeError("batch2 must be a 3D tensor")
    b, _, k = input._shape
    if input._dtype is not mat2._dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(input._dtype)} but found {scalar_type_name(mat2._dtype)}"
        )
    if tuple(mat2._shape[:2]) != (b, k):
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{b}, {k}] but got: "
            f"[{mat2._shape[0]}, {mat2._shape[1]}]."
        )
    return _matmul_meta(input, mat2)


def _bmm_backward(grad, input, mat2, needs_input_grad):
    # each operand is read (and so saved) only for the other's gradient
    a = input if needs_input_grad[1] else None
    b = mat2 if needs_input_grad[0] else None
    return product_grads(bmm, grad, a, b, False, False)


def _bmm_decomposed(input, mat2):
    """``bmm`` in kiln ops: ``matmul`` of two 3-D tensors."""
    return matmul(input, mat2)


@op(
    tags=("linalg",),
    decompose=_bmm_decomposed,
    meta=_bmm_meta,
    reference=_matmul_ref,
    backward=_bmm_backward,
    autocast="lower",
    methods=("bmm",),
    grad_fn_name="BmmBackward0",
)
def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of two 3-D tensors (no broadcasting)."""


@composite(autocast="promote")
def mv(input: Tensor, vec: Tensor) -> Tensor:
    """Matrix-vector product."""
    _check_tensors("mv", input=input, vec=vec)
    if input.dim() != 2 or vec.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {input.dim()}, {vec.dim()}")
    return matmul(input, vec)


@composite(autocast="promote")
def dot(input: Tensor, tensor: Tensor) -> Tensor:
    """Inner product of two 1-D tensors."""
    _check_tensors("dot", input=input, tensor=tensor)
    if input.dim() != 1 or tensor.dim() != 1:
        raise RuntimeError(f"1D tensors expected, but got {input.dim()}D and {tensor.dim()}D tensors")
    if input.dtype is not tensor.dtype:
        raise RuntimeError(
            "dot : expected both vectors to have same dtype, but found "
            f"{scalar_type_name(input.dtype)} and {scalar_type_name(tensor.dtype)}"
        )
    return matmul(input, tensor)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """Outer product of two 1-D tensors."""
    _check_tensors("outer", input=input, vec2=vec2)
    if input.dim() != 1:
        raise RuntimeError(f"outer: Expected 1-D argument self, but got {input.dim()}-D")
    if vec2.dim() != 1:
        raise RuntimeError(f"outer: Expected 1-D argument vec2, but got {vec2.dim()}-D")
    return input.unsqueeze(1) * vec2


ger = outer


def _scaled_sum(base, prod, beta, alpha):
    tgt = tuple(prod.shape)
    _expand_check(tuple(base.shape), tgt)
    base = base.expand(tgt)
    out = prod if alpha == 1 else prod * alpha
    if beta == 0:  # PyTorch ignores base's values (NaN included) but still broadcasts it, and its gradient is 0
        return out + base.nan_to_num() * 0
    return out + (base if beta == 1 else base * beta)


def _zeros_like(t):
    from kiln._ops.creation import zeros

    return zeros(t.shape, dtype=t.dtype, device=t.device)


def _add_product_meta(name: str, product_meta, names: tuple[str, str], dtype_message):
    """Meta of ``beta * input + alpha * product(a, b)``: the product's checks, then ``input`` broadcast to it."""

    def meta(input, a, b, beta=1, alpha=1):
        _check_tensors(name, input=input, **{names[0]: a, names[1]: b})
        if not (input._dtype is a._dtype is b._dtype):
            raise RuntimeError(dtype_message(input, a, b))
        spec = product_meta(a, b)
        _expand_check(input._shape, spec.shape)
        return spec

    return meta


def _expand_check(src: tuple, tgt: tuple) -> None:
    """PyTorch's message when ``src`` does not broadcast to ``tgt`` (as ``expand`` reports it)."""
    if len(src) > len(tgt) or any(s not in (1, t) for s, t in zip(src[::-1], tgt[::-1])):
        i = next(
            (len(tgt) - 1 - k for k, (s, t) in enumerate(zip(src[::-1], tgt[::-1])) if s not in (1, t)), len(tgt) - 1
        )
        j = i - (len(tgt) - len(src))
        raise RuntimeError(
            f"The expanded size of the tensor ({tgt[i]}) must match the existing size ({src[j]}) at non-singleton "
            f"dimension {i}.  Target sizes: [{', '.join(map(str, tgt))}].  Tensor sizes: [{', '.join(map(str, src))}]"
        )


def _add_product_ref(spec, base, a, b, beta=1, alpha=1):
    out = _matmul_ref(spec, a, b)
    if alpha != 1:
        out = out * alpha
    if beta != 0:  # beta == 0 ignores the input's values (NaN included), as PyTorch does
        out = out + (base if beta == 1 else base * beta).astype(out.dtype, copy=False)
    return np.broadcast_to(out, spec.shape).astype(out.dtype, copy=False)


def _add_product_grads(product, grad, a, b, a_column, b_column, beta, alpha, input_needs_grad) -> tuple:
    """Gradients of ``beta * input + alpha * product(a, b)`` (the engine reduces ``input``'s to its
    shape); ``a`` and ``b`` as :func:`kiln._ops.linalg.product_grads` takes them."""
    g = grad if alpha == 1 else grad * alpha
    ga, gb = product_grads(product, g, a, b, a_column, b_column)
    return ((grad if beta == 1 else grad * beta) if input_needs_grad else None, ga, gb)


def _addmm_backward(grad, mat1, mat2, mat1_shape, mat1_stride, mat2_shape, mat2_stride, beta, alpha, needs_input_grad):
    a = mat1 if needs_input_grad[2] else None  # read (and so saved) only for the other's gradient
    b = mat2 if needs_input_grad[1] else None
    a_column, b_column = column_major(mat1_shape, mat1_stride), column_major(mat2_shape, mat2_stride)
    return _add_product_grads(matmul, grad, a, b, a_column, b_column, beta, alpha, needs_input_grad[0])


def _baddbmm_backward(grad, batch1, batch2, beta, alpha, needs_input_grad):
    a = batch1 if needs_input_grad[2] else None  # read (and so saved) only for the other's gradient
    b = batch2 if needs_input_grad[1] else None
    return _add_product_grads(bmm, grad, a, b, False, False, beta, alpha, needs_input_grad[0])


def _mm_meta(mat1, mat2):
    if mat1.dim() != 2:
        raise RuntimeError("mat1 must be a matrix, got " + f"{mat1.dim()}-D tensor")
    if mat2.dim() != 2:
        raise RuntimeError("mat2 must be a matrix, got " + f"{mat2.dim()}-D tensor")
    return _matmul_meta(mat1, mat2)


def _addmm_dtype_message(input, a, b) -> str:
    x, y = (a, b) if a._dtype is not b._dtype else (input, b)
    which = "mat1 and mat2" if a._dtype is not b._dtype else "self and mat2"
    return f"{which} must have the same dtype, but got {scalar_type_name(x._dtype)} and {scalar_type_name(y._dtype)}"


def _baddbmm_dtype_message(input, a, b) -> str:
    names = {dt.float64: "double", dt.float32: "float", dt.float16: "c10::Half", dt.bfloat16: "c10::BFloat16"}
    n = [names.get(t._dtype, t._dtype.name) for t in (input, a, b)]
    return f"Input dtypes must be the same, got: input {n[0]}, batch1: {n[1]}, batch2: {n[2]}"


def _add_product_decomposed(input, a, b, *, beta=1, alpha=1):
    """``addmm``/``baddbmm`` in kiln ops: ``beta * input + alpha * (a @ b)`` with the reference's arithmetic
    (half precision in float32; integer operands times a float scalar in float64, truncated at the end;
    ``beta == 0`` ignores ``input``'s values, NaN included, as PyTorch does)."""
    d = a._dtype
    base = input
    if d in (dt.float16, dt.bfloat16):
        base, a, b = base.to(dt.float32), a.to(dt.float32), b.to(dt.float32)

    def scaled(t, scalar):
        if not t._dtype.is_floating_point and isinstance(scalar, float):
            t = t.to(dt.float64)
        return t * scalar

    out = matmul(a, b)
    if alpha != 1:
        out = scaled(out, alpha)
    if beta != 0:
        out = out + (base if beta == 1 else scaled(base, beta)).to(out._dtype)
    return out.to(d)


@op(
    tags=("linalg",),
    decompose=_add_product_decomposed,
    meta=_add_product_meta("addmm", _mm_meta, ("mat1", "mat2"), _addmm_dtype_message),
    reference=_add_product_ref,
    backward=_addmm_backward,
    autocast="lower",
    methods=("addmm",),
    grad_fn_name="AddmmBackward0",
)
def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` in one op (``input`` broadcasts to the product)."""


def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * (mat @ vec)``."""
    return _scaled_sum(input, mv(mat, vec), beta, alpha)


@op(
    tags=("linalg",),
    decompose=_add_product_decomposed,
    meta=_add_product_meta("baddbmm", _bmm_meta, ("batch1", "batch2"), _baddbmm_dtype_message),
    reference=_add_product_ref,
    backward=_baddbmm_backward,
    autocast="lower",
    methods=("baddbmm",),
    grad_fn_name="BaddbmmBackward0",
)
def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)`` in one op (``input`` broadcasts to the product)."""


@composite(autocast="lower")
def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])``."""
    return _scaled_sum(input, bmm(batch1, batch2).sum(0), beta, alpha)


@composite(autocast="fp32")
def trace(input: Tensor) -> Tensor:
    """Sum of the main diagonal of a 2-D tensor (integers sum to int64)."""
    _check_tensors("trace", input=input)
    if input.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.dim()}")
    return input.diagonal().sum()


@with_out(position=3)
def tensordot(a: Tensor, b: Tensor, dims=2) -> Tensor:
    """Contract ``dims`` dims of ``a`` with ``b`` (the last ``dims`` of ``a`` with the first of ``b``, or
    the two lists of ``dims``)."""
    _check_tensors("tensordot", a=a, b=b)
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        da, db = list(range(-dims, 0)), list(range(dims))
    else:
        da, db = dims
        da = [da] if isinstance(da, int) else list(da)
        db = [db] if isinstance(db, int) else list(db)
    if len(da) != len(db):
        raise RuntimeError("both dimension lists should have same length")
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(
                f"contracted dimensions need to match, but first has size {a.shape[i]} in dim {i} and second "
                f"has size {b.shape[j]} in dim {j}"
            )
    da = [d % a.dim() if a.dim() else d for d in da]
    db = [d % b.dim() if b.dim() else d for d in db]
    fa = [d for d in range(a.dim()) if d not in da]
    fb = [d for d in range(b.dim()) if d not in db]
    k = 1
    for d in da:
        k *= a.shape[d]
    am = a.permute(fa + da).reshape(-1, k) if fa else a.permute(da).reshape(1, k)
    bm = b.permute(db + fb).reshape(k, -1) if fb else b.permute(db).reshape(k, 1)
    out_shape = [a.shape[d] for d in fa] + [b.shape[d] for d in fb]
    return matmul(am, bm).reshape(out_shape)


Tensor.mv = mv
Tensor.dot = dot
Tensor.outer = outer
Tensor.ger = outer
Tensor.addmv = addmv
Tensor.addbmm = addbmm
Tensor.trace = trace


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """Dot product of vectors along ``dim`` (broadcasting)."""
    _check_tensors("linalg_vecdot", x=x, y=y)
    if x.shape[dim] != y.shape[dim]:
        n, m = x.shape[dim], y.shape[dim]
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{n}] and src [{m}] to have the same number of "
            f"elements, but got {n} and {m} elements respectively"
        )
    return (x * y).sum(dim)


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:
    """Cross product of 3-vectors along ``dim`` (broadcasting)."""
    from kiln._ops.shape import stack

    _check_tensors("linalg_cross", input=input, other=other)
    if input.dim() != other.dim():
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    if input.dtype is not other.dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(input.dtype)} but found {scalar_type_name(other.dtype)}"
        )
    if input.dtype is dt.bool:
        raise NotImplementedError("\"cross\" not implemented for 'Bool'")
    from kiln._ops._meta import wrap_dim

    wrap_dim(dim, input.dim())  # PyTorch's IndexError for a dim out of range
    if input.shape[dim] != 3 or other.shape[dim] != 3:
        raise RuntimeError(
            f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[dim]} and {other.shape[dim]}"
        )
    a = [input.select(dim, i) for i in range(3)]
    b = [other.select(dim, i) for i in range(3)]
    out = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    d = dim % max(input.dim(), other.dim())
    return stack(out, d)
