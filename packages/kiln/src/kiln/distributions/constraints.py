"""Constraints: the regions where a distribution's parameters and values are valid
(``torch.distributions.constraints``).

A constraint's ``check(value)`` returns a bool tensor of ``value``'s shape less the constraint's
``event_dim`` rightmost dimensions, true where the event is valid. The names are PyTorch's: ``real``,
``positive``, ``simplex``, ``interval(low, high)``, ``lower_cholesky``, ... Distributions list theirs in
``arg_constraints`` (parameters) and ``support`` (values); :mod:`kiln.distributions.constraint_registry`
maps each to a transform from unconstrained space.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kiln

__all__ = [
    "Constraint",
    "boolean",
    "cat",
    "corr_cholesky",
    "dependent",
    "dependent_property",
    "greater_than",
    "greater_than_eq",
    "independent",
    "integer_interval",
    "interval",
    "half_open_interval",
    "is_dependent",
    "less_than",
    "lower_cholesky",
    "lower_triangular",
    "MixtureSameFamilyConstraint",
    "multinomial",
    "nonnegative",
    "nonnegative_integer",
    "one_hot",
    "positive",
    "positive_semidefinite",
    "positive_definite",
    "positive_integer",
    "real",
    "real_vector",
    "simplex",
    "square",
    "stack",
    "symmetric",
    "unit_interval",
]


class Constraint:
    """Base class of constraints: a region in which a variable is valid.

    ``is_discrete`` says whether the region is discrete; ``event_dim`` is how many rightmost dimensions
    make one event (``check`` reduces over them).
    """

    is_discrete = False
    event_dim = 0

    def check(self, value):
        """A bool tensor, true where each event of ``value`` satisfies the constraint."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__[1:] + "()"


class _Dependent(Constraint):
    """A placeholder for a parameter or support that depends on other values and cannot be checked alone.

    ``is_discrete`` and ``event_dim`` raise ``NotImplementedError`` unless given (call the constraint with
    them: ``dependent(is_discrete=True, event_dim=1)``).
    """

    def __init__(self, *, is_discrete: Any = NotImplemented, event_dim: Any = NotImplemented):
        self._is_discrete = is_discrete
        self._event_dim = event_dim

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        if self._is_discrete is NotImplemented:
            raise NotImplementedError(".is_discrete cannot be determined statically")
        return self._is_discrete

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        if self._event_dim is NotImplemented:
            raise NotImplementedError(".event_dim cannot be determined statically")
        return self._event_dim

    def __call__(self, *, is_discrete: Any = NotImplemented, event_dim: Any = NotImplemented) -> _Dependent:
        return _Dependent(
            is_discrete=self._is_discrete if is_discrete is NotImplemented else is_discrete,
            event_dim=self._event_dim if event_dim is NotImplemented else event_dim,
        )

    def check(self, x):
        raise ValueError("Cannot determine validity of dependent constraint")


def is_dependent(constraint) -> bool:
    """Whether ``constraint`` is a dependent constraint (one that cannot be checked on its own)."""
    return isinstance(constraint, _Dependent)


class _DependentProperty(property, _Dependent):
    """A property that reads as a dependent constraint on the class (``Uniform.support``) and as the
    instance's constraint on an instance (``Uniform(0, 2).support`` is ``interval(0, 2)``). Use as
    ``@constraints.dependent_property(is_discrete=False, event_dim=0)``."""

    def __init__(
        self, fn: Callable | None = None, *, is_discrete: Any = NotImplemented, event_dim: Any = NotImplemented
    ):
        property.__init__(self, fn)
        self._is_discrete = is_discrete
        self._event_dim = event_dim

    def __call__(self, fn: Callable) -> _DependentProperty:  # type: ignore[override]
        return _DependentProperty(fn, is_discrete=self._is_discrete, event_dim=self._event_dim)


class _IndependentConstraint(Constraint):
    """A constraint whose events span ``reinterpreted_batch_ndims`` more rightmost dimensions than
    ``base_constraint``'s: an event is valid when all its entries are."""

    def __init__(self, base_constraint: Constraint, reinterpreted_batch_ndims: int):
        if not isinstance(base_constraint, Constraint):
            raise AssertionError(f"base_constraint must be a Constraint, got {type(base_constraint).__name__}")
        if not isinstance(reinterpreted_batch_ndims, int):
            raise AssertionError(
                f"reinterpreted_batch_ndims must be an int, got {type(reinterpreted_batch_ndims).__name__}"
            )
        if reinterpreted_batch_ndims < 0:
            raise AssertionError(f"reinterpreted_batch_ndims must be >= 0, got {reinterpreted_batch_ndims}")
        self.base_constraint = base_constraint
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        return self.base_constraint.is_discrete

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return self.base_constraint.event_dim + self.reinterpreted_batch_ndims

    def check(self, value):
        ok = self.base_constraint.check(value)
        n = self.reinterpreted_batch_ndims
        if ok.dim() < n:
            raise ValueError(f"Expected value.dim() >= {self.event_dim} but got {value.dim()}")
        return ok.reshape(tuple(ok.shape[: ok.dim() - n]) + (-1,)).all(-1)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}({self.base_constraint!r}, {self.reinterpreted_batch_ndims})"


class MixtureSameFamilyConstraint(Constraint):
    """The support of a :class:`~kiln.distributions.MixtureSameFamily`: ``base_constraint`` (the
    components') checked against every component, with the component dimension put back."""

    def __init__(self, base_constraint: Constraint):
        if not isinstance(base_constraint, Constraint):
            raise AssertionError(f"base_constraint must be a Constraint, got {type(base_constraint).__name__}")
        self.base_constraint = base_constraint

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        return self.base_constraint.is_discrete

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return self.base_constraint.event_dim

    def check(self, value):
        """Whether ``value`` is a possible outcome of the mixture."""
        ok = self.base_constraint.check(value.unsqueeze(-1 - self.event_dim))
        if value.dim() < self.event_dim:
            raise ValueError(f"Expected value.dim() >= {self.event_dim} but got {value.dim()}")
        keep = value.dim() - self.event_dim
        return ok.reshape(tuple(ok.shape[:keep]) + (-1,)).all(-1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_constraint!r})"


class _Boolean(Constraint):
    """The two values 0 and 1."""

    is_discrete = True

    def check(self, value):
        return (value == 0) | (value == 1)


class _OneHot(Constraint):
    """One-hot vectors: entries 0 or 1 that sum to 1 along the last dimension."""

    is_discrete = True
    event_dim = 1

    def check(self, value):
        binary = ((value == 0) | (value == 1)).all(-1)
        return binary & (value.sum(-1) == 1)


class _IntegerInterval(Constraint):
    """Integers in ``[lower_bound, upper_bound]``."""

    is_discrete = True

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound

    def check(self, value):
        return (value % 1 == 0) & (self.lower_bound <= value) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _IntegerLessThan(Constraint):
    """Integers in ``(-inf, upper_bound]``."""

    is_discrete = True

    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, value):
        return (value % 1 == 0) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(upper_bound={self.upper_bound})"


class _IntegerGreaterThan(Constraint):
    """Integers in ``[lower_bound, inf)``."""

    is_discrete = True

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        return (value % 1 == 0) & (value >= self.lower_bound)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(lower_bound={self.lower_bound})"


class _Real(Constraint):
    """The extended real line ``[-inf, inf]`` (everything but NaN)."""

    def check(self, value):
        return value == value


class _GreaterThan(Constraint):
    """The half line ``(lower_bound, inf]``."""

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        return self.lower_bound < value

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(lower_bound={self.lower_bound})"


class _GreaterThanEq(Constraint):
    """The half line ``[lower_bound, inf)``."""

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound

    def check(self, value):
        return self.lower_bound <= value

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(lower_bound={self.lower_bound})"


class _LessThan(Constraint):
    """The half line ``[-inf, upper_bound)``."""

    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, value):
        return value < self.upper_bound

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(upper_bound={self.upper_bound})"


class _Interval(Constraint):
    """The closed interval ``[lower_bound, upper_bound]``."""

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound

    def check(self, value):
        return (self.lower_bound <= value) & (value <= self.upper_bound)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _HalfOpenInterval(_Interval):
    """The half-open interval ``[lower_bound, upper_bound)``."""

    def check(self, value):
        return (self.lower_bound <= value) & (value < self.upper_bound)


class _Simplex(Constraint):
    """The unit simplex over the last dimension: entries ``>= 0`` summing to 1 (within ``1e-6``)."""

    event_dim = 1

    def check(self, value):
        return (value >= 0).all(-1) & ((value.sum(-1) - 1).abs() < 1e-6)


class _Multinomial(Constraint):
    """Non-negative integer counts over the last dimension whose sum is at most ``upper_bound``."""

    is_discrete = True
    event_dim = 1

    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, x):
        return (x >= 0).all(-1) & (x.sum(-1) <= self.upper_bound)


def _lower(value):
    return (value.tril() == value).reshape(tuple(value.shape[:-2]) + (-1,)).all(-1)


class _LowerTriangular(Constraint):
    """Lower-triangular square matrices."""

    event_dim = 2

    def check(self, value):
        return _lower(value)


class _LowerCholesky(Constraint):
    """Lower-triangular square matrices with a positive diagonal."""

    event_dim = 2

    def check(self, value):
        return _lower(value) & (value.diagonal(dim1=-2, dim2=-1) > 0).all(-1)


class _CorrCholesky(Constraint):
    """Cholesky factors of correlation matrices: lower-triangular, positive diagonal, unit-length rows."""

    event_dim = 2

    def check(self, value):

        tol = kiln.finfo(value.dtype).eps * value.shape[-1] * 10
        norms = kiln.linalg.vector_norm(value.detach(), dim=-1)
        unit = ((norms - 1.0).abs() <= tol).all(-1)
        return _LowerCholesky().check(value) & unit


class _Square(Constraint):
    """Square matrices."""

    event_dim = 2

    def check(self, value):
        return kiln.full(
            tuple(value.shape[:-2]), value.shape[-2] == value.shape[-1], dtype=kiln.bool, device=value.device
        )


class _Symmetric(_Square):
    """Symmetric square matrices (entries equal to their transposes' within ``atol=1e-6``, ``rtol=1e-5``)."""

    def check(self, value):
        square = super().check(value)
        if not bool(square.all()):
            return square
        t = value.mT
        close = ((value - t).abs() <= 1e-6 + 1e-5 * t.abs()) | (value == t)
        return close.all(-2).all(-1)


class _PositiveSemidefinite(_Symmetric):
    """Symmetric matrices whose eigenvalues are all ``>= 0``."""

    def check(self, value):
        sym = super().check(value)
        if not bool(sym.all()):
            return sym
        return (kiln.linalg.eigvalsh(value) >= 0).all(-1)


class _PositiveDefinite(_Symmetric):
    """Symmetric matrices with a Cholesky factorisation (all eigenvalues ``> 0``)."""

    def check(self, value):
        sym = super().check(value)
        if not bool(sym.all()):
            return sym
        return kiln.linalg.cholesky_ex(value).info == 0


class _Cat(Constraint):
    """The constraints ``cseq`` applied to consecutive slices (of sizes ``lengths``, default 1 each) along
    dimension ``dim``, as :func:`kiln.cat` joins them."""

    def __init__(self, cseq, dim: int = 0, lengths=None):
        if not all(isinstance(c, Constraint) for c in cseq):
            raise AssertionError("All elements of cseq must be Constraint instances")
        self.cseq = list(cseq)
        self.lengths = [1] * len(self.cseq) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.cseq):
            raise AssertionError(f"lengths ({len(self.lengths)}) must match cseq ({len(self.cseq)})")
        self.dim = dim

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return max(c.event_dim for c in self.cseq)

    def check(self, value):
        if not -value.dim() <= self.dim < value.dim():
            raise AssertionError(f"dim {self.dim} out of range for value with {value.dim()} dimensions")
        parts, start = [], 0
        for c, n in zip(self.cseq, self.lengths):
            parts.append(c.check(value.narrow(self.dim, start, n)))
            start += n
        return kiln.cat(parts, self.dim)


class _Stack(Constraint):
    """The constraints ``cseq`` applied to the slices along dimension ``dim``, as :func:`kiln.stack`
    joins them."""

    def __init__(self, cseq, dim: int = 0):
        if not all(isinstance(c, Constraint) for c in cseq):
            raise AssertionError("All elements of cseq must be Constraint instances")
        self.cseq = list(cseq)
        self.dim = dim

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        d = max(c.event_dim for c in self.cseq)
        return d + 1 if self.dim + d < 0 else d

    def check(self, value):
        if not -value.dim() <= self.dim < value.dim():
            raise AssertionError(f"dim {self.dim} out of range for value with {value.dim()} dimensions")
        slices = value.unbind(self.dim)
        return kiln.stack([c.check(v) for v, c in zip(slices, self.cseq)], self.dim)


dependent = _Dependent()
dependent_property = _DependentProperty
independent = _IndependentConstraint
boolean = _Boolean()
one_hot = _OneHot()
nonnegative_integer = _IntegerGreaterThan(0)
positive_integer = _IntegerGreaterThan(1)
integer_interval = _IntegerInterval
real = _Real()
real_vector = independent(real, 1)
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
less_than = _LessThan
multinomial = _Multinomial
unit_interval = _Interval(0.0, 1.0)
interval = _Interval
half_open_interval = _HalfOpenInterval
simplex = _Simplex()
lower_triangular = _LowerTriangular()
lower_cholesky = _LowerCholesky()
corr_cholesky = _CorrCholesky()
square = _Square()
symmetric = _Symmetric()
positive_semidefinite = _PositiveSemidefinite()
positive_definite = _PositiveDefinite()
cat = _Cat
stack = _Stack
