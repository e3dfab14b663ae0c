"""More products, composites over :func:`kiln.matmul` and the elementwise ops (their gradients come from
those ops' formulas): ``cross`` (``torch.cross``, whose ``dim`` defaults to the first dim of size 3),
``kron``, ``inner``, ``vdot``, ``addr``, ``multi_dot``/``chain_matmul``, ``cdist`` and ``dist``; and the
in-place forms of the products (``addmm_``, ``baddbmm_``, ``addmv_``, ``addbmm_``, ``addr_``: the result written
into ``self`` with ``copy_``; in-place variants on op records are for pointwise ops only).
"""

from __future__ import annotations

import inspect
import warnings

from kiln import _dtype as dt
from kiln._ops._meta import check_inplace, result_type, scalar_type_name
from kiln._ops.elementwise import sub
from kiln._ops.linalg import matmul
from kiln._ops.math_args import _TYPEMETA_NAMES, _need_tensor
from kiln._ops.products import _check_tensors, _expand_check, _scaled_sum, addbmm, addmm, addmv, baddbmm, dot, outer
from kiln._ops.products import cross as _linalg_cross
from kiln._tensor import Tensor

__all__ = ["cross", "kron", "inner", "vdot", "addr", "chain_matmul", "multi_dot", "cdist", "dist"]

TOP_LEVEL = ("addr", "cdist", "chain_matmul", "cross", "dist", "inner", "kron", "vdot")
"""The names ``kiln`` exports at its top level (as ``torch`` does); ``multi_dot`` is ``kiln.linalg``'s."""


def cross(input: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """Cross product of 3-vectors along ``dim`` (``kiln.cross``): without ``dim`` (deprecated, with a warning)
    the first dim of ``input`` of size 3; the inputs broadcast and must have one dtype."""
    _check_tensors("cross", input=input, other=other)
    if dim is None:
        warnings.warn(
            "Using kiln.cross without specifying the dim arg is deprecated.\nPlease either pass the dim explicitly "
            "or simply use kiln.linalg.cross.\nThe default value of dim will change to agree with that of "
            "linalg.cross in a future release.",
            UserWarning,
            stacklevel=2,
        )
        dim = next((i for i, s in enumerate(input.shape) if s == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    return _linalg_cross(input, other, dim=dim)


def kron(input: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product: the block tensor of ``input[i] * other`` (the shorter shape padded with leading
    ones), promoting dtypes."""
    _need_tensor(input, "input", 1, "kron")
    _need_tensor(other, "other", 2, "kron")
    nd = max(input.dim(), other.dim())
    a_shape = (1,) * (nd - input.dim()) + tuple(input.shape)
    b_shape = (1,) * (nd - other.dim()) + tuple(other.shape)
    a = input.reshape([s for n in a_shape for s in (n, 1)])
    b = other.reshape([s for n in b_shape for s in (1, n)])
    return (a * b).reshape([m * n for m, n in zip(a_shape, b_shape)])


def inner(input: Tensor, other: Tensor) -> Tensor:
    """Inner product over the last dims (a 0-d operand scales the other): ``out[i..., j...] = sum_k
    input[i..., k] * other[j..., k]``; both tensors of one dtype."""
    _need_tensor(input, "input", 1, "inner")
    _need_tensor(other, "other", 2, "inner")
    if input.dim() == 0 or other.dim() == 0:
        return input * other
    if input.dtype is not other.dtype:
        raise RuntimeError("both inputs should have same dtype")
    if input.shape[-1] != other.shape[-1]:
        raise RuntimeError(
            f"inner() the last dimension must match on both input tensors but got shapes {list(input.shape)} and "
            f"{list(other.shape)}"
        )
    from kiln._ops.products import tensordot

    return tensordot(input, other, ([-1], [-1]))


def vdot(input: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-D tensors of one dtype (``torch.vdot``; no conjugation, kiln being real)."""
    _check_tensors("vdot", input=input, other=other)
    return dot(input, other)


def addr(input: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * outer(vec1, vec2)`` (``input`` broadcasts to the outer product; with
    ``beta == 0`` its values, NaN included, are ignored); dtypes promote, bools compute ``or``/``and``."""
    _check_tensors("addr", input=input, vec1=vec1, vec2=vec2)
    for name, v in (("vec1", vec1), ("vec2", vec2)):
        if v.dim() != 1:
            raise RuntimeError(f"addr: Expected 1-D argument {name}, but got {v.dim()}-D")
    prod = outer(vec1, vec2)
    d = result_type(input, prod)
    for name, value in (("beta", beta), ("alpha", alpha)):
        if isinstance(value, bool) and d is not dt.bool:
            raise RuntimeError(f"Boolean {name} only supported for Boolean results.")
        if not d.is_floating_point and isinstance(value, float):
            raise RuntimeError(f"For integral input tensors, argument {name} must not be a floating point number.")
    if d is dt.bool:  # (beta and input) or (alpha and vec1 (x) vec2)
        _expand_check(tuple(input.shape), tuple(prod.shape))
        out = prod & bool(alpha)
        return out | (input & bool(beta))
    return _scaled_sum(input, prod, beta, alpha)


def _inplace_product(fn, name: str):
    """The in-place form of a composite product: the out-of-place result written into ``self`` with
    ``copy_`` (which moves ``self``'s autograd history); the formulas never read ``self``'s old value."""

    def method(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        check_inplace(self, out._shape, out._dtype)
        return self.copy_(out)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"In-place version of :func:`kiln.{name[:-1]}`."
    method.__signature__ = inspect.signature(fn)
    return method


# ---------------------------------------------------------------------------------------- multi_dot


def _chain_order(dims: list[int]) -> list[list[int]]:
    """The split table of the cheapest parenthesisation of matrices ``dims[i] x dims[i + 1]`` (dynamic
    programming over the number of scalar multiplications)."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k
    return split


def _multiply_chain(mats, split, i, j):
    if i == j:
        return mats[i]
    k = split[i][j]
    return matmul(_multiply_chain(mats, split, i, k), _multiply_chain(mats, split, k + 1, j))


def multi_dot(tensors, *, out=None) -> Tensor:
    """The product of two or more matrices in the cheapest order (``torch.linalg.multi_dot``); the first and
    the last may be vectors (a row and a column vector), whose dims the result drops."""
    if out is not None:
        raise NotImplementedError("kiln.linalg.multi_dot: out= is not supported")
    tensors = list(tensors)
    n = len(tensors)
    if n < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {n}")
    for i, t in enumerate(tensors):
        _need_tensor(t, "tensors", 1, "linalg_multi_dot")
        if 0 < i < n - 1 and t.dim() != 2:
            raise RuntimeError(f"multi_dot(): tensor {i} must be 2D but got {t.dim()}D")
    first, last = tensors[0], tensors[-1]
    if first.dim() not in (1, 2):
        raise RuntimeError(f"multi_dot(): the first tensor must be 1D or 2D but got {first.dim()}D")
    if last.dim() not in (1, 2):
        raise RuntimeError(f"multi_dot(): the last tensor must be 1D or 2D but got {last.dim()}D")
    for i, t in enumerate(tensors[1:], 1):
        if t.dtype is not first.dtype:
            raise RuntimeError(
                f"multi_dot(): all tensors must have be the same dtype but tensor 0 is "
                f"{_TYPEMETA_NAMES[first.dtype]} and tensor {i} {_TYPEMETA_NAMES[t.dtype]}"
            )
    mats = [first.unsqueeze(0) if first.dim() == 1 else first]
    mats += tensors[1:-1]
    mats.append(last.unsqueeze(-1) if last.dim() == 1 else last)
    for i in range(n - 1):
        if mats[i].shape[-1] != mats[i + 1].shape[0]:
            raise RuntimeError(
                f"multi_dot(): tensors {i} and {i + 1} with shapes {list(tensors[i].shape)} and "
                f"{list(tensors[i + 1].shape)} cannot be multiplied"
            )
    dims = [m.shape[0] for m in mats] + [mats[-1].shape[1]]
    result = _multiply_chain(mats, _chain_order(dims), 0, n - 1)
    if first.dim() == 1:
        result = result.squeeze(0)
    if last.dim() == 1:
        result = result.squeeze(-1)
    return result


def chain_matmul(*matrices, out=None) -> Tensor:
    """The product of 2-D matrices in the cheapest order (deprecated as in PyTorch: use
    :func:`kiln.linalg.multi_dot`); one matrix is returned as a copy."""
    warnings.warn(
        "kiln.chain_matmul is deprecated and will be removed in a future kiln release. Use "
        "kiln.linalg.multi_dot instead, which accepts a list of two or more tensors rather than multiple "
        "parameters.",
        UserWarning,
        stacklevel=2,
    )
    if not matrices:
        raise RuntimeError("chain_matmul(): Expected one or more matrices")
    for m in matrices:
        _need_tensor(m, "matrices", 1, "chain_matmul")
        if m.dim() != 2:
            raise RuntimeError(f"Tensor dimension is {m.dim()}, expected 2 instead.")
    if len(matrices) == 1:
        return matrices[0].clone()
    return multi_dot(matrices, out=out)


# ---------------------------------------------------------------------------------------- distances

_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> Tensor:
    """The ``p``-norm distance between each row of ``x1`` (``B x P x M``) and each row of ``x2`` (``B x R x M``),
    batch dims broadcasting: ``B x P x R``. For ``p == 2`` with more than 25 rows on either side (or
    ``compute_mode='use_mm_for_euclid_dist'``) it is computed through a matrix product, as PyTorch does."""
    _check_tensors("cdist", x1=x1, x2=x2)
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    for name, x in (("X1", x1), ("X2", x2)):
        if x.dim() < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {x.dim()}D")
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {scalar_type_name(x.dtype)}")
    if x1.dtype is not x2.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(x1.dtype)} but found {scalar_type_name(x2.dtype)}")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    if not p >= 0:
        raise RuntimeError("cdist only supports non-negative p values")
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    use_mm = p == 2 and (
        compute_mode == "use_mm_for_euclid_dist"
        or (compute_mode == "use_mm_for_euclid_dist_if_necessary" and (rows1 > 25 or rows2 > 25))
    )
    if use_mm:
        n1 = (x1 * x1).sum(-1, keepdim=True)
        n2 = (x2 * x2).sum(-1, keepdim=True)
        sq = n1 - 2 * matmul(x1, x2.mT) + n2.mT
        return sq.clamp_min(1e-30).sqrt()
    from kiln._ops.scans import vector_norm

    diff = sub(x1.unsqueeze(-2), x2.unsqueeze(-3))
    if p == 0:  # a count of nonzero differences: its gradient is 0, not undefined (PyTorch's cdist backward)
        return vector_norm(diff.detach(), 0, -1) + (diff.nan_to_num() * 0).sum(-1)
    return vector_norm(diff, p, -1)


def dist(input: Tensor, other: Tensor, p: float = 2) -> Tensor:
    """The ``p``-norm of ``input - other`` (broadcasting) as a 0-d tensor."""
    _check_tensors("dist", input=input, other=other)
    for x in (input, other):
        if not x.dtype.is_floating_point:
            raise RuntimeError(
                f"norm(): input dtype should be either floating point or complex. Got {scalar_type_name(x.dtype)} "
                "instead."
            )
    from kiln._ops.scans import vector_norm

    return vector_norm(sub(input, other), p)


Tensor.cross = cross
Tensor.kron = kron
Tensor.inner = inner
Tensor.vdot = vdot
Tensor.addr = addr
Tensor.dist = dist


def _addr_(self: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """In-place version of :func:`kiln.addr` (``self`` must be the 2-D result's shape)."""
    if self.dim() != 2:
        raise RuntimeError(f"2D tensor expected, got {self.dim()}D tensor for input")
    return _addr_inplace(self, vec1, vec2, beta=beta, alpha=alpha)


_addr_inplace = _inplace_product(addr, "addr_")
Tensor.addr_ = _addr_
Tensor.addmv_ = _inplace_product(addmv, "addmv_")
Tensor.addbmm_ = _inplace_product(addbmm, "addbmm_")
Tensor.addmm_ = _inplace_product(addmm, "addmm_")
Tensor.baddbmm_ = _inplace_product(baddbmm, "baddbmm_")
