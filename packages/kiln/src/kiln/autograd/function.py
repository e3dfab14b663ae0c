"""Custom differentiable functions: ``kiln.autograd.Function`` with ``forward``/``backward`` staticmethods."""

from __future__ import annotations

import functools
import weakref
from typing import Any

from kiln._state import set_grad_mode
from kiln._tensor import Tensor
from kiln.autograd.graph import Node, SavedTensor, _edge
from kiln.autograd.inplace import rebase_view_history

__all__ = ["Function", "FunctionCtx", "once_differentiable"]


class FunctionCtx:
    """The ``ctx`` passed to a custom Function's ``forward`` and ``backward``."""

    def __init__(self):
        self._saved: tuple = ()
        self._non_differentiable: set[int] = set()
        self._dirty: dict[int, Tensor] = {}
        self.materialize_grads = True
        self.needs_input_grad: tuple[bool, ...] = ()
        self._node: weakref.ref[Node] | None = None  # weak: the node holds the ctx, and the ctx its saved tensors

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        """Save tensors for ``backward``; read them back as ``ctx.saved_tensors``."""
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError("save_for_backward can only save variables, but argument is not a Tensor")
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to :meth:`save_for_backward`, version-checked."""
        node = None if self._node is None else self._node()
        return tuple(s.unpack(node) if isinstance(s, SavedTensor) else s for s in self._saved)

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        """Declare outputs that never get a gradient."""
        self._non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors: Tensor) -> None:
        """Declare inputs that ``forward`` modified in place."""
        self._dirty.update((id(t), t) for t in tensors)

    def set_materialize_grads(self, value: bool) -> None:
        """Whether ``None`` output gradients become zeros before ``backward`` (default True)."""
        self.materialize_grads = value


class _FunctionNode(Node):
    __slots__ = ("fn_cls", "ctx", "output_meta", "_name")

    def name(self) -> str:
        return self._name

    def apply(self, grads: tuple) -> tuple:
        ctx = self.ctx
        if ctx.materialize_grads:
            from kiln._ops.creation import zeros

            grads = tuple(
                zeros(m[0], dtype=m[1], device=m[2]) if g is None else g for g, m in zip(grads, self.output_meta)
            )
        result = self.fn_cls.backward(ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        n_in = len(ctx.needs_input_grad)
        if len(result) < n_in:
            raise RuntimeError(
                f"function {self._name} returned an incorrect number of gradients (expected {n_in}, got {len(result)})"
            )
        result = result[:n_in] if all(r is None for r in result[n_in:]) else result
        if len(result) != n_in:
            raise RuntimeError(
                f"function {self._name} returned an incorrect number of gradients (expected {n_in}, got {len(result)})"
            )
        out = []
        for pos, g in zip(self.ctx._input_positions, (result[i] for i in self.ctx._input_positions)):
            if g is not None and not isinstance(g, Tensor):
                raise TypeError(f"function {self._name} returned a gradient of type {type(g).__name__} at {pos}")
            out.append(g)
        from kiln.autograd.graph import _fit_to_input

        return tuple(
            None if g is None or nf[0] is None else _fit_to_input(g, meta, self, i)
            for i, (g, nf, meta) in enumerate(zip(out, self.next_functions, ctx._input_meta))
        )

    def release(self) -> None:
        for s in self.ctx._saved:
            if isinstance(s, SavedTensor):
                s.freed = True
                s.data = None


class _FunctionMeta(type):
    def __init__(cls, name, bases, attrs):
        super().__init__(name, bases, attrs)
        cls._backward_name = f"{name}Backward"
        # ``type(y.grad_fn).__name__`` is "<Function>Backward", as in PyTorch
        cls._node_class = type(cls._backward_name, (_FunctionNode,), {"__slots__": ()})


class Function(metaclass=_FunctionMeta):
    """Base class for custom autograd functions (``torch.autograd.Function``).

    Subclass with ``@staticmethod forward(ctx, *args)`` and ``@staticmethod backward(ctx, *grads)``,
    then call ``MyFunction.apply(*args)``.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        """Compute the outputs; runs with grad recording disabled."""
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def backward(ctx: FunctionCtx, *grad_outputs: Any) -> Any:
        """Gradients for each ``forward`` input (``None`` for non-tensors), given output gradients."""
        raise NotImplementedError(
            "You must implement either the backward or vjp method for your custom autograd.Function to use it with backward mode AD."
        )

    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            "Legacy autograd function with non-static forward method is deprecated. Please use new-style "
            "autograd function with static forward method."
        )

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward`` and record a node whose backward is ``cls.backward``."""
        ctx = FunctionCtx()
        positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        ctx._input_positions = positions
        ctx._input_meta = [(args[i]._shape, args[i]._dtype, args[i]._device) for i in positions]
        prev = set_grad_mode(False)
        try:
            outputs = cls.forward(ctx, *args, **kwargs)
        finally:
            set_grad_mode(prev)
        record = prev and any(ctx.needs_input_grad)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if not record:
            _count_dirty(ctx)
            return outputs
        if ctx._dirty:
            _check_dirty(ctx, outs)
        node = cls._node_class(tuple(_edge(args[i]) for i in positions), len(outs))
        _count_dirty(ctx)  # after the edges: the node's input is a dirty view's history before the marking
        node.fn_cls = cls
        node.ctx = ctx
        node._name = cls._backward_name
        ctx._node = weakref.ref(node)  # node -> ctx -> node would keep every saved tensor until a gc pass
        arg_ids = {id(args[i]): args[i] for i in positions}
        new_outs = []
        meta = []
        for k, o in enumerate(outs):
            if not isinstance(o, Tensor):
                new_outs.append(o)
                meta.append(None)
                continue
            if id(o) in arg_ids and id(o) not in ctx._dirty:
                o = o.detach()  # an input returned as is: a view, so the input's own history is untouched
            meta.append((o._shape, o._dtype, o._device))
            if id(o) not in ctx._non_differentiable and o._dtype.is_floating_point:
                o._grad_fn = node
                o._requires_grad = True
                o._output_nr = k
                if id(o) in ctx._dirty and o._base is not None:  # (the only tensor returned: _check_dirty)
                    # an input view written in place: its base's history goes through the node (CopySlices), as
                    # after an in-place op on a view, and the view's is re-derived from the base's when read
                    rebase_view_history(o, o)
                else:
                    o._view_vc = o._vc[0]  # a view written in forward: its history is this node's, not its base's
            new_outs.append(o)
        node.output_meta = [m if m is not None else ((), None, None) for m in meta]
        # saved tensors that are outputs must not keep themselves alive through the node
        out_ids = {id(o) for o in new_outs if isinstance(o, Tensor)}
        ctx._saved = tuple(
            None if t is None else SavedTensor(t, id(t) in out_ids, node if id(t) in out_ids else None)
            for t in ctx._saved
        )
        return new_outs[0] if single else tuple(new_outs)


def _check_dirty(ctx: FunctionCtx, outs: tuple) -> None:
    """PyTorch's refusals of a recorded Function's in-place writes (``mark_dirty``): of a leaf that requires
    grad or a view of one, of a view made under no_grad, of an input it does not return, and of a view
    when it returns more than one tensor (its base's ``CopySlices`` would route one output's gradient)."""
    from kiln._ops.copy import _check_inplace_allowed

    returned = {id(o) for o in outs if isinstance(o, Tensor)}
    if any(key not in returned for key in ctx._dirty):
        raise RuntimeError(
            "Some elements marked as dirty during the forward method were not returned as output. The inputs "
            "that are modified inplace must all be outputs of the Function."
        )
    for t in ctx._dirty.values():
        if t._requires_grad and t._base is None and t._grad_fn is None:  # (PyTorch's words for a Function)
            raise RuntimeError("a leaf Variable that requires grad has been used in an in-place operation.")
        _check_inplace_allowed(t)
        if t._base is not None and len(returned) > 1:
            raise RuntimeError(
                "If your Function modifies inplace an input that is a view of another Tensor, your Function cannot "
                "return more than one Tensor. This is not supported by the current autograd engine. You should "
                "either make sure the input is not a view (using .clone() for example) or make your Function only "
                "return one Tensor (potentially splitting it into two Functions: one doing the inplace that returns "
                "a single Tensor and a second one that does the other operations). You can ask on the forum "
                "https://discuss.pytorch.org/ if you need help to do this change."
            )


def _count_dirty(ctx: FunctionCtx) -> None:
    """PyTorch counts ``mark_dirty`` as a write of its own: one more version for each dirty tensor."""
    for t in ctx._dirty.values():
        t._vc[0] += 1


def once_differentiable(fn):
    """Decorate a ``backward`` that is not itself differentiable: it runs with grad recording off."""

    @functools.wraps(fn)
    def wrapper(ctx, *args):
        prev = set_grad_mode(False)
        try:
            return fn(ctx, *args)
        finally:
            set_grad_mode(prev)

    return wrapper
