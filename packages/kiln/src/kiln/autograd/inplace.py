"""Autograd for in-place writes through views.

When an in-place op writes into a view, the *base* tensor's values change, so the base gets a new
history: a :class:`CopySlices` node that routes the incoming gradient for the written region through
the in-place op's own node and passes the rest straight to the base's old history. The view then
becomes a fresh ``as_strided`` view of the base, so later uses of either see the new history.
"""

from __future__ import annotations

from kiln._tensor import Tensor
from kiln.autograd.graph import Node, _edge


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
    from kiln._ops.strided import as_strided
    from kiln._ops.views import recorded_view

    base = view._base
    node = CopySlices((_edge(base), *out.grad_fn.next_functions))
    node.base_geometry = (base._shape, base._stride, base._offset)
    node.view_geometry = (view._shape, view._stride, view._offset)
    node.fn = out.grad_fn
    base.grad_fn = node
    base._output_nr = 0
    base._requires_grad = True
    geometry = (view._shape, view._stride, view._offset)
    fresh = recorded_view(as_strided, base, geometry, *geometry)
    view.grad_fn = fresh.grad_fn
    view._output_nr = 0
    view._requires_grad = True
    view._view_vc = view._vc[0]
