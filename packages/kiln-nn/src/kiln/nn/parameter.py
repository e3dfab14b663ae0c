"""``Parameter`` and ``Buffer`` (and their uninitialised forms for lazy modules): tensors that a :class:`kiln.nn.Module` registers when assigned.

A ``Parameter`` is a :class:`kiln.Tensor` subclass sharing storage (and the version counter) with the
tensor it wraps, so ``isinstance(p, kiln.Tensor)`` holds and every op accepts it. Ops on a parameter
return plain tensors, as in PyTorch.
"""

from __future__ import annotations

from kiln import Tensor

__all__ = [
    "Parameter",
    "Buffer",
    "UninitializedTensorMixin",
    "UninitializedParameter",
    "UninitializedBuffer",
    "is_lazy",
]


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


_UNINITIALIZED_SHAPE = (
    "Can't access the shape of an uninitialized parameter or buffer. This error usually happens in "
    "`load_state_dict` when trying to load an uninitialized parameter into an initialized one. Call `forward` to "
    "initialize the parameters before accessing their attributes."
)


class UninitializedTensorMixin:
    """What uninitialised parameters and buffers share (``torch.nn.parameter.UninitializedTensorMixin``): no
    shape until :meth:`materialize` gives them one and turns them into ``cls_to_become``."""

    cls_to_become: type = Tensor

    def materialize(self, shape, device=None, dtype=None) -> None:
        """Allocate storage of ``shape`` (on ``device``, of ``dtype``: by default those given at construction)
        and become a plain ``cls_to_become``."""
        from kiln import empty

        data = empty(*shape, device=device or self.device, dtype=dtype or self.dtype)
        self.data = data
        self.__class__ = self.cls_to_become

    @property
    def shape(self):
        """Unknown until materialised: raises PyTorch's ``RuntimeError``."""
        raise RuntimeError(_UNINITIALIZED_SHAPE)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _uninitialized(cls, requires_grad: bool, device, dtype):
    from kiln import empty

    return Tensor._make_subclass(cls, empty(0, device=device, dtype=dtype), requires_grad)


class UninitializedParameter(UninitializedTensorMixin, Parameter):
    """A parameter whose shape is not known yet (lazy modules); :meth:`materialize` gives it one and makes it
    a plain :class:`Parameter` (``torch.nn.UninitializedParameter``)."""

    cls_to_become = Parameter

    def __new__(cls, requires_grad: bool = True, device=None, dtype=None):
        return _uninitialized(cls, requires_grad, device, dtype)

    def __deepcopy__(self, memo):
        out = type(self)(self.requires_grad, self.device, self.dtype)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, protocol):
        return type(self), (self.requires_grad, self.device, self.dtype)


class UninitializedBuffer(UninitializedTensorMixin, Tensor):
    """A buffer whose shape is not known yet (lazy modules, e.g. ``LazyBatchNorm1d``'s running statistics);
    :meth:`materialize` gives it one and makes it a plain tensor (``torch.nn.UninitializedBuffer``)."""

    def __new__(cls, requires_grad: bool = False, device=None, dtype=None, persistent: bool = True):
        out = _uninitialized(cls, requires_grad, device, dtype)
        out.persistent = persistent
        return out

    def __deepcopy__(self, memo):
        out = type(self)(self.requires_grad, self.device, self.dtype, getattr(self, "persistent", True))
        memo[id(self)] = out
        return out


def is_lazy(param) -> bool:
    """True when ``param`` is an uninitialised parameter or buffer (``torch.nn.parameter.is_lazy``)."""
    return isinstance(param, UninitializedTensorMixin)


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
