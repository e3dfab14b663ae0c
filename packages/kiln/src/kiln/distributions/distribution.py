"""The base class of every distribution (``torch.distributions.distribution``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import kiln
from kiln._tensor import Size, Tensor
from kiln.distributions import constraints
from kiln.distributions.utils import lazy_property

__all__ = ["Distribution"]


def _size(shape) -> Size:
    return shape if isinstance(shape, Size) else Size(tuple(shape))


class Distribution:
    """The base class of probability distributions, as ``torch.distributions.Distribution``.

    ``batch_shape`` is the shape over which the parameters are batched, ``event_shape`` the shape of one
    sample. With ``validate_args`` (default: on, unless Python runs with ``-O``; see
    :meth:`set_default_validate_args`) the parameters are checked against :attr:`arg_constraints` when the
    distribution is made, and values against :attr:`support` in ``log_prob``, ``cdf`` and ``icdf``, raising
    PyTorch's ``ValueError``.
    """

    has_rsample = False
    has_enumerate_support = False
    _validate_args = __debug__

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Turn argument validation on or off for every distribution made without ``validate_args``."""
        if value not in (True, False):
            raise ValueError
        Distribution._validate_args = value

    def __init__(
        self,
        batch_shape: Sequence[int] = Size(),
        event_shape: Sequence[int] = Size(),
        validate_args: bool | None = None,
    ) -> None:
        self._batch_shape = _size(batch_shape)
        self._event_shape = _size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if not self._validate_args:
            return
        try:
            arg_constraints = self.arg_constraints
        except NotImplementedError:
            arg_constraints = {}
            warnings.warn(
                f"{self.__class__} does not define `arg_constraints`. Please set `arg_constraints = {{}}` or "
                "initialize the distribution with `validate_args=False` to turn off validation.",
                stacklevel=2,
            )
        for param, constraint in arg_constraints.items():
            if constraints.is_dependent(constraint):
                continue
            if param not in self.__dict__ and isinstance(getattr(type(self), param, None), lazy_property):
                continue  # a parameter derived from another one: not computed unless asked for
            value = getattr(self, param)
            if not bool(constraint.check(value).all()):
                raise ValueError(
                    f"Expected parameter {param} ({type(value).__name__} of shape {tuple(value.shape)}) "
                    f"of distribution {self!r} to satisfy the constraint {constraint!r}, "
                    f"but found invalid values:\n{value}"
                )

    def expand(self, batch_shape: Sequence[int], _instance=None) -> Distribution:
        """A new distribution with its batch dimensions expanded to ``batch_shape`` (the parameters are
        expanded views, not copies, and not validated again)."""
        raise NotImplementedError

    @property
    def batch_shape(self) -> Size:
        """The shape over which the parameters are batched."""
        return self._batch_shape

    @property
    def event_shape(self) -> Size:
        """The shape of a single sample, without batching."""
        return self._event_shape

    @property
    def arg_constraints(self) -> dict[str, constraints.Constraint]:
        """Each parameter's name and the :class:`~kiln.distributions.constraints.Constraint` it satisfies."""
        raise NotImplementedError

    @property
    def support(self) -> constraints.Constraint | None:
        """The :class:`~kiln.distributions.constraints.Constraint` the values of the distribution satisfy."""
        raise NotImplementedError

    @property
    def mean(self) -> Tensor:
        """The mean."""
        raise NotImplementedError

    @property
    def mode(self) -> Tensor:
        """The mode."""
        raise NotImplementedError(f"{self.__class__} does not implement mode")

    @property
    def variance(self) -> Tensor:
        """The variance."""
        raise NotImplementedError

    @property
    def stddev(self) -> Tensor:
        """The standard deviation."""
        return self.variance.sqrt()

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """A sample of shape ``sample_shape + batch_shape + event_shape``, drawn without recording gradients."""
        with kiln.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """A reparameterised sample of shape ``sample_shape + batch_shape + event_shape``: gradients flow
        from it to the parameters (only when ``has_rsample``)."""
        raise NotImplementedError

    def sample_n(self, n: int) -> Tensor:
        """``n`` samples (deprecated, as in PyTorch: use ``sample((n,))``)."""
        warnings.warn("`sample_n(n)` will be deprecated. Use `sample((n,))` instead.", FutureWarning, stacklevel=2)
        return self.sample(Size((n,)))

    def log_prob(self, value: Tensor) -> Tensor:
        """The log of the probability density (or mass) function at ``value``."""
        raise NotImplementedError

    def cdf(self, value: Tensor) -> Tensor:
        """The cumulative distribution function at ``value``."""
        raise NotImplementedError

    def icdf(self, value: Tensor) -> Tensor:
        """The inverse of the cumulative distribution function at ``value``."""
        raise NotImplementedError

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Every value of a discrete distribution along dimension 0: shape ``(cardinality,) + batch_shape +
        event_shape``, or with singleton batch dimensions when ``expand`` is false."""
        raise NotImplementedError

    def entropy(self) -> Tensor:
        """The entropy, of shape ``batch_shape``."""
        raise NotImplementedError

    def perplexity(self) -> Tensor:
        """``exp(entropy())``, of shape ``batch_shape``."""
        return kiln.exp(self.entropy())

    def _extended_shape(self, sample_shape: Sequence[int] = Size()) -> Size:
        """``sample_shape + batch_shape + event_shape``."""
        return Size(tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape))

    def _validate_sample(self, value) -> None:
        """Check that ``value``'s rightmost dimensions broadcast with the batch and event shapes and that it
        lies in the support, with PyTorch's ``ValueError``\\ s."""
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        n_event = len(self._event_shape)
        if tuple(value.shape[value.dim() - n_event :]) != tuple(self._event_shape):
            raise ValueError(
                f"The right-most size of value must match event_shape: {value.shape} vs {self._event_shape}."
            )
        actual, expected = value.shape, Size(tuple(self._batch_shape) + tuple(self._event_shape))
        for i, j in zip(reversed(actual), reversed(expected)):
            if i != 1 and j != 1 and i != j:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {actual} vs {expected}.")
        try:
            support = self.support
        except NotImplementedError:
            warnings.warn(
                f"{self.__class__} does not define `support` to enable sample validation. Please initialize "
                "the distribution with `validate_args=False` to turn off validation.",
                stacklevel=2,
            )
            return
        if support is None:
            raise AssertionError("support is unexpectedly None")
        if not bool(support.check(value).all()):
            raise ValueError(
                f"Expected value argument ({type(value).__name__} of shape {tuple(value.shape)}) "
                f"to be within the support ({support!r}) of the distribution {self!r}, "
                f"but found invalid values:\n{value}"
            )

    def _get_checked_instance(self, cls, _instance=None):
        if _instance is None and type(self).__init__ != cls.__init__:
            raise NotImplementedError(
                f"Subclass {self.__class__.__name__} of {cls.__name__} that defines a custom __init__ method "
                "must also define a custom .expand() method."
            )
        return self.__new__(type(self)) if _instance is None else _instance

    def __repr__(self) -> str:
        shown = []
        for p in self.arg_constraints:
            if p in self.__dict__:
                v = self.__dict__[p]
                shown.append(f"{p}: {v if v.numel() == 1 else v.size()}")
        return f"{type(self).__name__}({', '.join(shown)})"
