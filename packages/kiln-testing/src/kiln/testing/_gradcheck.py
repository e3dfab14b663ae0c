"""``kiln.testing.gradcheck`` / ``gradgradcheck``: the core's finite-difference checks, on any device.

The core's checks read values with ``.numpy()``, which only CPU tensors allow (as in PyTorch). For
inputs on another device, the check runs on float64 CPU *copies* of the inputs and the function moves
them to the device on entry and its outputs back on exit. Both moves are differentiable, so the
function — forward and backward — still computes entirely on the device; only the finite-difference
bookkeeping happens on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import kiln
from kiln.autograd.gradcheck import GradcheckError
from kiln.autograd.gradcheck import gradcheck as _core_gradcheck
from kiln.autograd.gradcheck import gradgradcheck as _core_gradgradcheck

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


def _device_of(inputs: tuple):
    devices = {x.device for x in inputs if isinstance(x, kiln.Tensor)}
    off_cpu = [d for d in devices if d.type != "cpu"]
    if len(off_cpu) > 1:
        raise ValueError(f"gradcheck inputs are on several devices: {sorted(map(str, devices))}")
    return off_cpu[0] if off_cpu else None


def _on_host(func: Callable, inputs: tuple, grad_outputs: tuple = ()):
    """(host function, host inputs, host grad_outputs) for inputs that live on a device."""
    placement = [x.device if isinstance(x, kiln.Tensor) else None for x in (*inputs, *grad_outputs)]

    def host_copy(x):
        if not isinstance(x, kiln.Tensor):
            return x
        return x.detach().cpu().clone().requires_grad_(x.requires_grad)

    host_inputs = tuple(host_copy(x) for x in inputs)
    host_grad_outputs = tuple(host_copy(x) for x in grad_outputs)

    def on_device(*args):
        out = func(*(a.to(d) if d is not None else a for a, d in zip(args, placement)))
        if isinstance(out, kiln.Tensor):
            return out.cpu()
        return tuple(o.cpu() if isinstance(o, kiln.Tensor) else o for o in out)

    return on_device, host_inputs, host_grad_outputs


def gradcheck(
    func: Callable[..., kiln.Tensor | Sequence[kiln.Tensor]],
    inputs: kiln.Tensor | Sequence,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    **kwargs,
) -> bool:
    """Check ``func``'s analytical gradients at ``inputs`` against central finite differences.

    Inputs that require grad should be float64, and may live on any device (all on the same one).
    Returns True, or raises ``GradcheckError`` (returns False with ``raise_exception=False``).
    """
    inputs = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    if _device_of(inputs) is None:
        return _core_gradcheck(func, inputs, eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, **kwargs)
    host_func, host_inputs, _ = _on_host(func, inputs)
    return _core_gradcheck(
        host_func, host_inputs, eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, **kwargs
    )


def gradgradcheck(
    func: Callable[..., kiln.Tensor | Sequence[kiln.Tensor]],
    inputs: kiln.Tensor | Sequence,
    grad_outputs: kiln.Tensor | Sequence | None = None,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    **kwargs,
) -> bool:
    """Check second derivatives (:func:`gradcheck` of the function computing ``func``'s gradients), on any device."""
    inputs = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    if grad_outputs is not None and not isinstance(grad_outputs, tuple):
        grad_outputs = tuple(grad_outputs) if isinstance(grad_outputs, list) else (grad_outputs,)
    if _device_of(inputs + (grad_outputs or ())) is None:
        return _core_gradgradcheck(
            func, inputs, grad_outputs, eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception, **kwargs
        )
    host_func, host_inputs, host_grad_outputs = _on_host(func, inputs, grad_outputs or ())
    return _core_gradgradcheck(
        host_func,
        host_inputs,
        host_grad_outputs or None,
        eps=eps,
        atol=atol,
        rtol=rtol,
        raise_exception=raise_exception,
        **kwargs,
    )
