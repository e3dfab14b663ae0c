"""The two kernels of gradient scaling (kiln-amp's ``GradScaler``), PyTorch's
``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_`` one tensor at a time.

Both write into their arguments and stay on the gradients' device: the scaler reads one number back
to the host per step (whether to skip it), nothing more. The references here serve every device type
through the device contract (a host round trip off the CPU); kiln-cpu replaces the first with a fused
Numba kernel, and a device plugin may register its own.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._dispatch import op
from kiln._ops.copy import host_array, write_from_host
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["_amp_non_finite_check_and_unscale_", "_amp_update_scale_"]


def _scalar_float32(name: str, t, device) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a Tensor, not {type(t).__name__}")
    if t.numel() != 1:
        raise RuntimeError(f"{name} must be a 1-element tensor.")
    if t._dtype is not dt.float32:
        raise RuntimeError(f"{name} must be a float tensor.")
    if t._device != device:
        raise RuntimeError(f"{name} must be on the same device as the scaled tensors ({device}), got {t._device}")


def _unscale_meta(self, found_inf, inv_scale):
    if not isinstance(self, Tensor):
        raise TypeError(
            f"_amp_non_finite_check_and_unscale_(): argument 'self' must be Tensor, not {type(self).__name__}"
        )
    if not self._dtype.is_floating_point:
        raise RuntimeError("_amp_non_finite_check_and_unscale_: scaled_grads must be floating point tensors.")
    _scalar_float32("found_inf", found_inf, self._device)
    _scalar_float32("inv_scale", inv_scale, self._device)
    return Spec((self._shape, self._dtype, self._device))


def _read(t: Tensor) -> np.ndarray:
    return t._numpy() if t._device is CPU else host_array(t)


def _write(t: Tensor, a: np.ndarray) -> None:
    if t._device is not CPU:
        write_from_host(t, a)


def _unscale_kernel(spec, self, found_inf, inv_scale):
    """Reference: set ``found_inf`` to 1 if ``self`` holds an inf or NaN, and multiply ``self`` by ``inv_scale``."""
    g = _read(self)
    work = g.astype(np.float32) if self._dtype in (dt.float16, dt.bfloat16) else g
    if not np.isfinite(work).all():
        f = _read(found_inf)
        f[...] = 1.0
        _write(found_inf, f)
    inv = np.float32(_read(inv_scale).reshape(()))
    if self._device is CPU and work is g:
        np.multiply(g, inv, out=g, casting="unsafe")
    else:
        g = (work * inv).astype(g.dtype)
        if self._device is CPU:
            self._numpy()[...] = g
        else:
            write_from_host(self, g)
    return self


@op(meta=_unscale_meta, reference=_unscale_kernel, device_generic=True, tags=("inplace",))
def _amp_non_finite_check_and_unscale_(self: Tensor, found_inf: Tensor, inv_scale: Tensor) -> Tensor:
    """Gradient scaling's check and unscale in one pass over ``self`` (a gradient): ``found_inf`` (a
    1-element float32 tensor) becomes 1.0 if ``self`` holds an inf or NaN, and ``self`` is multiplied by
    ``inv_scale`` (1-element float32) in place; returns ``self``. Not differentiable."""


def _update_meta(self, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    _scalar_float32("current_scale", self, self._device if isinstance(self, Tensor) else None)
    if not isinstance(growth_tracker, Tensor) or growth_tracker.numel() != 1 or growth_tracker._dtype is not dt.int32:
        raise RuntimeError("growth_tracker must be a 1-element int32 tensor.")
    _scalar_float32("found_inf", found_inf, self._device)
    if growth_tracker._device != self._device:
        raise RuntimeError(f"growth_tracker must be on {self._device}, got {growth_tracker._device}")
    if not isinstance(growth_interval, int) or isinstance(growth_interval, bool) or growth_interval < 1:
        raise RuntimeError(f"growth_interval must be a positive int, got {growth_interval!r}")
    return Spec((self._shape, self._dtype, self._device))


def _update_kernel(spec, self, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """Reference: PyTorch's scale update rule (see :func:`_amp_update_scale_`)."""
    scale, tracker, found = _read(self), _read(growth_tracker), _read(found_inf)
    if found.reshape(()) != 0:
        scale[...] = np.float32(scale * np.float32(backoff_factor))
        tracker[...] = 0
    else:
        successful = int(tracker.reshape(())) + 1
        if successful == growth_interval:
            grown = np.float32(scale.reshape(()) * np.float32(growth_factor))
            if np.isfinite(grown):
                scale[...] = grown
            tracker[...] = 0
        else:
            tracker[...] = successful
    _write(self, scale)
    _write(growth_tracker, tracker)
    return self


@op(meta=_update_meta, reference=_update_kernel, device_generic=True, tags=("inplace",))
def _amp_update_scale_(
    self: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> Tensor:
    """Gradient scaling's scale update, in place on ``self`` (the 1-element float32 scale): after a step
    with an inf or NaN (``found_inf`` nonzero) the scale is multiplied by ``backoff_factor`` and
    ``growth_tracker`` (1-element int32) resets; otherwise the tracker counts one more good step, and
    at ``growth_interval`` of them the scale is multiplied by ``growth_factor`` (unless that overflows)
    and the tracker resets. Returns ``self``. Not differentiable."""
