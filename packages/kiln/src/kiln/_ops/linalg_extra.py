"""More linear algebra: the matmul family (``bmm``, ``mv``, ``dot``, ``outer``, ``addmm``, ``addmv``,
``baddbmm``, ``addbmm``), ``einsum``, ``tensordot``, ``trace`` and the ``kiln.linalg`` decompositions
(``inv``, ``det``, ``slogdet``, ``solve``, ``cholesky``).

``bmm``, ``addmm`` and ``baddbmm`` are ops of their own (a backend can fuse them; PyTorch's node names);
the other products are composites over :func:`kiln.matmul` (their gradients come from its formula); the
decompositions are ops with NumPy reference kernels and backward formulas written in kiln ops (so
higher-order gradients work).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.linalg import _matmul_meta, _matmul_ref, column_major, matmul, product_grads
from kiln._ops.reduction import _return_type
from kiln._tensor import Tensor


class LinAlgError(RuntimeError):
    """Raised by ``kiln.linalg`` when a matrix is singular or not positive-definite (``torch.linalg.LinAlgError``)."""


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


@op(
    meta=_bmm_meta,
    reference=_matmul_ref,
    backward=_bmm_backward,
    autocast="lower",
    methods=("bmm",),
    grad_fn_name="BmmBackward0",
)
def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of two 3-D tensors (no broadcasting)."""


def mv(input: Tensor, vec: Tensor) -> Tensor:
    """Matrix-vector product."""
    _check_tensors("mv", input=input, vec=vec)
    if input.dim() != 2 or vec.dim() != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {input.dim()}, {vec.dim()}")
    return matmul(input, vec)


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
    if beta == 0:  # PyTorch ignores base's values (NaN included) but still broadcasts it
        return out + _zeros_like(base)
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
        _expand_check(input._shape, spec[0])
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
    return np.broadcast_to(out, spec[0]).astype(out.dtype, copy=False)


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


@op(
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
    meta=_add_product_meta("baddbmm", _bmm_meta, ("batch1", "batch2"), _baddbmm_dtype_message),
    reference=_add_product_ref,
    backward=_baddbmm_backward,
    autocast="lower",
    methods=("baddbmm",),
    grad_fn_name="BaddbmmBackward0",
)
def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)`` in one op (``input`` broadcasts to the product)."""


def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])``."""
    return _scaled_sum(input, bmm(batch1, batch2).sum(0), beta, alpha)


def trace(input: Tensor) -> Tensor:
    """Sum of the main diagonal of a 2-D tensor (integers sum to int64)."""
    _check_tensors("trace", input=input)
    if input.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.dim()}")
    return input.diagonal().sum()


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


# ---------------------------------------------------------------------------------------- einsum

_LETTERS = string.ascii_letters


def _parse_einsum(equation: str, shapes: Sequence[tuple]):
    """``equation`` in explicit form with ellipses replaced by letters: (input subscripts, output)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) > len(shapes):
        raise RuntimeError("einsum(): fewer operands were provided than specified in the equation")
    if len(terms) < len(shapes):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation")
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in _LETTERS if c not in used]
    ell_nd = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            ell_nd = max(ell_nd, len(shape) - (len(term) - 3))
    ell = "".join(spare[:ell_nd])
    ins = []
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        nlab = len(term) - 3 if "..." in term else len(term)
        if ("..." not in term and nlab != len(shape)) or ("..." in term and nlab > len(shape)):
            raise RuntimeError(
                f"einsum(): the number of subscripts in the equation ({nlab}) "
                + ("is more than" if "..." in term else "does not match")
                + f" the number of dimensions ({len(shape)}) for operand {i}"
                + ("" if "..." in term else " and no ellipsis was given")
            )
        if "..." in term:
            n = len(shape) - nlab
            term = term.replace("...", ell[ell_nd - n :])
        ins.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in ins:
            for c in t:
                if c not in ell:
                    counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes: dict[str, int] = {}
    for i, (t, shape) in enumerate(zip(ins, shapes)):
        for c, s in zip(t, shape):
            if c in sizes and sizes[c] != s and s != 1 and sizes[c] != 1:
                raise RuntimeError(
                    f"einsum(): subscript {c} has size {s} for operand {i} which does not broadcast with "
                    f"previously seen size {sizes[c]}"
                )
            sizes[c] = max(sizes.get(c, s), s)
    for c in out:
        if c not in sizes:
            raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation for any input operand")
    return ins, out, sizes


def _einsum_meta(equation, operands):
    if not isinstance(equation, str):
        raise TypeError(f"einsum(): argument 'equation' must be str, not {type(equation).__name__}")
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    for o in operands:
        if not isinstance(o, Tensor):
            raise TypeError(f"einsum(): operands must be Tensors, not {type(o).__name__}")
    d = operands[0]._dtype
    for o in operands[1:]:
        if o._dtype is not d:
            raise RuntimeError(f"expected scalar type {scalar_type_name(d)} but found {scalar_type_name(o._dtype)}")
    _, out, sizes = _parse_einsum(equation, [o._shape for o in operands])
    return (tuple(sizes[c] for c in out), d, operands[0]._device)


def _einsum_ref(spec, equation, operands):
    ins, out, _ = _parse_einsum(equation, [a.shape for a in operands])
    compute = _compute_np(spec[1])
    r = np.einsum(",".join(ins) + "->" + out, *[a.astype(compute, copy=False) for a in operands])
    return np.asarray(r, compute)


def _einsum_backward(grad, equation, operands, operands_shape):
    from kiln._ops.creation import eye, ones

    ins, out, sizes = _parse_einsum(equation, list(operands_shape))
    used = set("".join(ins) + out)
    spare = [c for c in _LETTERS if c not in used]
    grads = []
    for i, term in enumerate(ins):
        # an operand is saved only while another one needs a gradient (so the one needing it may be None)
        others = [o for j, o in enumerate(operands) if j != i]
        if any(o is None for o in others) or (operands[i] is not None and not operands[i].requires_grad):
            grads.append(None)
            continue
        subs = [out] + [t for j, t in enumerate(ins) if j != i]
        ops = [grad, *others]
        present = set("".join(subs))
        target = ""
        seen = set()
        for c in term:
            if c in seen:  # a repeated subscript: a fresh letter tied to c by an identity matrix
                f = spare.pop()
                subs.append(c + f)
                ops.append(eye(sizes[c], dtype=grad.dtype, device=grad.device))
                target += f
                continue
            seen.add(c)
            if c not in present:  # summed in this operand alone: broadcast back
                subs.append(c)
                ops.append(ones(sizes[c], dtype=grad.dtype, device=grad.device))
                present.add(c)
            target += c
        g = einsum(",".join(subs) + "->" + target, *ops)
        shape = operands_shape[i]
        if tuple(g.shape) != tuple(shape):  # size-1 dims broadcast against others
            dims = tuple(k for k, s in enumerate(shape) if s == 1 and g.shape[k] != 1)
            g = g.sum(dims, keepdim=True)
        grads.append(g)
    return grads


@op(meta=_einsum_meta, reference=_einsum_ref, backward=_einsum_backward, autocast="lower", name="einsum")
def _einsum(equation: str, operands: Sequence[Tensor]) -> Tensor:
    """Einstein summation over ``operands`` (``torch.einsum``)."""


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation: ``einsum("ij,jk->ik", a, b)`` (implicit output, ellipsis and repeated
    subscripts included); operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _einsum(equation, list(operands))


# ---------------------------------------------------------------------------------------- decompositions


def _square_meta(name, A, min_float=True):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.dim() < 2:
        raise RuntimeError(f"linalg.{name}: The input tensor A must have at least 2 dimensions.")
    if A._shape[-1] != A._shape[-2]:
        raise RuntimeError(
            f"linalg.{name}: A must be batches of square matrices, but they are {A._shape[-2]} by "
            f"{A._shape[-1]} matrices"
        )
    if min_float and A._dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.{name}: Expected a floating point or complex tensor as input. Got {scalar_type_name(A._dtype)}"
        )


def _first_zero_pivot(a: np.ndarray) -> int:
    """1-based index of the first zero pivot of LU with partial pivoting (LAPACK getrf's ``info``)."""
    u = np.array(a, np.float64)
    n = u.shape[0]
    first = 0
    for k in range(n):
        p = k + int(np.argmax(np.abs(u[k:, k])))
        if u[p, k] == 0:
            first = first or k + 1
            continue
        u[[k, p]] = u[[p, k]]
        u[k + 1 :, k:] -= np.outer(u[k + 1 :, k] / u[k, k], u[k, k:])
    return first


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape((int(np.prod(a.shape[:-2])),) + a.shape[-2:])


def _batch_prefix(a: np.ndarray, idx: int) -> str:
    return f"(Batch element {idx}): " if a.ndim > 2 else ""


def _inv_meta(A):
    _square_meta("inv", A)
    return (A._shape, A._dtype, A._device)


def _inv_ref(spec, A):
    a = A.astype(_compute_np(spec[1]), copy=False)
    flat = _flat(a)
    for i, m in enumerate(flat):
        k = _first_zero_pivot(m) if m.size else 0
        if k:
            raise LinAlgError(
                f"linalg.inv: {_batch_prefix(a, i)}The diagonal element {k} is zero, the inversion could not be "
                "completed because the input matrix is singular."
            )
    return np.linalg.inv(a) if a.size else np.empty(a.shape, a.dtype)


def _inv_backward(grad, result):
    r = result.mT
    return -matmul(matmul(r, grad), r)


@op(meta=_inv_meta, reference=_inv_ref, backward=_inv_backward, autocast="fp32", grad_fn_name="LinalgInvExBackward0")
def inv(A: Tensor) -> Tensor:
    """Inverse of a (batch of) square matrices; raises :class:`LinAlgError` for a singular one."""


def _det_meta(A):
    _square_meta("det", A)
    return (A._shape[:-2], A._dtype, A._device)


def _det_ref(spec, A):
    a = A.astype(_compute_np(spec[1]), copy=False)
    return np.asarray(np.linalg.det(a), a.dtype)


def _det_backward(grad, A, result):
    # d det = det * tr(A^-1 dA): written with solve's formula would be singular-unsafe; this one asks
    # for an invertible A (as the tests do)
    return (grad * result).unsqueeze(-1).unsqueeze(-1) * inv(A).mT


@op(meta=_det_meta, reference=_det_ref, backward=_det_backward, autocast="fp32", grad_fn_name="LinalgDetBackward0")
def det(A: Tensor) -> Tensor:
    """Determinant of a (batch of) square matrices."""


def _slogdet_meta(A):
    _square_meta("slogdet", A)
    s = (A._shape[:-2], A._dtype, A._device)
    return (s, s)


def _slogdet_ref(spec, A):
    a = A.astype(_compute_np(spec[0][1]), copy=False)
    sign, logabs = np.linalg.slogdet(a)
    return np.asarray(sign, a.dtype), np.asarray(logabs, a.dtype)


def _slogdet_backward(grads, A):
    g = grads[1]
    if g is None:
        return None
    return g.unsqueeze(-1).unsqueeze(-1) * inv(A).mT


@op(
    meta=_slogdet_meta,
    reference=_slogdet_ref,
    backward=_slogdet_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgSlogdetBackward0",
)
def _slogdet(A: Tensor) -> tuple[Tensor, Tensor]:
    """Sign and log of the absolute value of the determinant."""


_SlogdetResult = _return_type("linalg_slogdet", ("sign", "logabsdet"))


def slogdet(A: Tensor):
    """``(sign, logabsdet)`` of the determinant of a (batch of) square matrices (a named tuple)."""
    return _SlogdetResult(*_slogdet(A))


def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``X A = B`` with ``left=False``); ``B`` may be a (batch of)
    vector(s) as in ``torch.linalg.solve``."""
    _check_tensors("linalg_solve", A=A, B=B)
    _square_meta("solve", A)
    if A._dtype is not B._dtype:
        raise RuntimeError(
            f"linalg.solve: Expected A and B to have the same dtype, but found A of type "
            f"{scalar_type_name(A._dtype)} and B of type {scalar_type_name(B._dtype)} instead"
        )
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    n = A.shape[-1]
    rows = B.shape[-1] if vector else (B.shape[-1] if not left else B.shape[-2])
    if left and rows != n:
        cols = 1 if vector else B.shape[-1]
        raise RuntimeError(
            f"linalg.solve: Incompatible shapes of A and B for the equation AX = B ({n}x{n} and {rows}x{cols})"
        )
    try:
        Ai = inv(A)
    except LinAlgError:
        raise LinAlgError("kiln.linalg.solve: The solver failed because the input matrix is singular.") from None
    if not left:
        return matmul(B, Ai)
    if vector:
        return matmul(Ai, B.unsqueeze(-1)).squeeze(-1)
    return matmul(Ai, B)


def _cholesky_meta(A, upper=False):
    _square_meta("cholesky", A)
    return (A._shape, A._dtype, A._device)


def _cholesky_ref(spec, A, upper=False):
    a = A.astype(_compute_np(spec[1]), copy=False)
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    flat = _flat(a)
    out = np.empty_like(flat)
    for i, m in enumerate(flat):
        try:
            out[i] = np.linalg.cholesky(np.tril(m) + np.tril(m, -1).T)
        except np.linalg.LinAlgError:
            order = next(k for k in range(1, m.shape[0] + 1) if _not_pd(m[:k, :k]))
            raise LinAlgError(
                f"linalg.cholesky: {_batch_prefix(a, i)}The factorization could not be completed because the "
                f"input is not positive-definite (the leading minor of order {order} is not positive-definite)."
            ) from None
    out = out.reshape(a.shape)
    return np.swapaxes(out, -1, -2).copy() if upper else out


def _not_pd(m):
    try:
        np.linalg.cholesky(np.tril(m) + np.tril(m, -1).T)
    except np.linalg.LinAlgError:
        return True
    return False


def _cholesky_backward(grad, result, upper):
    # Murray (2016): with L lower, phi(X) = tril(X) with a halved diagonal,
    # gA = L^-H phi(L^H gL) L^-1, symmetrised.
    from kiln._ops.creation import eye

    L = result.mT if upper else result
    gL = grad.mT if upper else grad
    n = L.shape[-1]
    P = matmul(L.mT, gL)
    half = eye(n, dtype=L.dtype, device=L.device) * 0.5
    phi = P.tril() - P * half
    Li = inv(L)
    S = matmul(matmul(Li.mT, phi), Li)
    return (S + S.mT) * 0.5


@op(
    meta=_cholesky_meta,
    reference=_cholesky_ref,
    backward=_cholesky_backward,
    autocast="fp32",
    grad_fn_name="LinalgCholeskyExBackward0",
)
def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """Cholesky factor of a (batch of) symmetric positive-definite matrices (lower, or ``upper``)."""


Tensor.mv = mv
Tensor.dot = dot
Tensor.outer = outer
Tensor.ger = outer
Tensor.addmv = addmv
Tensor.addbmm = addbmm
Tensor.trace = trace


# ---------------------------------------------------------------------------------------- eigh / svd / qr


def _at_least_2d(name, A, square=False):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg_{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if square:
        _square_meta(name, A)
        return
    if A.dim() < 2:
        raise RuntimeError(f"linalg.{name}: The input tensor A must have at least 2 dimensions.")
    if A._dtype not in (dt.float32, dt.float64):
        raise RuntimeError(
            f"linalg.{name}: Expected a floating point or complex tensor as input. Got {scalar_type_name(A._dtype)}"
        )


def _zeros_or(g, like):
    return g if g is not None else _zeros_like(like)


def _eigh_meta(A, UPLO="L"):
    if isinstance(A, Tensor) and not A._dtype.is_floating_point:
        raise NotImplementedError(f"\"linalg_eigh_cpu\" not implemented for '{scalar_type_name(A._dtype)}'")
    _at_least_2d("eigh", A, square=True)
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return ((A._shape[:-1], A._dtype, A._device), (A._shape, A._dtype, A._device))


def _eigh_ref(spec, A, UPLO="L"):
    a = A.astype(_compute_np(spec[0][1]), copy=False)
    if a.size == 0:
        return np.empty(a.shape[:-1], a.dtype), np.empty(a.shape, a.dtype)
    w, v = np.linalg.eigh(a, UPLO=UPLO)
    return w.astype(a.dtype, copy=False), v.astype(a.dtype, copy=False)


# The engine hands multi-output formulas saved outputs it does not unpack, so these formulas recompute
# the decomposition from the input (differentiably, so higher-order gradients work).


def _eigh_backward(grads, A, UPLO):
    gL, gV = grads
    L, V = _eigh(A, UPLO)
    if gV is None:
        return matmul(V * _zeros_or(gL, L).unsqueeze(-2), V.mT)
    VhgV = matmul(V.mT, gV)
    VhgV = (VhgV - VhgV.mT) * 0.5
    from kiln._ops.creation import eye

    eye_n = eye(L.shape[-1], dtype=L.dtype, device=L.device)
    E = L.unsqueeze(-2) - L.unsqueeze(-1) + eye_n
    inner = VhgV / E * (1 - eye_n)
    if gL is not None:
        inner = inner + gL.unsqueeze(-1) * eye_n
    return matmul(matmul(V, inner), V.mT)


@op(
    meta=_eigh_meta,
    reference=_eigh_ref,
    backward=_eigh_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgEighBackward0",
)
def _eigh(A: Tensor, UPLO: str = "L") -> tuple[Tensor, Tensor]:
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix."""


_EighResult = _return_type("linalg_eigh", ("eigenvalues", "eigenvectors"))


def eigh(A: Tensor, UPLO: str = "L"):
    """``(eigenvalues, eigenvectors)`` of a (batch of) symmetric matrices, read from the ``UPLO`` triangle."""
    return _EighResult(*_eigh(A, UPLO))


def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    """Eigenvalues (ascending) of a (batch of) symmetric matrices."""
    return _eigh(A, UPLO)[0]


def _svd_meta(A, full_matrices=True):
    _at_least_2d("svd", A)
    m, n = A._shape[-2:]
    k = min(m, n)
    b = A._shape[:-2]
    u = (m, m) if full_matrices else (m, k)
    vh = (n, n) if full_matrices else (k, n)
    return ((b + u, A._dtype, A._device), (b + (k,), A._dtype, A._device), (b + vh, A._dtype, A._device))


def _svd_ref(spec, A, full_matrices=True):
    a = A.astype(_compute_np(spec[0][1]), copy=False)
    if a.size == 0:
        u = np.zeros(spec[0][0], a.dtype)
        vh = np.zeros(spec[2][0], a.dtype)
        for x in (u, vh):
            if x.size:
                x[...] = np.eye(x.shape[-1], dtype=a.dtype)
        return u, np.empty(spec[1][0], a.dtype), vh
    u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    return u.astype(a.dtype, copy=False), s.astype(a.dtype, copy=False), vh.astype(a.dtype, copy=False)


def _svd_backward(grads, A, full_matrices):
    gU, gS, gVh = grads
    U, S, Vh = _svd(A, full_matrices)
    m, n = U.shape[-2], Vh.shape[-1]
    k = S.shape[-1]
    if full_matrices:
        U = U.narrow(-1, 0, k)
        Vh = Vh.narrow(-2, 0, k)
        gU = gU.narrow(-1, 0, k) if gU is not None else None
        gVh = gVh.narrow(-2, 0, k) if gVh is not None else None
    if gU is None and gVh is None:
        return matmul(U * _zeros_or(gS, S).unsqueeze(-2), Vh)
    from kiln._ops.creation import eye

    gU = _zeros_or(gU, U)
    gVh = _zeros_or(gVh, Vh)
    eye_k = eye(k, dtype=S.dtype, device=S.device)
    UhgU = matmul(U.mT, gU)
    UhgU = UhgU - UhgU.mT
    VhgV = matmul(Vh, gVh.mT)
    VhgV = VhgV - VhgV.mT
    S2 = S * S
    E = S2.unsqueeze(-2) - S2.unsqueeze(-1) + eye_k
    gA = (UhgU * S.unsqueeze(-2) + S.unsqueeze(-1) * VhgV) / E * (1 - eye_k)
    if gS is not None:
        gA = gA + gS.unsqueeze(-1) * eye_k
    if m > n:
        gA = matmul(U, gA)
        gUSinv = gU / S.unsqueeze(-2)
        gA = gA + gUSinv - matmul(U, matmul(U.mT, gUSinv))
        return matmul(gA, Vh)
    if m < n:
        gA = matmul(gA, Vh)
        SinvgVh = gVh / S.unsqueeze(-1)
        gA = gA + SinvgVh - matmul(matmul(SinvgVh, Vh.mT), Vh)
        return matmul(U, gA)
    return matmul(U, matmul(gA, Vh))


@op(
    meta=_svd_meta,
    reference=_svd_ref,
    backward=_svd_backward,
    autocast="fp32",
    num_outputs=3,
    grad_fn_name="LinalgSvdBackward0",
)
def _svd(A: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Singular value decomposition ``A = U diag(S) Vh``."""


_SvdResult = _return_type("linalg_svd", ("U", "S", "Vh"))


def svd(A: Tensor, full_matrices: bool = True):
    """``(U, S, Vh)`` with ``A = U diag(S) Vh``, singular values descending."""
    return _SvdResult(*_svd(A, full_matrices))


def svdvals(A: Tensor) -> Tensor:
    """Singular values (descending) of a (batch of) matrices."""
    return _svd(A, False)[1]


def _qr_meta(A, mode="reduced"):
    _at_least_2d("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', or 'complete'"
        )
    m, n = A._shape[-2:]
    k = min(m, n)
    b = A._shape[:-2]
    q = (0,) if mode == "r" else b + ((m, m) if mode == "complete" else (m, k))
    r = b + ((m, n) if mode == "complete" else (k, n))
    return ((q, A._dtype, A._device), (r, A._dtype, A._device))


def _qr_ref(spec, A, mode="reduced"):
    a = A.astype(_compute_np(spec[0][1]), copy=False)
    if a.size == 0:
        q = np.zeros(spec[0][0], a.dtype)
        if q.ndim >= 2 and q.size:
            q[...] = np.eye(q.shape[-2], q.shape[-1], dtype=a.dtype)
        return q, np.zeros(spec[1][0], a.dtype)
    q, r = np.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        q = np.empty((0,), a.dtype)
    return q.astype(a.dtype, copy=False), r.astype(a.dtype, copy=False)


def _qr_backward(grads, A, mode):
    gQ, gR = grads
    m, n = A.shape[-2], A.shape[-1]
    if mode == "r" or (mode == "complete" and m > n):
        raise RuntimeError(
            "The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use "
            "linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr."
            if mode == "r"
            else "The QR decomposition is not differentiable when mode='complete' and nrows > ncols."
        )
    Q, R = _qr(A, mode)
    gQ = _zeros_or(gQ, Q)
    gR = _zeros_or(gR, R)
    if m >= n:
        return _qr_backward_tall(Q, R, gQ, gR)
    # wide: A = [X | Y] with X = Q U square; Y = Q V moves Q's gradient by Y gV^T (then X's square case)
    U = R[..., :, :m]
    gU, gV = gR[..., :, :m], gR[..., :, m:]
    gX = _qr_backward_tall(Q, U, gQ + matmul(A[..., :, m:], gV.mT), gU)
    from kiln._ops.shape import cat

    return cat([gX, matmul(Q, gV)], -1)


def _qr_backward_tall(Q, R, gQ, gR):
    """The gradient of ``A = Q R`` for ``m >= n`` (``R`` square and invertible)."""
    from kiln._ops.creation import eye

    n = R.shape[-1]
    t = (matmul(gR, R.mT) - matmul(Q.mT, gQ)).triu()
    sym = t + t.mT - t * eye(n, dtype=R.dtype, device=R.device)
    return matmul(matmul(Q, sym) + gQ, inv(R).mT)


@op(
    meta=_qr_meta,
    reference=_qr_ref,
    backward=_qr_backward,
    autocast="fp32",
    num_outputs=2,
    grad_fn_name="LinalgQrBackward0",
)
def _qr(A: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:
    """QR decomposition."""


_QrResult = _return_type("linalg_qr", ("Q", "R"))


def qr(A: Tensor, mode: str = "reduced"):
    """``(Q, R)`` with ``A = Q R`` (``mode``: ``'reduced'``, ``'complete'`` or ``'r'``)."""
    return _QrResult(*_qr(A, mode))


# ---------------------------------------------------------------------------------------- norms, vecdot, cross


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
    """Matrix norm over the two dims ``dim``: ``'fro'``, ``'nuc'``, ``±1``, ``±2``, ``±inf``."""
    from kiln._ops.reduction import amax, amin
    from kiln._ops.scans import vector_norm

    _check_tensors("linalg_matrix_norm", A=A)
    if A.dim() < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    if dtype is not None:
        A = A.to(dtype)
    if ord == "fro":
        return vector_norm(A, 2, dim, keepdim)
    if ord not in ("nuc", 1, -1, 2, -2, float("inf"), float("-inf")):
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    d0, d1 = (d % A.dim() for d in dim)
    x = A.movedim((d0, d1), (-2, -1))
    if ord == "nuc":
        r = svdvals(x).sum(-1)
    elif ord in (2, -2):
        s = svdvals(x)
        r = amax(s, -1) if ord == 2 else amin(s, -1)
    elif ord in (1, -1):
        c = x.abs().sum(-2)
        r = amax(c, -1) if ord == 1 else amin(c, -1)
    else:
        c = x.abs().sum(-1)
        r = amax(c, -1) if ord > 0 else amin(c, -1)
    if keepdim:
        for d in sorted((d0, d1)):
            r = r.unsqueeze(d)
    return r


def norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """``torch.linalg.norm``: a vector norm, or a matrix norm for a string ``ord`` or two ``dim``."""
    from kiln._ops.scans import vector_norm

    _check_tensors("linalg_norm", A=A)
    if dim is not None and not isinstance(dim, int):
        dim = tuple(dim)
    if ord is None:
        if dim is None:
            return vector_norm(A.reshape(-1) if keepdim is False else A, 2, None, keepdim, dtype=dtype)
        return vector_norm(A, 2, dim, keepdim, dtype=dtype)
    if dim is None:
        if A.dim() not in (1, 2):
            raise RuntimeError(
                f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. Got {A.dim()}D."
            )
        dim = (-2, -1) if A.dim() == 2 else -1
    if (isinstance(dim, tuple) and len(dim) == 2) or isinstance(ord, str):
        return matrix_norm(A, ord, dim, keepdim, dtype=dtype)
    return vector_norm(A, ord, dim, keepdim, dtype=dtype)


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
    if input.shape[dim] != 3 or other.shape[dim] != 3:
        raise RuntimeError(
            f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[dim]} and {other.shape[dim]}"
        )
    a = [input.select(dim, i) for i in range(3)]
    b = [other.select(dim, i) for i in range(3)]
    out = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    d = dim % max(input.dim(), other.dim())
    return stack(out, d)


Tensor.det = det
Tensor.inverse = inv
Tensor.slogdet = slogdet
inverse = inv
