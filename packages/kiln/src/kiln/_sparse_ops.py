"""The operations on sparse COO tensors (``kiln._sparse``), written in differentiable kiln ops on the values.

Positions are handled as linear indices (row-major over the sparse dims, int64); ``coalesce`` sorts and
merges them with ``unique``. Values move with ``index_add`` (sums) and ``index_select`` (gathers), whose
backward formulas are each other, so every function here differentiates with respect to the values (and
the dense operands) through kiln's own autograd.

:func:`dispatch_sparse` is where the dispatcher sends an op that met a sparse argument: the ops of
:data:`SPARSE_OPS` run here, every other op raises PyTorch's ``NotImplementedError``.
"""

from __future__ import annotations

import math
import numbers

import kiln
from kiln import _dtype as dt
from kiln._ops._meta import reduce_dims, scalar_type_name
from kiln._sparse import SparseTensor, _make_sparse
from kiln._tensor import Tensor, _wrap_dim

_INT64_MAX = 2**63 - 1


def _sparse_sizes(s: SparseTensor) -> tuple[int, ...]:
    return s._sp_size[: s._sp_indices._shape[0]]


def linear_index(indices: Tensor, sizes: tuple[int, ...]) -> Tensor:
    """The row-major position of each column of ``indices`` ([len(sizes), nnz]) in a tensor of ``sizes``."""
    if math.prod(sizes) > _INT64_MAX:
        raise RuntimeError(f"sparse tensor of sparse sizes {list(sizes)} has more positions than int64 can index")
    strides, acc = [], 1
    for n in reversed(sizes):
        strides.append(acc)
        acc *= n
    strides.reverse()
    if not sizes:
        return kiln.zeros(indices._shape[1], dtype=dt.int64, device=indices._device)
    w = kiln.tensor(strides, dtype=dt.int64, device=indices._device)
    return (indices * w.unsqueeze(1)).sum(0)


def unravel(lin: Tensor, sizes: tuple[int, ...]) -> Tensor:
    """The ``[len(sizes), n]`` indices of row-major positions ``lin`` in a tensor of ``sizes``."""
    if not sizes:
        return kiln.zeros((0, lin._shape[0]), dtype=dt.int64, device=lin._device)
    rows, acc = [], 1
    for n in reversed(sizes):
        rows.append((lin // acc) % max(n, 1))
        acc *= n
    return kiln.stack(rows[::-1])


def _sum_into(n: int, index: Tensor, values: Tensor) -> Tensor:
    """``out[index[k]] += values[k]`` into zeros of ``[n, *values.shape[1:]]`` (booleans: any)."""
    if values._dtype is dt.bool:
        return _sum_into(n, index, values.to(dt.int64)) != 0
    zeros = kiln.zeros((n, *values._shape[1:]), dtype=values._dtype, device=values._device)
    return zeros.index_add(0, index, values)


def coalesce(s: SparseTensor) -> SparseTensor:
    """``s`` with duplicate positions summed and the indices sorted (``s`` itself if already coalesced)."""
    if s._sp_coalesced:
        return s
    sizes = _sparse_sizes(s)
    uniq, inverse = kiln.unique(linear_index(s._sp_indices, sizes), return_inverse=True)
    values = _sum_into(uniq._shape[0], inverse, s._sp_values)
    return _make_sparse(unravel(uniq, sizes), values, s._sp_size, True)


def to_dense(s: SparseTensor, dtype: dt.dtype | None = None) -> Tensor:
    """The strided tensor that ``s`` stands for (duplicates summed)."""
    if dtype is not None:
        raise RuntimeError("dtype argument is not supported by sparse_to_dense")
    values = s._sp_values
    sizes = _sparse_sizes(s)
    flat = _sum_into(math.prod(sizes), linear_index(s._sp_indices, sizes), values)
    return flat.reshape(s._sp_size)


def dense_to_sparse(x: Tensor, sparse_dim: int | None) -> SparseTensor:
    """The nonzero entries of a strided ``x`` (a sparse dim entry is kept if any of its dense part is nonzero)."""
    nd = x.dim()
    sd = nd if sparse_dim is None else sparse_dim
    if isinstance(sd, bool) or not isinstance(sd, int):
        raise TypeError(f"to_sparse(): argument 'sparse_dim' must be int, not {type(sd).__name__}")
    if not 0 <= sd <= nd:
        raise RuntimeError(f"dense_to_sparse: sparse_dim argument must be in [0,{nd}] range, but {sd} is given")
    if sd == 0 and nd > 0:
        raise RuntimeError("dense_to_sparse: sparse_dim argument must be in >0 when self.dim()>0")
    sizes, rest = x._shape[:sd], x._shape[sd:]
    flat = x.reshape((math.prod(sizes), *rest))
    mask = flat.detach() != 0
    if rest:
        mask = mask.reshape(mask._shape[0], -1).any(1)
    lin = mask.nonzero().reshape(-1)
    return _make_sparse(unravel(lin, sizes), flat.index_select(0, lin), x._shape, True)


# ---------------------------------------------------------------------------------------- products


def _check_matrix(s: SparseTensor, what: str) -> None:
    if s.sparse_dim() != 2 or s.dense_dim() != 0:
        if s.dense_dim():
            raise RuntimeError(f"{what}: hybrid sparse tensors (dense_dim > 0) are not supported by kiln")
        raise RuntimeError(f"addmm: matrices expected, got {s.dim()}D tensor")


def _sparse_times_dense(s: SparseTensor, d: Tensor, what: str) -> Tensor:
    """``s @ d`` for a sparse matrix ``s`` and a dense matrix or vector ``d``."""
    _check_matrix(s, what)
    if isinstance(d, SparseTensor):
        raise NotImplementedError(f"{what}: the product of two sparse tensors is not supported by kiln")
    if not isinstance(d, Tensor):
        raise TypeError(f"{what}(): argument 'mat2' must be Tensor, not {type(d).__name__}")
    n, m = s._sp_size
    if d.dim() not in (1, 2):
        raise RuntimeError(f"{what}: expected a dense matrix or vector, got a {d.dim()}D tensor")
    if d._shape[0] != m:
        raise RuntimeError(f"addmm: Argument #3 (dense): Expected dim 0 size {m}, got {d._shape[0]}")
    if d._dtype is not s._dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(s._dtype)} but found {scalar_type_name(d._dtype)}")
    if d._device != s._device:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {s._device} and "
            f"{d._device}!"
        )
    row, col = s._sp_indices[0], s._sp_indices[1]
    values = s._sp_values if d.dim() == 1 else s._sp_values.unsqueeze(1)
    return _sum_into(n, row, values * d.index_select(0, col))


def sparse_mm(mat1: Tensor, mat2: Tensor) -> Tensor:
    """``mat1 @ mat2`` with a sparse COO operand: sparse @ dense, or dense @ sparse (dense result)."""
    if isinstance(mat1, SparseTensor):
        return _sparse_times_dense(mat1, mat2, "mm")
    if isinstance(mat2, SparseTensor):
        if not isinstance(mat1, Tensor) or mat1.dim() != 2:
            raise RuntimeError("mm: expected a dense matrix as the first argument")
        return _sparse_times_dense(transpose(mat2, 0, 1), mat1.t(), "mm").t()
    return kiln.mm(mat1, mat2)


def sparse_addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)``: ``mat1`` sparse, ``input`` and ``mat2`` dense."""
    if (
        not isinstance(mat1, SparseTensor)
        and not isinstance(input, SparseTensor)
        and not isinstance(mat2, SparseTensor)
    ):
        return kiln.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    if not isinstance(mat1, SparseTensor) or isinstance(input, SparseTensor) or isinstance(mat2, SparseTensor):
        raise NotImplementedError("addmm: kiln supports a sparse mat1 with a dense input and mat2 only")
    out = _sparse_times_dense(mat1, mat2, "addmm")
    if alpha != 1:
        out = out * alpha
    if beta == 0:  # input ignored (nan and inf included), as PyTorch
        return out + kiln.zeros_like(input)
    return out + (input if beta == 1 else input * beta)


def _matmul(input, other) -> Tensor:
    if isinstance(input, SparseTensor):
        return _sparse_times_dense(input, other, "matmul")
    if isinstance(input, Tensor) and input.dim() == 1:
        return _sparse_times_dense(transpose(other, 0, 1), input, "matmul")
    if isinstance(input, Tensor) and input.dim() == 2:
        return sparse_mm(input, other)
    raise NotImplementedError("matmul: kiln supports a sparse matrix times a dense matrix or vector, and back")


# ---------------------------------------------------------------------------------------- reductions


def sparse_sum(input: Tensor, dim=None, keepdim: bool = False, dtype: dt.dtype | None = None) -> Tensor:
    """The sum over ``dim`` (all dims: a dense scalar). Summing every sparse dim gives a dense tensor,
    summing some of them a coalesced sparse one."""
    if not isinstance(input, SparseTensor):
        raise RuntimeError("coalesce expected sparse coordinate tensor layout but got Strided")
    values = input._sp_values if dtype is None else input._sp_values.to(dtype)
    if dim is None and not keepdim:
        return values.sum()
    nd, sd = input.dim(), input.sparse_dim()
    dims = reduce_dims(dim, nd)
    summed_sparse = [d for d in dims if d < sd]
    summed_dense = [d - sd + 1 for d in dims if d >= sd]
    if summed_dense:
        values = values.sum(summed_dense, keepdim=keepdim)
    size = input._sp_size
    new_size = tuple(1 if d in dims else n for d, n in enumerate(size)) if keepdim else None
    if len(summed_sparse) == sd:
        out = values.sum(0)
        return out.reshape(new_size) if keepdim else out
    if not summed_sparse:
        return _make_sparse(input._sp_indices, values, new_size or _drop(size, dims), input._sp_coalesced)
    kept = [d for d in range(sd) if d not in summed_sparse]
    indices = input._sp_indices
    if keepdim:
        indices = indices * kiln.tensor([d in kept for d in range(sd)], device=indices._device).unsqueeze(1)
    else:
        indices = indices.index_select(0, kiln.tensor(kept, dtype=dt.int64, device=indices._device))
    return coalesce(_make_sparse(indices, values, new_size or _drop(size, dims), False))


def _drop(size: tuple, dims: tuple) -> tuple:
    return tuple(n for d, n in enumerate(size) if d not in dims)


def sparse_softmax(input: Tensor, dim: int, dtype: dt.dtype | None = None, *, log: bool = False) -> Tensor:
    """Softmax (``log``: log-softmax) over ``dim`` among the stored entries only (the missing ones count as
    minus infinity), on the coalesced tensor: a sparse result on the same indices."""
    name = "log_softmax" if log else "softmax"
    if not isinstance(input, SparseTensor):
        raise NotImplementedError(f"Could not run 'aten::_sparse_{name}' with arguments from the 'CPU' backend.")
    dim = _wrap_dim(dim, input.dim())
    s = coalesce(input if dtype is None else input.to(dtype))
    values = s._sp_values
    if not values._dtype.is_floating_point:
        raise NotImplementedError(f"\"{name}\" not implemented for '{scalar_type_name(values._dtype)}'")
    sd = s.sparse_dim()
    if dim >= sd:  # along a dense dim: each entry's values on their own
        out = (kiln.log_softmax if log else kiln.softmax)(values, dim - sd + 1)
        return _make_sparse(s._sp_indices, out, s._sp_size, True)
    # groups: the entries that share every sparse index but the one along dim
    others = [d for d in range(sd) if d != dim]
    key = linear_index(
        s._sp_indices.index_select(0, kiln.tensor(others, dtype=dt.int64, device=values._device)),
        tuple(s._sp_size[d] for d in others),
    )
    groups, group = kiln.unique(key, return_inverse=True)
    g = group.reshape((-1,) + (1,) * (values.dim() - 1)).expand(values._shape)
    # the shift makes exp safe; softmax does not depend on it, so it needs no gradient
    top = kiln.zeros((groups._shape[0], *values._shape[1:]), dtype=values._dtype, device=values._device)
    top = top.scatter_reduce(0, g, values.detach(), "amax", include_self=False)
    shifted = values - top.index_select(0, group)
    exp = shifted.exp()
    total = _sum_into(groups._shape[0], group, exp).index_select(0, group)
    out = shifted - total.log() if log else exp / total
    return _make_sparse(s._sp_indices, out, s._sp_size, True)


# ---------------------------------------------------------------------------------------- elementwise


def _scalar(other) -> bool:
    return (isinstance(other, numbers.Number) and not isinstance(other, SparseTensor)) or (
        isinstance(other, Tensor) and not isinstance(other, SparseTensor) and other.dim() == 0
    )


def _with_values(s: SparseTensor, values: Tensor) -> SparseTensor:
    return _make_sparse(s._sp_indices, values, s._sp_size, s._sp_coalesced)


def _add(input, other, alpha=1, op="add") -> Tensor:
    if isinstance(input, SparseTensor) and isinstance(other, SparseTensor):
        if input._sp_size != other._sp_size:
            raise RuntimeError(
                f"{op}: expected sizes of 'self' and 'other' to match, but {list(input._sp_size)} != "
                f"{list(other._sp_size)}"
            )
        if input.sparse_dim() != other.sparse_dim():
            raise RuntimeError(
                f"{op}: expected 'self' and 'other' to have same sparse dimensions, but got "
                f"{input.sparse_dim()} and {other.sparse_dim()}"
            )
        result = dt.promote_types(input._dtype, other._dtype)
        a, b = input._sp_values.to(result), other._sp_values.to(result)
        if alpha != 1:
            b = b * alpha
        if input._sp_indices is other._sp_indices:  # the same pattern: add the values
            return _make_sparse(input._sp_indices, a + b, input._sp_size, input._sp_coalesced)
        out = _make_sparse(kiln.cat([input._sp_indices, other._sp_indices], 1), kiln.cat([a, b]), input._sp_size, False)
        return coalesce(out) if input._sp_coalesced and other._sp_coalesced else out
    if isinstance(other, SparseTensor) and isinstance(input, Tensor):
        if input._shape != other._sp_size:
            raise RuntimeError(
                f"{op}: expected 'self' and 'other' to have same size, but self has size {list(input._shape)} while "
                f"other has size {list(other._sp_size)} (FYI: dense-sparse addition does not currently support "
                "broadcasting)"
            )
        result = dt.promote_types(input._dtype, other._dtype)
        sizes = _sparse_sizes(other)
        flat = input.to(result).reshape((math.prod(sizes), *other._sp_size[len(sizes) :]))
        lin = linear_index(other._sp_indices, sizes)
        return flat.index_add(0, lin, other._sp_values.to(result), alpha=alpha).reshape(input._shape)
    if isinstance(input, SparseTensor):
        raise RuntimeError(f"{op}(sparse, dense) is not supported. Use {op}(dense, sparse) instead.")
    return _unsupported(op, (input, other))


def _sub(input, other, alpha=1) -> Tensor:
    return _add(input, other, -alpha, "sub")


def _mul(input, other) -> Tensor:
    if isinstance(input, SparseTensor) and _scalar(other):
        return _with_values(input, input._sp_values * other)
    if isinstance(other, SparseTensor) and _scalar(input):
        return _with_values(other, input * other._sp_values)
    raise NotImplementedError(
        "mul: kiln multiplies a sparse tensor by a number or a 0-d tensor only (multiply .values(), or use .to_dense())"
    )


def _div(input, other, rounding_mode=None) -> Tensor:
    if isinstance(input, SparseTensor) and _scalar(other):
        s = input if rounding_mode is None else coalesce(input)  # rounding is not linear: sum duplicates first
        return _with_values(s, s._sp_values.div(other, rounding_mode=rounding_mode))
    return _unsupported("div", (input, other))


def transpose(input: SparseTensor, dim0: int, dim1: int) -> SparseTensor:
    """``input`` with two sparse dims swapped (uncoalesced, as PyTorch's)."""
    nd, sd = input.dim(), input.sparse_dim()
    d0, d1 = _wrap_dim(dim0, nd), _wrap_dim(dim1, nd)
    if d0 >= sd or d1 >= sd:
        raise RuntimeError(
            f"sparse transpose: transposed dimensions must be sparse Got sparse_dim: {sd}, d0: {d0}, d1: {d1}"
        )
    order = list(range(sd))
    order[d0], order[d1] = order[d1], order[d0]
    size = list(input._sp_size)
    size[d0], size[d1] = size[d1], size[d0]
    indices = input._sp_indices.index_select(0, kiln.tensor(order, dtype=dt.int64, device=input._device))
    values = input._sp_values.view(input._sp_values._shape)  # an object of its own
    return _make_sparse(indices, values, tuple(size), input._sp_coalesced and d0 == d1)


def _t(input: SparseTensor) -> SparseTensor:
    sd, dd = input.sparse_dim(), input.dense_dim()
    if sd > 2 or dd > 0:
        raise RuntimeError(
            f"t() expects a tensor with <= 2 sparse and 0 dense dimensions, but got {sd} sparse and {dd} dense "
            "dimensions"
        )
    return transpose(input, 0, 1) if sd == 2 else _with_values(input, input._sp_values.view(input._sp_values._shape))


def _clone(input, memory_format=None) -> SparseTensor:
    name = getattr(memory_format, "name", None)
    if memory_format is not None and name != "preserve_format":
        raise RuntimeError(f"unsupported memory format option {'Contiguous' if name == 'contiguous_format' else name}")
    return _make_sparse(input._sp_indices.clone(), input._sp_values.clone(), input._sp_size, input._sp_coalesced)


SPARSE_OPS = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "div": _div,
    "neg": lambda input: _with_values(input, -input._sp_values),
    "matmul": _matmul,
    "addmm": lambda input, mat1, mat2, beta, alpha: sparse_addmm(input, mat1, mat2, beta=beta, alpha=alpha),
    "transpose": transpose,
    "t": _t,
    "sum": sparse_sum,
    "clone": _clone,
}
"""The ops (kiln op names) that accept sparse COO arguments, each with its implementation."""


def dispatch_sparse(opdef, args: tuple):
    """Run op ``opdef`` on ``args``, among which is a sparse tensor (the dispatcher calls this when the op's
    meta function met one)."""
    impl = SPARSE_OPS.get(opdef.name)
    try:
        if impl is None:
            return _unsupported(opdef.name, args)
        return impl(*args)
    except Exception as exc:  # raised while the dispatcher handles SparseArgument: not a consequence of it
        exc.__suppress_context__ = True
        raise


def _unsupported(name: str, args) -> Tensor:
    flat = [a for x in args for a in (x if isinstance(x, (list, tuple)) else (x,))]
    s = next((a for a in flat if isinstance(a, SparseTensor)), None)
    backend = f"Sparse{s._device.type.upper()}" if s is not None else "CPU"
    raise NotImplementedError(
        f"Could not run 'aten::{name}' with arguments from the '{backend}' backend. kiln supports few operations "
        "on sparse COO tensors (see kiln.sparse); convert with .to_dense() first."
    )


# ---------------------------------------------------------------------------------------- gradients


def grad_of_values(s: SparseTensor) -> SparseTensor | None:
    """``s.grad``: the gradient accumulated on the values, on the coalesced indices (duplicates, which see
    the gradient of one position each, averaged)."""
    g = s._sp_values.grad
    if g is None:
        return None
    if s._sp_coalesced:
        return _make_sparse(s._sp_indices, g, s._sp_size, True)
    sizes = _sparse_sizes(s)
    uniq, inverse = kiln.unique(linear_index(s._sp_indices, sizes), return_inverse=True)
    total = _sum_into(uniq._shape[0], inverse, g)
    count = kiln.bincount(inverse, minlength=uniq._shape[0]).to(g._dtype)
    return _make_sparse(unravel(uniq, sizes), total / count.reshape((-1,) + (1,) * (g.dim() - 1)), s._sp_size, True)


def set_grad_of_values(s: SparseTensor, value) -> None:
    """``s.grad = value``: None, or a sparse gradient of ``s``'s size and dtype whose entries lie on ``s``'s
    positions (kiln keeps a sparse leaf's gradient on its values)."""
    values = s._sp_values
    if value is None:
        values.grad = None
        return
    if not isinstance(value, SparseTensor):
        if isinstance(value, Tensor):
            raise RuntimeError("attempting to assign a gradient to a tensor that has data of a different type")
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
    if value._sp_size != s._sp_size or value.sparse_dim() != s.sparse_dim():
        raise RuntimeError(
            f"attempting to assign a gradient of size '{list(value._sp_size)}' to a tensor of size "
            f"'{list(s._sp_size)}'. Please ensure that the gradient and the tensor are the same size"
        )
    sizes = _sparse_sizes(s)
    g = coalesce(value)
    g_lin = linear_index(g._sp_indices, sizes)
    own = linear_index(s._sp_indices, sizes)
    n = g_lin._shape[0]
    if n:
        mine = kiln.unique(own)
        at = kiln.searchsorted(mine, g_lin).clamp(max=max(mine._shape[0] - 1, 0))
        if mine._shape[0] == 0 or not bool((mine.index_select(0, at) == g_lin).all()):
            raise RuntimeError(
                "kiln keeps a sparse tensor's gradient on its own indices: the assigned gradient has entries at "
                "positions the tensor does not store"
            )
    pos = kiln.searchsorted(g_lin, own).clamp(max=n)
    found = pos < n
    if n:
        found = found & (g_lin.index_select(0, pos.clamp(max=n - 1)) == own)
    padded = kiln.cat(
        [g._sp_values.detach(), kiln.zeros((1, *g._sp_values._shape[1:]), dtype=g._dtype, device=g._device)]
    )
    values.grad = padded.index_select(0, kiln.where(found, pos, n))


# ---------------------------------------------------------------------------------------- repr


def format_sparse(s: SparseTensor) -> str:
    """PyTorch's repr of a sparse COO tensor, with kiln's names."""
    from kiln._format import _add_suffixes

    prefix = "tensor("
    indent = len(prefix)
    text = (
        f"{prefix}indices=tensor({_body(s._sp_indices, indent + len('indices=tensor('))}),\n"
        f"{' ' * indent}values=tensor({_body(s._sp_values, indent + len('values=tensor('))})"
    )
    suffixes = []
    if s._device.type != "cpu":
        suffixes.append(f"device='{s._device}'")
    suffixes += [f"size={tuple(s._sp_size)}", f"nnz={s._nnz()}"]
    if s._dtype not in (dt.get_default_dtype(), dt.int64, dt.bool):
        suffixes.append(f"dtype={s._dtype!r}")
    suffixes.append("layout=kiln.sparse_coo")
    if s.grad_fn is not None:
        suffixes.append(f"grad_fn=<{s.grad_fn.name()}>")
    elif s._requires_grad:
        suffixes.append("requires_grad=True")
    # the first suffix always starts a line of its own, as PyTorch's sparse repr
    return _add_suffixes(f"{text},\n{' ' * indent}{suffixes[0]}", suffixes[1:], indent)


def _body(t: Tensor, indent: int) -> str:
    """The bracketed elements of dense ``t`` whose first bracket is at column ``indent`` (``[], size=...`` if
    empty)."""
    import numpy as np

    from kiln._format import OPTIONS, _fmt, _Formatter, _summarized
    from kiln._ops.copy import host_array

    a = host_array(t.detach())
    if t._dtype in (dt.float16, dt.bfloat16):
        a = a.astype(np.float32)
    if a.size == 0:
        return f"[], size={tuple(a.shape)}"
    kind = "bool" if t._dtype is dt.bool else "float" if t._dtype.is_floating_point else "int"
    summarize = a.size > OPTIONS.threshold
    return _fmt(a, _Formatter(_summarized(a) if summarize else a.reshape(-1), kind), indent, summarize)
