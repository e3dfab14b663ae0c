"""Gather and scatter: ``gather``, ``scatter``/``scatter_add``, ``scatter_reduce``, ``take_along_dim`` and
the in-place variants (``scatter_``, ``scatter_add_``, ``scatter_reduce_``).

Index values are data, so out-of-range indices are found by the kernel (with PyTorch's messages);
everything else is checked in the meta functions. Backward formulas are written with these same ops
(``gather`` <-> ``scatter_add``), so higher-order gradients work. Also the index checks the other index
modules share (``_check_bounds``, ``_wrap_bounds``).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_shapes, scalar_type_name, wrap_dim
from kiln._ops.copy import inplace_variant
from kiln._ops.elementwise import _compute_np, where
from kiln._spec import DimSpec
from kiln._tensor import Tensor, _numel

__all__ = ["gather", "scatter", "scatter_add", "take_along_dim", "scatter_reduce"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


_INDEX_DTYPES = (dt.int32, dt.int64)


def _zeros(shape, like: Tensor) -> Tensor:
    from kiln._ops.creation import zeros

    return zeros(shape, dtype=like._dtype, device=like._device)


def _check_bounds(idx: np.ndarray, size: int, dim: int, exc=RuntimeError) -> None:
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        raise exc(f"index {int(idx[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")


def _wrap_bounds(idx: np.ndarray, size: int, dim: int, exc=RuntimeError) -> np.ndarray:
    """Negative indices count from the end (index_select/index_add/index_fill); others raise."""
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise exc(f"index {int(idx[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")
    return np.where(idx < 0, idx + size, idx)


# ---------------------------------------------------------------------------------------- gather / scatter


def _check_gather_shapes(name, input, dim, index, src=None):
    nd = max(len(input._shape), 1)
    d = wrap_dim(dim, len(input._shape))
    if index._dtype not in _INDEX_DTYPES:
        raise RuntimeError(f"{name.removesuffix('_add')}(): Expected dtype int32/int64 for index")
    if max(len(index._shape), 1) != nd:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    if _numel(index._shape) == 0:
        return d
    ishape = index._shape or (1,)
    sshape = input._shape or (1,)
    if isinstance(src, Tensor):
        srcshape = src._shape or (1,)
        if any((i != d and ishape[i] > sshape[i]) or ishape[i] > srcshape[i] for i in range(nd)):
            raise RuntimeError(
                f"Expected index {list(index._shape)} to be no larger than self {list(input._shape)} apart from "
                f"dimension {d} and to be no larger size than src {list(src._shape)}"
            )
    for i in range(nd):
        if i != d and ishape[i] > sshape[i]:
            raise RuntimeError(
                f"Size does not match at dimension {i} expected index {list(index._shape)} to be no larger than "
                f"self {list(input._shape)} apart from dimension {d}"
            )
    return d


def _gather_meta(input, dim, index, sparse_grad=False):
    d = _check_gather_shapes("gather", input, dim, index)
    return DimSpec((index._shape, input._dtype, input._device, d))


def _nd(a: np.ndarray) -> np.ndarray:
    return a.reshape(1) if a.ndim == 0 else a


def _gather_ref(spec, a, dim, index, sparse_grad=False):
    d = spec.dim
    a1, i1 = _nd(a), _nd(index).astype(np.int64)
    if i1.size == 0:
        return np.empty(spec.shape, a.dtype)
    _check_bounds(i1, a1.shape[d], d)
    a1 = a1[tuple(slice(0, s) if k != d else slice(None) for k, s in enumerate(i1.shape))]
    return np.take_along_axis(a1, i1, axis=d).reshape(spec.shape)


def _gather_backward(grad, input, dim, index):
    return scatter_add(_zeros(input._shape, grad), dim, index, grad), None


@op(tags=("index",), meta=_gather_meta, reference=_gather_ref, backward=_gather_backward, methods=("gather",))
def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """Values of ``input`` at ``index`` along ``dim``: ``out[i][j] = input[i][index[i][j]]`` (dim 1)."""


def _scatter_meta(name):
    def meta(input, dim, index, src=None, value=None):
        if isinstance(src, Tensor):
            d = _check_gather_shapes(name, input, dim, index, src)
            if src._dtype is not input._dtype:
                raise RuntimeError(f"{name.removesuffix('_add')}(): Expected self.dtype to be equal to src.dtype")
        else:
            d = _check_gather_shapes(name, input, dim, index)
        return DimSpec((input._shape, input._dtype, input._device, d))

    return meta


def _scatter_ref(accumulate):
    def ref(spec, a, dim, index, src=None, value=None):
        return into(spec, _nd(a).astype(_compute_np(spec.dtype), copy=True), dim, index, src, value)

    def into(spec, out, dim, index, src=None, value=None):
        """The write into ``out`` (``input``'s values in the compute dtype), checked first."""
        d = spec.dim
        compute = _compute_np(spec.dtype)
        out = _nd(out)
        i1 = _nd(index).astype(np.int64)
        if i1.size == 0:
            return out.reshape(spec.shape)
        _check_bounds(i1, out.shape[d], d)
        if src is None:
            src = value
        if isinstance(src, np.ndarray):
            s = _nd(src)[tuple(slice(0, n) for n in i1.shape)].astype(compute)
        else:
            s = np.broadcast_to(np.asarray(src).astype(compute), i1.shape)
        pos = list(np.indices(i1.shape, sparse=True))
        pos[d] = i1
        if accumulate:
            np.add.at(out, tuple(pos), s)
        else:
            out[tuple(pos)] = s
        return out.reshape(spec.shape)

    ref.write_into = into  # the reference in-place kernel writes into self's own array (kiln._reference)
    return ref


def _scatter_backward(grad, dim, index, needs_input_grad):
    g_src = gather(grad, dim, index) if needs_input_grad[2] else None  # a number src never needs one
    return scatter(grad, dim, index, 0.0) if needs_input_grad[0] else None, None, g_src


def _scatter_add_backward(grad, dim, index, needs_input_grad):
    return grad, None, gather(grad, dim, index) if needs_input_grad[2] else None


@op(
    tags=("index",),
    meta=_scatter_meta("scatter"),
    reference=_scatter_ref(False),
    backward=_scatter_backward,
    methods=("scatter",),
    grad_fn_name=lambda args: "ScatterBackward" + ("0" if isinstance(args[3], Tensor) else "1"),
)
def scatter(input: Tensor, dim: int, index: Tensor, src: Tensor | float | None = None, *, value=None) -> Tensor:
    """A copy of ``input`` with ``src`` (a tensor, or a scalar ``value``) written at ``index`` along ``dim``."""


@op(
    autocast="promote",
    tags=("index",),
    meta=_scatter_meta("scatter_add"),
    reference=_scatter_ref(True),
    backward=_scatter_add_backward,
    methods=("scatter_add",),
)
def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim`` (duplicate indices accumulate)."""


# ---------------------------------------------------------------------------------------- in place

for _fn in (scatter, scatter_add):  # PyTorch refuses an index or a source in self's memory
    _name = f"{_fn.op.name}_"
    _doc = f"In-place version of :func:`kiln.{_fn.op.name}`."
    setattr(Tensor, _name, inplace_variant(_fn, _name, _doc, False, {"index": "any", "src": "any"}))


# ---------------------------------------------------------------------------------------- composites


def take_along_dim(input, indices, dim=None):
    """``gather`` with broadcasting of ``input`` and ``indices`` (or, without ``dim``, on the flattened input)."""
    if indices._dtype is not dt.int64:
        raise RuntimeError(
            f"kiln.take_along_dim(): dtype of indices should be Long but got {scalar_type_name(indices._dtype)}"
        )
    if dim is None:
        return gather(input.view(-1), 0, indices.reshape(-1))  # a view, as PyTorch (non-contiguous input raises)
    nd = len(input._shape)
    if nd != len(indices._shape):
        raise RuntimeError(
            "kiln.take_along_dim(): input and indices should have the same number of dimensions, "
            f"but got {nd} dimensions for input, and {len(indices._shape)} dimensions for indices"
        )
    d = wrap_dim(dim, nd)
    ishape = list(input._shape)
    xshape = list(indices._shape)
    ishape[d] = xshape[d] = 1
    b = list(broadcast_shapes(tuple(ishape), tuple(xshape)))
    bi, bx = list(b), list(b)
    bi[d], bx[d] = input._shape[d], indices._shape[d]
    return gather(input.expand(tuple(bi)), d, indices.expand(tuple(bx)))


Tensor.take_along_dim = take_along_dim


# ---------------------------------------------------------------------------------------- scatter_reduce

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_meta(input, dim, index, src, reduce, include_self=True):
    if reduce not in _REDUCES:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _scatter_meta("scatter_reduce")(input, dim, index, src)


def _scatter_reduce_ref(spec, a, dim, index, src, reduce, include_self=True):
    d = spec.dim
    compute = _compute_np(spec.dtype)
    out = _nd(a).astype(compute, copy=True)
    i1 = _nd(index).astype(np.int64)
    if i1.size == 0:
        return out.reshape(spec.shape)
    _check_bounds(i1, out.shape[d], d)
    s = _nd(src)[tuple(slice(0, n) for n in i1.shape)].astype(compute)
    pos = list(np.indices(i1.shape, sparse=True))
    pos[d] = i1
    pos = tuple(pos)
    hit = np.zeros(out.shape, np.int64)
    np.add.at(hit, pos, 1)
    if not include_self:
        if reduce in ("sum", "mean"):
            ident = 0
        elif reduce == "prod":
            ident = 1
        elif compute.kind == "f":
            ident = -np.inf if reduce == "amax" else np.inf
        else:
            info = np.iinfo(compute) if compute.kind in "iu" else None
            ident = (info.min if reduce == "amax" else info.max) if info else (reduce == "amin")
        out[hit > 0] = ident
    ufunc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    ufunc.at(out, pos, s)
    if reduce == "mean":
        n = np.maximum(hit + (1 if include_self else 0), 1).astype(compute)
        out = out / n if compute.kind == "f" else np.floor_divide(out, n.astype(compute))
    return out.reshape(spec.shape)


def _scatter_reduce_backward(grad, input, dim, index, src, reduce, include_self, result):
    from kiln._ops.creation import ones

    hits = scatter_add(
        _zeros(input._shape, grad), dim, index, ones(index._shape, dtype=grad._dtype, device=grad.device)
    )
    scattered = hits > 0
    if reduce == "sum":
        return (grad if include_self else where(scattered, 0.0, grad)), None, gather(grad, dim, index)
    if reduce == "mean":
        n = (hits + 1 if include_self else hits).clamp_min(1)
        g = grad / n
        return (g if include_self else where(scattered, 0.0, grad)), None, gather(g, dim, index)
    if reduce == "prod":
        # d(product)/d(element) is the product of the others: result / element for a non-zero element; for a
        # zero, the product of the group's non-zero elements if it is the group's only zero, else 0
        z_self, z_src = input == 0, src == 0
        zeros = scatter_add(
            z_self.to(grad._dtype) if include_self else _zeros(input._shape, grad), dim, index, z_src.to(grad._dtype)
        )
        nonzero_prod = scatter_reduce(
            where(z_self, 1.0, input), dim, index, where(z_src, 1.0, src), "prod", include_self=include_self
        )
        lone_zero = where(zeros == 1, nonzero_prod, 0.0)
        d_self = where(z_self, lone_zero, result / where(z_self, 1.0, input))
        d_src = where(z_src, gather(lone_zero, dim, index), gather(result, dim, index) / where(z_src, 1.0, src))
        g_self = where(scattered, grad * d_self, grad) if include_self else where(scattered, 0.0, grad)
        return g_self, None, gather(grad, dim, index) * d_src
    # amax / amin: the gradient is shared evenly among the entries equal to the result (PyTorch's formula)
    self_is = input == result
    src_is = src == gather(result, dim, index)
    count = scatter_add(self_is.to(grad._dtype), dim, index, src_is.to(grad._dtype))
    g = grad / count
    g_self = where(self_is, g, 0.0)
    if not include_self:
        g_self = where(scattered, 0.0, g_self)
    return g_self, None, where(src_is, gather(g, dim, index), 0.0)


@op(
    tags=("index",),
    meta=_scatter_reduce_meta,
    reference=_scatter_reduce_ref,
    backward=_scatter_reduce_backward,
    methods=("scatter_reduce",),
    grad_fn_name="ScatterReduceBackward0",
)
def scatter_reduce(
    input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
) -> Tensor:
    """A copy of ``input`` with ``src`` reduced (sum, prod, mean, amax, amin) into it at ``index`` along ``dim``."""


Tensor.scatter_reduce_ = inplace_variant(
    scatter_reduce, "scatter_reduce_", "In-place version of :func:`kiln.scatter_reduce`.", True
)
