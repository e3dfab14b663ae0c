"""Autograd for in-place writes: ``copy_``'s node, and writes through views.

``self.copy_(src)`` gives ``self`` a :class:`CopyBackwards` node, as PyTorch does: the gradient flows to
``src`` (summed over the dims the write broadcast it along, cast back to its dtype and device), and
``self``'s old history gets zeros. When an in-place op writes into a view, the *base* tensor's values change, so the base gets a new
history: a :class:`CopySlices` node that routes the incoming gradient for the written region through
the in-place op's own node and passes the rest straight to the base's old history. The view then
becomes a fresh ``as_strided`` view of the base, so later uses of either see the new history: made when the
view's history is next read (``grad_fn``, or an op that records it), as PyTorch does, since most such views
(``s[i] = y``'s) are never used again.
"""

from __future__ import annotations

from kiln._lazy import first_call
from kiln._tensor import Tensor
from kiln.autograd.graph import _FREED_MESSAGE, _NO_EDGE, Node, _edge, _fit_to_input, _register_retain_grad

_zeros_like = first_call(globals(), "kiln._ops.creation", "zeros_like", "_zeros_like")  # kiln._ops imports this
_zeros = first_call(globals(), "kiln._ops.creation", "zeros", "_zeros")


class CopyBackwards(Node):
    """The history of a tensor whose values an in-place write replaced: ``copy_`` (PyTorch's
    ``CopyBackwards``), and the writes whose values do not depend on the old ones, which PyTorch names
    after their op (``fill_``: ``FillBackward2``, ``zero_``: ``ZeroBackward0``, ``eq_``: ``EqBackward1``,
    ``normal_``: ``NormalBackward0``; :func:`copy_node`'s ``label``).

    Edges: ``self``'s old history, which gets zeros (none for a view: the :class:`CopySlices` node of its
    base routes that), then one per tensor the write read (``operands``): the source's history where the
    write copies a source that requires grad (the gradient, cast to the source's dtype and device and
    summed over the dims the write broadcast it along), else no edge."""

    __slots__ = ("source_meta", "operand_meta", "label", "has_self")

    def name(self) -> str:
        return self.label

    def apply(self, grads: tuple) -> tuple:
        (grad,) = grads
        out = []
        if self.has_self:
            out.append(None if self.next_functions[0][0] is None else _zeros_like(grad))
        if self.source_meta is not None:
            _shape, dtype, device = self.source_meta
            # cast first, then sum over the broadcast dims in the source's dtype (PyTorch's order: a float32
            # source written into bfloat16 is summed in float32)
            g = grad if grad._device == device and grad._dtype is dtype else grad.to(device, dtype)
            out.append(_fit_to_input(g, self.source_meta, self, len(out)))
        for meta in self.operand_meta:  # operands the values do not depend on: zeros where they require grad
            out.append(None if meta is None else _zeros(meta[0], dtype=meta[1], device=meta[2]))
        return tuple(out)


def copy_node(
    self: Tensor,
    src: Tensor | None = None,
    label: str | None = None,
    operands: tuple = (),
    through_base: bool = True,
) -> CopyBackwards:
    """The node of an in-place write into ``self`` (made before the write): of ``copy_(src)``, whose source's
    edge carries the gradient when it requires grad, or of a write that read ``operands`` (tensors, whose
    values the result does not depend on: zeros for those that require grad) and no source that does. ``label``: the node's name (None: ``copy_``'s). A view's node
    has no edge to its old history when its base's :class:`CopySlices` routes that (``through_base``)."""
    view = self._base is not None and through_base
    edges = [] if view else [_edge(self)]
    meta, others = None, ()
    if src is not None and src.requires_grad:
        edges.append(_edge(src))
        meta = (src._shape, src._dtype, src._device)
    else:
        others = tuple((a._shape, a._dtype, a._device) if a.requires_grad else None for a in operands)
        edges.extend(_NO_EDGE if m is None else _edge(a) for a, m in zip(operands, others))
    node = CopyBackwards(tuple(edges))
    node.source_meta, node.operand_meta = meta, others
    node.label, node.has_self = label or "kiln::autograd::CopyBackwards", not view
    return node


class CopySlices(Node):
    """The history of a base tensor after an in-place op wrote into one of its views."""

    __slots__ = ("base_geometry", "view_geometry", "fn")

    def name(self) -> str:
        return "kiln::autograd::CopySlices"

    def apply(self, grads: tuple) -> tuple:
        from kiln._ops.strided import _strided_gather, _strided_zero

        (grad,) = grads
        fn = self.fn
        if fn is None:
            raise RuntimeError(_FREED_MESSAGE)
        # Positions are storage positions: the base's geometry places ``grad``, the view's selects.
        region = _strided_gather(grad, self.base_geometry, self.view_geometry)
        fn_grads = fn.apply((region,))
        rest = _strided_zero(grad, self.base_geometry, self.view_geometry)
        return (rest, *fn_grads)

    def release(self) -> None:
        """Let go of the in-place op's node (as PyTorch's ``CopySlices`` does), without freeing what it saved:
        a double backward may still reach that node directly, through the op's saved result."""
        self.fn = None


def rebase_view_history(view: Tensor, out: Tensor) -> None:
    """``view`` was overwritten in place with ``out`` (which carries the op's node): rewrite history."""
    base = view._base
    node = CopySlices((_edge(base), *out._grad_fn.next_functions))
    node.base_geometry = (base._shape, base._stride, base._offset)
    node.view_geometry = (view._shape, view._stride, view._offset)
    node.fn = out._grad_fn
    base._grad_fn = node
    base._output_nr = 0
    base._requires_grad = True
    if base._retains_grad:
        _register_retain_grad(base)  # base.grad follows its new history, as PyTorch's
    view._requires_grad = True  # its history, an as_strided view of the base's new one, is made when read
