"""Autograd for in-place writes: ``copy_``'s node, and writes through views.

``self.copy_(src)`` gives ``self`` a :class:`CopyBackwards` node, as PyTorch does: the gradient flows to
``src`` (summed over the dims the write broadcast it along, cast back to its dtype and device), and
``self``'s old history gets zeros. When an in-place op writes into a view, the *base* tensor's values change, so the base gets a new
history: a :class:`CopySlices` node that routes the incoming gradient for the written region through
the in-place op's own node and passes the rest straight to the base's old history. The view then
becomes a fresh ``as_strided`` view of the base, so later uses of either see the new history.
"""

from __future__ import annotations

from kiln._lazy import first_call
from kiln._tensor import Tensor
from kiln.autograd.graph import _NO_EDGE, Node, _edge, _fit_to_input, _refresh_view_history

_zeros_like = first_call(globals(), "kiln._ops.creation", "zeros_like", "_zeros_like")  # kiln._ops imports this


class CopyBackwards(Node):
    """The history of a tensor ``copy_`` wrote a source that requires grad into. Edges: ``self``'s old
    history (whose values the write replaced: it gets zeros), then the source; a write into a view has the
    source's edge alone, since the :class:`CopySlices` node of its base routes the old history."""

    __slots__ = ("source_meta",)

    def name(self) -> str:
        return "kiln::autograd::CopyBackwards"

    def apply(self, grads: tuple) -> tuple:
        (grad,) = grads
        _shape, dtype, device = self.source_meta
        # cast first, then sum over the broadcast dims in the source's dtype (PyTorch's order: a float32 source
        # written into bfloat16 is summed in float32)
        g = grad if grad._device == device and grad._dtype is dtype else grad.to(device, dtype)
        g = _fit_to_input(g, self.source_meta, self, len(self.next_functions) - 1)
        if len(self.next_functions) == 1:
            return (g,)
        return (None if self.next_functions[0][0] is None else _zeros_like(grad), g)


def copy_node(self: Tensor, src: Tensor) -> CopyBackwards:
    """The node of ``self.copy_(src)`` for a ``src`` that requires grad (made before the write)."""
    if self._base is not None:
        node = CopyBackwards((_edge(src),))
    else:
        node = CopyBackwards((_edge(self) if self._requires_grad else _NO_EDGE, _edge(src)))
    node.source_meta = (src._shape, src._dtype, src._device)
    return node


class CopySlices(Node):
    """The history of a base tensor after an in-place op wrote into one of its views."""

    __slots__ = ("base_geometry", "view_geometry", "fn")

    def name(self) -> str:
        return "kiln::autograd::CopySlices"

    def apply(self, grads: tuple) -> tuple:
        from kiln._ops.strided import _strided_gather, _strided_zero

        (grad,) = grads
        # Positions are storage positions: the base's geometry places ``grad``, the view's selects.
        region = _strided_gather(grad, self.base_geometry, self.view_geometry)
        fn_grads = self.fn.apply((region,))
        rest = _strided_zero(grad, self.base_geometry, self.view_geometry)
        return (rest, *fn_grads)

    def release(self) -> None:
        self.fn.release()


def rebase_view_history(view: Tensor, out: Tensor) -> None:
    """``view`` was overwritten in place with ``out`` (which carries the op's node): rewrite history."""
    base = view._base
    node = CopySlices((_edge(base), *out.grad_fn.next_functions))
    node.base_geometry = (base._shape, base._stride, base._offset)
    node.view_geometry = (view._shape, view._stride, view._offset)
    node.fn = out.grad_fn
    base.grad_fn = node
    base._output_nr = 0
    base._requires_grad = True
    view._requires_grad = True
    _refresh_view_history(view)  # the view, from the base's new history
