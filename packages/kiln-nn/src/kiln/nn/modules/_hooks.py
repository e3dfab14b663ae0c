"""Hook bookkeeping for modules: removable handles and the autograd glue of full backward hooks."""

from __future__ import annotations

import itertools
import warnings

from kiln import Tensor
from kiln.autograd.function import Function

__all__ = ["RemovableHandle", "BackwardHook", "add_hook", "hook_args_kwargs"]

_next_id = itertools.count()


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters the hook (also a context manager)."""

    def __init__(self, hooks_dict: dict, *, extra_dict=None):
        self.hooks_dict = hooks_dict
        self.id = next(_next_id)
        extras = extra_dict if isinstance(extra_dict, list | tuple) else [extra_dict] if extra_dict is not None else []
        self.extra_dicts = tuple(extras)

    def remove(self) -> None:
        """Unregister the hook; removing twice is harmless."""
        for d in (self.hooks_dict, *self.extra_dicts):
            d.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def add_hook(hooks: dict, hook, prepend: bool = False, *, extra_dict=None) -> RemovableHandle:
    """Store ``hook`` in the ordered ``hooks`` (first if ``prepend``) and return the handle that removes it
    (from ``extra_dict`` too: the per-hook flag dicts kept beside ``hooks``)."""
    handle = RemovableHandle(hooks, extra_dict=extra_dict)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def hook_args_kwargs(res, args, kwargs, hook_name) -> tuple:
    """The ``(args, kwargs)`` after a pre-hook that sees both returned ``res``: unchanged for ``None``, else
    ``res``, which must be a pair (torch's message, naming ``hook_name``, otherwise)."""
    if res is None:
        return args, kwargs
    if isinstance(res, tuple) and len(res) == 2:
        return res
    raise RuntimeError(f"{hook_name} must return None or a tuple of (new_args, new_kwargs), but got {res}.")


class _HookIdentity(Function):
    """Identity on a group of tensors whose backward hands the group's gradients to a callback.

    Outputs whose input does not require grad are non-differentiable (their gradient arrives as zeros),
    as in PyTorch's ``BackwardHookFunction``.
    """

    @staticmethod
    def forward(ctx, callback, materialize, *tensors):
        ctx.callback = callback
        ctx.set_materialize_grads(materialize)
        outs = tuple(t.detach() for t in tensors)
        ctx.mark_non_differentiable(*(o for o, t in zip(outs, tensors) if not t.requires_grad))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        out = ctx.callback(grads)
        return (None, None, *out)


def _wrap_tensors(tensors, callback, materialize: bool):
    """Route the tensors of ``tensors`` (a tuple of anything) through one identity node; others unchanged.

    Returns the new tuple and how many of its tensors require grad (nothing is wrapped when none does).
    """
    idx = [i for i, t in enumerate(tensors) if isinstance(t, Tensor)]
    n_grad = sum(1 for i in idx if tensors[i].requires_grad)
    if not n_grad:
        return tensors, 0
    outs = _HookIdentity.apply(callback, materialize, *(tensors[i] for i in idx))
    if not isinstance(outs, tuple):
        outs = (outs,)
    new = list(tensors)
    for i, o in zip(idx, outs):
        new[i] = o
    return tuple(new), n_grad


class BackwardHook:
    """Runs a module's full backward (pre-)hooks: identity nodes on its inputs and outputs.

    The output node sees ``grad_output`` (pre-hooks may replace it); the input node sees ``grad_input``
    and calls ``hook(module, grad_input, grad_output)``, whose non-None result replaces it. When no input
    requires grad, the hooks run from the output node with ``grad_input`` all None, as in PyTorch.
    """

    def __init__(self, module, user_hooks, user_pre_hooks):
        self.module = module
        self.user_hooks = user_hooks
        self.user_pre_hooks = user_pre_hooks
        self.grad_outputs = None
        self.n_inputs = 0
        self.input_positions = ()

    def _check(self, result, expected: int, what: str):
        if not isinstance(result, tuple):
            result = (result,)
        if len(result) != expected:
            raise RuntimeError(
                f"Backward hook returned an invalid number of grad_{what}, got {len(result)}, but expected {expected}"
            )
        return result

    def setup_input_hook(self, args: tuple) -> tuple:
        """Wrap the positional inputs; call before ``forward``."""

        def on_grad_input(grads):
            grad_output = self.grad_outputs
            if self.user_hooks:
                for hook in self.user_hooks:
                    res = hook(self.module, grads, grad_output)
                    if res is not None:
                        grads = self._check(res, len(grads), "input")
            return grads

        self.input_positions = tuple(i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad)
        new, self.n_inputs = _wrap_tensors(args, on_grad_input, True)
        return new

    def setup_output_hook(self, result):
        """Wrap the outputs of ``forward``; returns them (same structure)."""

        def on_grad_output(grads):
            for hook in self.user_pre_hooks:
                res = hook(self.module, grads)
                if res is not None:
                    grads = self._check(res, len(grads), "output")
            self.grad_outputs = grads
            if self.n_inputs == 0 and self.user_hooks:
                warnings.warn(
                    "Full backward hook is firing when gradients are computed with respect to module outputs since "
                    "no inputs require gradients. See "
                    "https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html#torch.nn.Module.register_full_backward_hook "
                    "for more details.",
                    stacklevel=2,
                )
                for hook in self.user_hooks:
                    res = hook(self.module, (None,), grads)
                    if res is not None and any(r is not None for r in (res if isinstance(res, tuple) else (res,))):
                        raise RuntimeError(
                            "Backward hook for Modules where no input requires gradient should always return None or None for all gradients."
                        )
            return grads

        single = not isinstance(result, tuple)
        outs = (result,) if single else result
        # unused outputs keep a None gradient (inputs that need none get zeros), as in PyTorch
        new, _ = _wrap_tensors(outs, on_grad_output, False)
        return new[0] if single else new
