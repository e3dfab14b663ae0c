"""Helpers shared by the distributions (``torch.distributions.utils``): broadcasting parameters, converting
between probabilities and logits, lazily computed parameters and packing lower-triangular matrices."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import kiln
from kiln._tensor import Size, Tensor

__all__ = [
    "broadcast_all",
    "logits_to_probs",
    "clamp_probs",
    "probs_to_logits",
    "lazy_property",
    "tril_matrix_to_vec",
    "vec_to_tril_matrix",
]

euler_constant = 0.57721566490153286060
"""The Euler–Mascheroni constant."""

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def broadcast_all(*values: Tensor | numbers.Number) -> tuple[Tensor, ...]:
    """The values broadcast to one shape: tensors by the broadcasting rules, numbers as tensors of the first
    tensor's dtype and device (of the default dtype when every value is a number). Raises ``ValueError`` for
    anything else."""
    if not all(isinstance(v, (Tensor, numbers.Number)) for v in values):
        raise ValueError(
            "Input arguments must all be instances of Number, kiln.Tensor or objects implementing __torch_function__."
        )
    first = next((v for v in values if isinstance(v, Tensor)), None)
    if first is None:
        d = kiln.get_default_dtype()
        return tuple(kiln.tensor(v, dtype=d) for v in values)
    tensors = [v if isinstance(v, Tensor) else kiln.tensor(v, dtype=first.dtype, device=first.device) for v in values]
    return tuple(kiln.broadcast_tensors(*tensors))


def _standard_normal(shape, dtype, device) -> Tensor:
    return kiln.randn(tuple(shape), dtype=dtype, device=device)


def _sum_rightmost(value: Tensor, dim: int) -> Tensor:
    """``value`` summed over its ``dim`` rightmost dimensions."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[: value.dim() - dim]) + (-1,)).sum(-1)


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    """Probabilities from logits: the sigmoid of log-odds when ``is_binary``, else the softmax over the last
    dimension of (unnormalised) log-probabilities."""
    if is_binary:
        return kiln.sigmoid(logits)
    return kiln.softmax(logits, dim=-1)


def clamp_probs(probs: Tensor) -> Tensor:
    """``probs`` clamped into ``[eps, 1 - eps]``, ``eps`` the machine epsilon of its dtype."""
    eps = kiln.finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    """Logits from probabilities (clamped away from 0 and 1 first): log-odds when ``is_binary``, else the
    log-probabilities."""
    p = clamp_probs(probs)
    if is_binary:
        return p.log() - (-p).log1p()
    return p.log()


class lazy_property(functools.cached_property):
    """A decorator for a parameter computed from another on first access (``Categorical.logits`` from
    ``probs``) and then stored on the instance, so it is computed once. It computes with gradients on.
    (A ``functools.cached_property``, so tools that document properties see one.)"""

    def __init__(self, wrapped: Callable[[Any], Any]):
        super().__init__(wrapped)
        self.wrapped = wrapped

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        with kiln.enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value


def _tril_mask(n: int, diag: int, device) -> Tensor:
    idx = kiln.arange(n, device=device)
    return idx < idx.view(-1, 1) + (diag + 1)


def tril_matrix_to_vec(mat: Tensor, diag: int = 0) -> Tensor:
    """The lower-triangular part (on and below diagonal ``diag``) of a ``D x D`` matrix, or a batch of them,
    as a vector in row order."""
    n = mat.shape[-1]
    if diag < -n or diag >= n:
        raise ValueError(f"diag ({diag}) provided is outside [{-n}, {n - 1}].")
    mask = _tril_mask(n, diag, mat.device)
    rows, cols = mask.nonzero().unbind(1)
    return mat[..., rows, cols]


def vec_to_tril_matrix(vec: Tensor, diag: int = 0) -> Tensor:
    """The inverse of :func:`tril_matrix_to_vec`: a (batch of) ``D x D`` lower-triangular matrices whose
    triangle (on and below diagonal ``diag``) is filled from ``vec`` in row order."""
    m = vec.shape[-1]
    b = 1 + 2 * diag
    n = (-b + math.sqrt(b * b + 8 * m + 4 * abs(diag) * (diag + 1))) / 2
    if round(n) - n > (kiln.finfo(vec.dtype).eps if vec.dtype.is_floating_point else 0):
        raise ValueError(
            f"The size of last dimension is {m} which cannot be expressed as "
            "the lower triangular part of a square D x D matrix."
        )
    n = round(n)
    mask = _tril_mask(n, diag, vec.device)
    rows, cols = mask.nonzero().unbind(1)
    flat_index = rows * n + cols
    out = vec.new_zeros(tuple(vec.shape[:-1]) + (n * n,))
    out = out.index_copy(-1, flat_index, vec) if out.dim() else out
    return out.reshape(Size(tuple(vec.shape[:-1]) + (n, n)))


def _xlogy(x: Tensor, y: Tensor) -> Tensor:
    """``x * log(y)``, 0 where both are 0; the gradient in ``x`` is ``log(y)`` everywhere (at ``x == 0``
    too, as PyTorch's ``xlogy``), and no NaN comes from ``0 * log(0)``."""
    both_zero = (x == 0) & (y == 0)
    return x * kiln.where(both_zero, 1.0, y).log()
