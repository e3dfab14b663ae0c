"""Small tensor utilities PyTorch also has at its top level: ``fill``/``fill_``, ``zero_``, ``detach``/
``detach_``, ``index_put_``; and the ``Tensor`` methods ``type_as``, ``module_load``, ``apply_`` and ``map_``
(the last two run a Python function on every element of a CPU tensor, as PyTorch's do: slow, for tests
and small data).
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._state import state
from kiln._tensor import Tensor

__all__ = ["fill", "fill_", "zero_", "detach", "detach_", "index_put_"]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _need_tensor(name: str, arg: str, value, position: int = 1) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not {type(value).__name__}")


def fill(input: Tensor, value) -> Tensor:
    """A copy of ``input`` with every element set to ``value`` (a number or a 0-d tensor, whose gradient is
    the sum of the result's)."""
    from kiln._ops.creation import ones
    from kiln._ops.elementwise import where

    _need_tensor("fill", "input", input)
    if not isinstance(value, Tensor):
        return input.clone().fill_(value)
    if value.dim() != 0:
        raise RuntimeError(
            f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions."
        )
    # every element from value: input's gradient is zeros, value's the sum (where's formulas)
    everywhere = ones(input._shape, dtype=dt.bool, device=input._device)
    return where(everywhere, value.to(input._dtype), input)


def fill_(input: Tensor, value) -> Tensor:
    """Set every element of ``input`` to ``value`` in place (:meth:`kiln.Tensor.fill_`)."""
    _need_tensor("fill_", "input", input)
    return input.fill_(value)


def zero_(input: Tensor) -> Tensor:
    """Set every element of ``input`` to zero in place (:meth:`kiln.Tensor.zero_`)."""
    _need_tensor("zero_", "input", input)
    return input.zero_()


def detach(input: Tensor) -> Tensor:
    """``input``'s values outside the autograd graph, sharing its storage (:meth:`kiln.Tensor.detach`)."""
    _need_tensor("detach", "input", input)
    return input.detach()


def detach_(input: Tensor) -> Tensor:
    """Detach ``input`` from the autograd graph in place (:meth:`kiln.Tensor.detach_`)."""
    _need_tensor("detach_", "input", input)
    return input.detach_()


def index_put_(input: Tensor, indices, values: Tensor, accumulate: bool = False) -> Tensor:
    """Write ``values`` into ``input`` at the index tensors ``indices``, in place (:func:`kiln.index_put`)."""
    _need_tensor("index_put_", "input", input)
    return input.index_put_(indices, values, accumulate)


def _type_as(self: Tensor, other: Tensor) -> Tensor:
    """This tensor converted to ``other``'s dtype (and device type); ``self`` when it already has them."""
    _need_tensor("type_as", "other", other)
    device = self._device if other._device.type == self._device.type else other._device
    return self.to(device=device, dtype=other._dtype)


def _python_value(v) -> numbers.Number:
    if not isinstance(v, (numbers.Real, np.bool_)) or isinstance(v, complex):
        raise TypeError(f"must be real number, not {type(v).__name__}")
    return v


def _apply_each(self: Tensor, name: str, fn, others: tuple) -> Tensor:
    """Set each element of ``self`` to ``fn(element, *(the elements of others at its position))``."""
    if self._device is not CPU:
        raise TypeError(f"{name} is only implemented on CPU tensors")
    for t in (self, *others):
        if t.requires_grad:
            raise RuntimeError(
                f"Can't call {name}() on Variable that requires grad. Use var.detach().{name}() instead."
            )
    if not callable(fn):
        raise TypeError(f"'{type(fn).__name__}' object is not callable")
    for mode in state.post_autograd_modes:  # Python computes and writes the values: a tracer must know
        for t in (self, *others):
            mode.host_read(t, "numpy")
    a = self._numpy()
    srcs = [o._numpy() for o in others]
    for idx in np.ndindex(a.shape):
        value = _python_value(fn(a[idx].item(), *(s[idx].item() for s in srcs)))
        a[idx] = np.asarray(value).astype(a.dtype)  # a cast, wrapping as PyTorch's does
    self._vc[0] += 1
    return self


def _apply_(self: Tensor, callable) -> Tensor:
    """Replace each element by ``callable(element)`` (a Python number of the dtype's kind), in place; CPU
    tensors that do not require grad only."""
    return _apply_each(self, "apply_", callable, ())


def _map_(self: Tensor, tensor: Tensor, callable) -> Tensor:
    """Replace each element by ``callable(element, other)``, ``other`` the element of ``tensor`` (of this
    tensor's dtype, broadcast to its shape) at the same position, in place; CPU tensors only."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"map_(): argument 'other' (position 1) must be Tensor, not {type(tensor).__name__}")
    if tensor._dtype is not self._dtype:
        raise TypeError(f"map_: expected {self.type()} for 'other' (got {tensor.type()})")
    return _apply_each(self, "map_", callable, (tensor.expand(self._shape),))


def _map2_(self: Tensor, x: Tensor, y: Tensor, callable) -> Tensor:
    """Replace each element by ``callable(element, x_element, y_element)`` (``x`` and ``y`` of this tensor's
    dtype, broadcast to its shape), in place; CPU tensors only."""
    for arg, value, position in (("x", x, 1), ("y", y, 2)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"map2_(): argument '{arg}' (position {position}) must be Tensor, not {type(value).__name__}"
            )
        if value._dtype is not self._dtype:
            raise TypeError(f"map2_: expected {self.type()} for argument '{arg}' (got {value.type()})")
    return _apply_each(self, "map2_", callable, (x.expand(self._shape), y.expand(self._shape)))


def _resize(self: Tensor, *sizes) -> Tensor:
    """Deprecated (PyTorch warns): this tensor's elements in another shape of as many elements, with
    autograd (``reshape``); ``resize_`` is the in-place one that may change the element count."""
    import warnings

    warnings.warn("non-inplace resize is deprecated", UserWarning, stacklevel=2)
    shape = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)
    n = int(np.prod(shape, dtype=np.int64))
    if n != self.numel():
        raise RuntimeError(
            f"requested resize to {'x'.join(map(str, shape))} ({n} elements in total), but the given tensor has a "
            f"size of {'x'.join(map(str, self._shape))} ({self.numel()} elements). autograd's resize can only change "
            "the shape of a given tensor, while preserving the number of elements. "
        )
    return self.reshape(shape)


def _resize_as(self: Tensor, tensor: Tensor) -> Tensor:
    """Deprecated (PyTorch warns): :meth:`resize` to ``tensor``'s shape."""
    import warnings

    warnings.warn("non-inplace resize_as is deprecated", UserWarning, stacklevel=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _resize(self, tuple(tensor._shape))


def _is_distributed(self: Tensor) -> bool:
    """False: no kiln tensor is split across processes (a legacy query)."""
    return False


def _module_load(self: Tensor, other: Tensor, assign: bool = False) -> Tensor:
    """What ``other`` (a state-dict value) becomes when loaded into this parameter or buffer: a new tensor,
    never ``self`` or ``other`` (``other`` detached with ``assign``, else this tensor after copying ``other``
    into it, detached)."""
    if assign:
        return other.detach()
    return self.copy_(other).detach()


Tensor.type_as = _type_as
Tensor.module_load = _module_load
Tensor.apply_ = _apply_
Tensor.map_ = _map_
Tensor.map2_ = _map2_
Tensor.resize = _resize
Tensor.resize_as = _resize_as
Tensor.is_distributed = _is_distributed
