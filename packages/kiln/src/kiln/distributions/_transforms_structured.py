"""The transforms that act on whole vectors or matrices, or combine other transforms along a dimension
(documented under :mod:`kiln.distributions.transforms`, which exports them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import kiln
from kiln._tensor import Tensor
from kiln.distributions import constraints
from kiln.distributions._transform_base import Transform, _clipped_sigmoid, _Elementwise
from kiln.distributions.utils import _sum_rightmost, lazy_property, tril_matrix_to_vec, vec_to_tril_matrix
from kiln.nn_functional import logsigmoid, pad, softplus


class SoftmaxTransform(_Elementwise):
    """From unconstrained vectors to the simplex: ``exp`` then normalise over the last dimension. Not
    bijective (the inverse is ``log``), but nearly coordinate-wise, which suits optimisation."""

    domain = constraints.real_vector
    codomain = constraints.simplex

    def _call(self, x):
        p = (x - x.max(-1, True)[0]).exp()
        return p / p.sum(-1, True)

    def _inverse(self, y):
        return y.log()

    def forward_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Too few dimensions on input")
        return shape

    inverse_shape = forward_shape


def _stick_offsets(x: Tensor) -> Tensor:
    """``K, K-1, ..., 1`` for a last dimension of size ``K``, as the log-offsets of stick breaking use."""
    k = x.shape[-1]
    return k + 1 - x.new_ones(k).cumsum(-1)


class StickBreakingTransform(_Elementwise):
    """From unconstrained vectors of size ``K`` to the simplex of size ``K + 1`` by stick breaking: each
    coordinate, through a sigmoid, takes its share of what the previous ones left. Bijective (fit for
    HMC), but it mixes the coordinates."""

    domain = constraints.real_vector
    codomain = constraints.simplex
    bijective = True

    def _call(self, x):
        z = _clipped_sigmoid(x - _stick_offsets(x).log())
        left = (1 - z).cumprod(-1)
        return pad(z, [0, 1], value=1) * pad(left, [1, 0], value=1)

    def _inverse(self, y):
        head = y[..., :-1]
        offset = y.shape[-1] - y.new_ones(head.shape[-1]).cumsum(-1)
        rest = (1 - head.cumsum(-1)).clamp(min=kiln.finfo(y.dtype).tiny)
        return head.log() - rest.log() + offset.log()

    def log_abs_det_jacobian(self, x, y):
        x = x - _stick_offsets(x).log()
        return (-x + logsigmoid(x) + y[..., :-1].log()).sum(-1)

    def forward_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Too few dimensions on input")
        return type(shape)(tuple(shape[:-1]) + (shape[-1] + 1,))

    def inverse_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Too few dimensions on input")
        return type(shape)(tuple(shape[:-1]) + (shape[-1] - 1,))


class LowerCholeskyTransform(_Elementwise):
    """From unconstrained square matrices to lower-triangular ones with a positive diagonal (the strict
    lower triangle kept, the diagonal exponentiated): Cholesky factors of positive-definite matrices."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.lower_cholesky

    def _call(self, x):
        return x.tril(-1) + kiln.diag_embed(x.diagonal(dim1=-2, dim2=-1).exp())

    def _inverse(self, y):
        return y.tril(-1) + kiln.diag_embed(y.diagonal(dim1=-2, dim2=-1).log())


class PositiveDefiniteTransform(_Elementwise):
    """From unconstrained square matrices to positive-definite ones: ``L @ L.mT`` of the
    :class:`LowerCholeskyTransform` of the input."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.positive_definite

    def _call(self, x):
        lower = LowerCholeskyTransform()(x)
        return lower @ lower.mT

    def _inverse(self, y):
        return LowerCholeskyTransform().inv(kiln.linalg.cholesky(y))


class CorrCholeskyTransform(Transform):
    """From unconstrained vectors of size ``D (D - 1) / 2`` to Cholesky factors of ``D x D`` correlation
    matrices (lower-triangular, positive diagonal, rows of unit length): the vector fills the strict lower
    triangle row by row, goes through ``tanh``, and each row is completed by signed stick breaking."""

    domain = constraints.real_vector
    codomain = constraints.corr_cholesky
    bijective = True

    def _call(self, x):
        eps = kiln.finfo(x.dtype).eps
        r = vec_to_tril_matrix(x.tanh().clamp(min=-1 + eps, max=1 - eps), diag=-1)
        left = (1 - r**2).sqrt().cumprod(-1)
        r = r + kiln.eye(r.shape[-1], dtype=r.dtype, device=r.device)
        return r * pad(left[..., :-1], [1, 0], value=1)

    def _inverse(self, y):
        left = pad((1 - (y * y).cumsum(-1))[..., :-1], [1, 0], value=1)
        t = tril_matrix_to_vec(y, diag=-1) / tril_matrix_to_vec(left, diag=-1).sqrt()
        return (t.log1p() - t.neg().log1p()) / 2

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        left = tril_matrix_to_vec(1 - (y * y).cumsum(-1), diag=-2)
        stick = 0.5 * left.log().sum(-1)
        tanh = -2 * (x + softplus(-2 * x) - math.log(2.0)).sum(-1)
        return stick + tanh

    def forward_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("Too few dimensions on input")
        n = shape[-1]
        d = round((0.25 + 2 * n) ** 0.5 + 0.5)
        if d * (d - 1) // 2 != n:
            raise ValueError("Input is not a flattened lower-diagonal number")
        return type(shape)(tuple(shape[:-1]) + (d, d))

    def inverse_shape(self, shape):
        if len(shape) < 2:
            raise ValueError("Too few dimensions on input")
        if shape[-2] != shape[-1]:
            raise ValueError("Input is not square")
        d = shape[-1]
        return type(shape)(tuple(shape[:-2]) + (d * (d - 1) // 2,))


def _check_dim(dim: int, t: Tensor, what: str) -> None:
    if not -t.dim() <= dim < t.dim():
        raise AssertionError(f"dim {dim} out of range for {what} with {t.dim()} dimensions")


def _check_size(dim: int, t: Tensor, name: str, expected: int, what: str) -> None:
    if t.size(dim) != expected:
        raise AssertionError(f"{name}.size({dim}) = {t.size(dim)} must equal {what} {expected}")


class CatTransform(Transform):
    """The transforms ``tseq`` applied to consecutive slices (of sizes ``lengths``, default 1 each) along
    dimension ``dim``, as :func:`kiln.cat` joins them."""

    def __init__(
        self, tseq: Sequence[Transform], dim: int = 0, lengths: Sequence[int] | None = None, cache_size: int = 0
    ) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise AssertionError("All elements of tseq must be Transform instances")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.lengths = [1] * len(self.transforms) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.transforms):
            raise AssertionError(f"lengths ({len(self.lengths)}) must match transforms ({len(self.transforms)})")
        self.dim = dim

    @lazy_property
    def event_dim(self) -> int:  # type: ignore[override]
        return max(t.event_dim for t in self.transforms)

    @lazy_property
    def length(self) -> int:
        """The total size along ``dim``."""
        return sum(self.lengths)

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return CatTransform(self.transforms, self.dim, self.lengths, cache_size)

    def _slices(self, t: Tensor):
        start = 0
        for n in self.lengths:
            yield t.narrow(self.dim, start, n)
            start += n

    def _map(self, t: Tensor, name: str, inverse: bool) -> Tensor:
        _check_dim(self.dim, t, "tensor")
        _check_size(self.dim, t, name, self.length, "length")
        parts = [(tr.inv if inverse else tr)(s) for tr, s in zip(self.transforms, self._slices(t))]
        return kiln.cat(parts, dim=self.dim)

    def _call(self, x):
        return self._map(x, "x", inverse=False)

    def _inverse(self, y):
        return self._map(y, "y", inverse=True)

    def log_abs_det_jacobian(self, x, y):
        for t, name in ((x, "x"), (y, "y")):
            _check_dim(self.dim, t, name)
            _check_size(self.dim, t, name, self.length, "length")
        terms = []
        for tr, xs, ys in zip(self.transforms, self._slices(x), self._slices(y)):
            term = tr.log_abs_det_jacobian(xs, ys)
            if tr.event_dim < self.event_dim:
                term = _sum_rightmost(term, self.event_dim - tr.event_dim)
            terms.append(term)
        dim = (self.dim - x.dim() if self.dim >= 0 else self.dim) + self.event_dim
        return kiln.cat(terms, dim=dim) if dim < 0 else sum(terms)

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self):
        return constraints.cat([t.domain for t in self.transforms], self.dim, self.lengths)

    @constraints.dependent_property
    def codomain(self):
        return constraints.cat([t.codomain for t in self.transforms], self.dim, self.lengths)


class StackTransform(Transform):
    """The transforms ``tseq`` applied to the slices along dimension ``dim``, as :func:`kiln.stack`
    joins them."""

    def __init__(self, tseq: Sequence[Transform], dim: int = 0, cache_size: int = 0) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise AssertionError("All elements of tseq must be Transform instances")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.dim = dim

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return StackTransform(self.transforms, self.dim, cache_size)

    def _map(self, t: Tensor, name: str, inverse: bool) -> Tensor:
        _check_dim(self.dim, t, "tensor")
        _check_size(self.dim, t, name, len(self.transforms), "len(transforms)")
        parts = [(tr.inv if inverse else tr)(s) for tr, s in zip(self.transforms, t.unbind(self.dim))]
        return kiln.stack(parts, dim=self.dim)

    def _call(self, x):
        return self._map(x, "x", inverse=False)

    def _inverse(self, y):
        return self._map(y, "y", inverse=True)

    def log_abs_det_jacobian(self, x, y):
        for t, name in ((x, "x"), (y, "y")):
            _check_dim(self.dim, t, name)
            _check_size(self.dim, t, name, len(self.transforms), "len(transforms)")
        terms = [
            tr.log_abs_det_jacobian(a, b) for tr, a, b in zip(self.transforms, x.unbind(self.dim), y.unbind(self.dim))
        ]
        return kiln.stack(terms, dim=self.dim)

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return all(t.bijective for t in self.transforms)

    @constraints.dependent_property
    def domain(self):
        return constraints.stack([t.domain for t in self.transforms], self.dim)

    @constraints.dependent_property
    def codomain(self):
        return constraints.stack([t.codomain for t in self.transforms], self.dim)
