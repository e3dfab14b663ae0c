"""``Parameter`` and ``Buffer``: tensors that a :class:`kiln.nn.Module` registers when assigned.

A ``Parameter`` is a :class:`kiln.Tensor` subclass sharing storage (and the version counter) with the
tensor it wraps, so ``isinstance(p, kiln.Tensor)`` holds and every op accepts it. Ops on a parameter
return plain tensors, as in PyTorch.
"""

from __future__ import annotations

from kiln import Tensor

__all__ = ["Parameter", "Buffer", "UninitializedParameter", "is_lazy"]


def _wrap(cls, data, requires_grad: bool):
    if data is None:
        from kiln import empty

        data = empty(0)
    if not isinstance(data, Tensor):
        raise TypeError(f"Parameter data must be a kiln.Tensor, got {type(data).__name__}")
    return Tensor._make_subclass(cls, data, requires_grad)


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad)


class Parameter(Tensor):
    """A tensor that is a module parameter (``torch.nn.Parameter``).

    Assigning a ``Parameter`` as a :class:`Module` attribute registers it in ``parameters()``.
    ``Parameter(data, requires_grad=True)`` shares ``data``'s storage; ``requires_grad`` defaults to True.
    """

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        return _wrap(cls, data, requires_grad)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        from kiln import no_grad

        with no_grad():
            out = type(self)(self.detach().clone(), self.requires_grad)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol):
        return _rebuild_parameter, (self.detach(), self.requires_grad)


class UninitializedParameter(Parameter):
    """A parameter whose shape is not known yet (lazy modules); :meth:`materialize` gives it one."""

    def materialize(self, shape, device=None, dtype=None) -> None:
        """Allocate storage of ``shape`` and become a plain :class:`Parameter`."""
        from kiln import empty, get_default_dtype

        data = empty(*shape, device=device or self.device, dtype=dtype or get_default_dtype())
        self.data = data
        self.__class__ = Parameter

    def __repr__(self) -> str:
        return "<UninitializedParameter>"

    def __deepcopy__(self, memo):
        out = UninitializedParameter(None, self.requires_grad)
        memo[id(self)] = out
        return out


def is_lazy(param) -> bool:
    """True when ``param`` is an :class:`UninitializedParameter`."""
    return isinstance(param, UninitializedParameter)


class Buffer(Tensor):
    """A tensor that a :class:`Module` registers as a buffer when assigned (``torch.nn.Buffer``).

    ``persistent=False`` keeps it out of ``state_dict()``. Modules store the plain tensor it wraps.
    """

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True):
        out = _wrap(cls, data, False)
        if data is not None and data.requires_grad:
            out._requires_grad = True
        out.persistent = persistent
        return out

    def _unwrap(self) -> Tensor:
        out = Tensor._make_subclass(Tensor, self)
        out._requires_grad = self._requires_grad
        return out
