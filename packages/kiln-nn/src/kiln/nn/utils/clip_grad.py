"""Gradient clipping: ``clip_grad_norm_`` and ``clip_grad_value_`` (``torch.nn.utils``)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from kiln import Tensor
from kiln.autograd.grad_mode import no_grad

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_", "get_total_norm"]


def _as_list(tensors) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        return [tensors]
    return list(tensors)


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together, as if concatenated into one vector."""
    from kiln import stack, tensor
    from kiln.linalg import vector_norm

    tensors = _as_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    with no_grad():
        norms = [vector_norm(t, norm_type) for t in tensors]
        total = vector_norm(stack([n.to(norms[0].dtype) for n in norms]), norm_type)
    if error_if_nonfinite and (total.isnan().item() or total.isinf().item()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    return total


def clip_grad_norm_(
    parameters: Iterable[Tensor] | Tensor,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scale the gradients of ``parameters`` in place so their joint norm is at most ``max_norm``.

    Returns the total norm before clipping. ``norm_type`` may be ``inf``. ``foreach`` is accepted for
    PyTorch compatibility (a backend may fuse the per-tensor loop).
    """
    parameters = _as_list(parameters)  # once: a generator (model.parameters()) can be read only once
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        from kiln import tensor

        return tensor(0.0)
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def clip_grads_with_norm_(
    parameters: Iterable[Tensor] | Tensor, max_norm: float, total_norm: Tensor, foreach: bool | None = None
) -> None:
    """Scale the gradients of ``parameters`` in place by ``min(max_norm / (total_norm + 1e-6), 1)``, the second
    half of :func:`clip_grad_norm_` for a ``total_norm`` computed elsewhere (:func:`get_total_norm`)."""
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if not grads:
        return
    with no_grad():
        # min() keeps a NaN coefficient (a non-finite norm scales the gradients to NaN, as in PyTorch)
        clip_coef = float(max_norm) / (float(total_norm) + 1e-6)
        clip_coef_clamped = min(clip_coef, 1.0)
        for g in grads:
            g.mul_(clip_coef_clamped)


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None):
    """Deprecated alias of :func:`clip_grad_norm_`."""
    warnings.warn(
        "`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`.",
        FutureWarning,
        stacklevel=2,
    )
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` in place to ``[-clip_value, clip_value]``."""
    clip_value = float(clip_value)
    with no_grad():
        for p in _as_list(parameters):
            if p.grad is not None:
                p.grad.clamp_(min=-clip_value, max=clip_value)
