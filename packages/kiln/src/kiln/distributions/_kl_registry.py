"""The registry behind :func:`kiln.distributions.kl.kl_divergence` and the helpers the KL formulas share
(documented under :mod:`kiln.distributions.kl`, which exports them)."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import kiln
from kiln._tensor import Tensor
from kiln.distributions.distribution import Distribution

_KL_REGISTRY: dict[tuple[type, type], Callable] = {}  # what register_kl was given
_KL_MEMOIZE: dict[tuple[type, type], Callable] = {}  # the dispatch result per concrete pair of types


def register_kl(type_p: type, type_q: type) -> Callable:
    """A decorator that registers ``fn(p, q)`` as the KL divergence of a ``type_p`` from a ``type_q``::

        @register_kl(Normal, Normal)
        def kl_normal_normal(p, q): ...

    The most specific registered pair (by subclass) wins; when two pairs match equally well, a
    ``RuntimeWarning`` says which pair to register to break the tie.
    """
    if not isinstance(type_p, type) and issubclass(type_p, Distribution):
        raise TypeError(f"Expected type_p to be a Distribution subclass but got {type_p}")
    if not isinstance(type_q, type) and issubclass(type_q, Distribution):
        raise TypeError(f"Expected type_q to be a Distribution subclass but got {type_q}")

    def decorator(fn: Callable) -> Callable:
        _KL_REGISTRY[type_p, type_q] = fn
        _KL_MEMOIZE.clear()
        return fn

    return decorator


@functools.total_ordering
class _Match:
    """A pair of types ordered by specificity: one pair is below another when it is more specific,
    comparing the first types first."""

    __slots__ = ("types",)

    def __init__(self, *types):
        self.types = types

    def __eq__(self, other):
        return self.types == other.types

    def __le__(self, other):
        for x, y in zip(self.types, other.types):
            if not issubclass(x, y):
                return False
            if x is not y:
                break
        return True


def _dispatch_kl(type_p: type, type_q: type):
    matches = [(p, q) for p, q in _KL_REGISTRY if issubclass(type_p, p) and issubclass(type_q, q)]
    if not matches:
        return NotImplemented
    left_p, left_q = min(_Match(*m) for m in matches).types
    right_q, right_p = min(_Match(*reversed(m)) for m in matches).types
    left, right = _KL_REGISTRY[left_p, left_q], _KL_REGISTRY[right_p, right_q]
    if left is not right:
        warnings.warn(
            f"Ambiguous kl_divergence({type_p.__name__}, {type_q.__name__}). "
            f"Please register_kl({left_p.__name__}, {right_q.__name__})",
            RuntimeWarning,
            stacklevel=2,
        )
    return left


def kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """``KL(p || q) = E_p[log p(x) - log q(x)]``, batched over the batch shape.

    Raises ``NotImplementedError`` when no function is registered for the two types.
    """
    try:
        fn = _KL_MEMOIZE[type(p), type(q)]
    except KeyError:
        fn = _KL_MEMOIZE[type(p), type(q)] = _dispatch_kl(type(p), type(q))
    if fn is NotImplemented:
        raise NotImplementedError(
            f"No KL(p || q) is implemented for p type {p.__class__.__name__} and q type {q.__class__.__name__}"
        )
    return fn(p, q)


def _infinite_like(t: Tensor) -> Tensor:
    return kiln.full_like(t, math.inf)


def _x_log_x(t: Tensor) -> Tensor:
    return kiln.where(t == 0, 0.0, t * kiln.where(t == 0, 1.0, t).log())


def _trace_xxt(m: Tensor) -> Tensor:
    """``trace(M M^T)`` per matrix of a batch: the sum of squares of each matrix."""
    return m.reshape(tuple(m.shape[:-2]) + (-1,)).pow(2).sum(-1)


def _half_log_det(lower: Tensor) -> Tensor:
    return lower.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def _inf_where(mask: Tensor, result: Tensor) -> Tensor:
    return kiln.where(mask, math.inf, result)


def _zero_where(mask: Tensor, result: Tensor) -> Tensor:
    return kiln.where(mask, 0.0, result)
