"""``kiln.amp``: automatic mixed precision, as ``torch.amp``.

* :class:`autocast` (also ``kiln.autocast``): regions in which each op runs in the precision its
  autocast policy on the op record asks for; the same policy on every device.
* :class:`GradScaler`: loss scaling for float16 training, with fused check-and-unscale kernels.
* :func:`custom_fwd` / :func:`custom_bwd`: autocast-aware custom autograd functions.
* ``kiln.cpu.amp`` / ``kiln.cuda.amp`` (any device type's ``.amp``): the older per-device spellings.
"""

from __future__ import annotations

import functools
import types
import warnings

import kiln
from kiln.amp.autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from kiln.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd", "device_amp", "is_autocast_available"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}(args...)` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


@functools.cache
def device_amp(device_type: str) -> types.SimpleNamespace:
    """The ``kiln.<device_type>.amp`` namespace: ``autocast``, ``GradScaler``, ``custom_fwd`` and
    ``custom_bwd`` with the device type filled in (PyTorch's deprecated spellings; each warns once per
    call with the ``kiln.amp`` form to use)."""
    default = kiln.bfloat16 if device_type == "cpu" else kiln.float16

    class _Autocast(autocast):
        __doc__ = f"``kiln.autocast({device_type!r}, ...)`` under its older name."

        def __init__(self, enabled: bool = True, dtype=default, cache_enabled: bool = True):
            _deprecated(f"kiln.{device_type}.amp.autocast", f"kiln.amp.autocast({device_type!r}, args...)")
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class _GradScaler(GradScaler):
        __doc__ = f"``kiln.amp.GradScaler({device_type!r}, ...)`` under its older name."

        def __init__(
            self,
            init_scale: float = 2.0**16,
            growth_factor: float = 2.0,
            backoff_factor: float = 0.5,
            growth_interval: int = 2000,
            enabled: bool = True,
        ):
            _deprecated(f"kiln.{device_type}.amp.GradScaler", f"kiln.amp.GradScaler({device_type!r}, args...)")
            super().__init__(device_type, init_scale, growth_factor, backoff_factor, growth_interval, enabled)

    def _fwd(fwd=None, *, cast_inputs=None):
        _deprecated(f"kiln.{device_type}.amp.custom_fwd", f"kiln.amp.custom_fwd(args..., device_type={device_type!r})")
        return custom_fwd(fwd, device_type=device_type, cast_inputs=cast_inputs)

    def _bwd(bwd=None):
        _deprecated(f"kiln.{device_type}.amp.custom_bwd", f"kiln.amp.custom_bwd(args..., device_type={device_type!r})")
        return custom_bwd(bwd, device_type=device_type)

    _Autocast.__name__ = _Autocast.__qualname__ = "autocast"
    _GradScaler.__name__ = _GradScaler.__qualname__ = "GradScaler"
    _fwd.__doc__ = f"``kiln.amp.custom_fwd`` with ``device_type={device_type!r}``."
    _bwd.__doc__ = f"``kiln.amp.custom_bwd`` with ``device_type={device_type!r}``."
    return types.SimpleNamespace(
        autocast=_Autocast, GradScaler=_GradScaler, custom_fwd=_fwd, custom_bwd=_bwd, __name__=f"kiln.{device_type}.amp"
    )
