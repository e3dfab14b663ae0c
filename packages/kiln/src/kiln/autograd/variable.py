"""``Variable`` and ``variable``: PyTorch's pre-0.4 autograd wrapper, kept as deprecated aliases.

Since PyTorch 0.4 every tensor is a "Variable": ``Variable(t)`` returns a tensor sharing ``t``'s data and
``isinstance(t, Variable)`` holds for every tensor."""

from __future__ import annotations

import warnings

from kiln._tensor import Tensor

__all__ = ["Variable", "variable"]


class _VariableMeta(type):
    def __instancecheck__(cls, other) -> bool:
        return isinstance(other, Tensor)


class _ExecutionEngine:
    """``Variable._execution_engine``: the autograd engine's handle in PyTorch, kept for its
    ``queue_callback`` (what DistributedDataParallel-style code calls)."""

    @staticmethod
    def queue_callback(callback) -> None:
        """Run ``callback()`` when the running backward pass finishes (:func:`kiln.autograd.engine.queue_callback`)."""
        from kiln.autograd.engine import queue_callback

        queue_callback(callback)


class Variable(metaclass=_VariableMeta):
    """Deprecated (``torch.autograd.Variable``): ``Variable(data, requires_grad=False)`` is a new tensor
    sharing ``data``'s memory, detached from its graph, requiring grad as asked (``Variable()``: an empty
    tensor); every tensor is an instance. ``volatile`` has no effect (a warning says so; use
    :class:`kiln.no_grad`)."""

    _execution_engine = _ExecutionEngine()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = False, volatile: bool = False) -> Tensor:
        if volatile:
            warnings.warn(
                "volatile was removed and now has no effect. Use `with kiln.no_grad():` instead.", stacklevel=2
            )
        if data is None:
            from kiln._ops.creation import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        return data.detach().requires_grad_(requires_grad)


def variable(*args, **kwargs):
    """Removed (``torch.autograd.variable``): raises, pointing to :func:`kiln.tensor`."""
    raise RuntimeError("kiln.autograd.variable(...) is deprecated, use kiln.tensor(...) instead")
