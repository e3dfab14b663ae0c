"""``GradScaler``: loss scaling for float16 training, PyTorch's algorithm, defaults and errors.

``scale(loss)`` multiplies the loss by the scale before ``backward``; ``step(optimizer)`` unscales the
gradients (one fused check-and-unscale kernel per gradient, on its device) and skips the optimizer step
when any is inf or NaN; ``update()`` backs the scale off after a skipped step and grows it after
``growth_interval`` good ones. The scale, the growth tracker and the found-inf flags stay on the device;
the one host synchronisation per step is reading whether to skip it.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable
from enum import Enum
from typing import Any

import kiln
import kiln.backend as kb

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    """Where an optimizer is in the current iteration: nothing done, gradients unscaled, stepped."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _PerDevice:
    """One tensor copied lazily to each device that asks for it (the scale, or a fresh found-inf flag)."""

    def __init__(self, master: kiln.Tensor):
        self.master = master
        self.copies: dict[kiln.device, kiln.Tensor] = {}

    def get(self, device: kiln.device) -> kiln.Tensor:
        t = self.copies.get(device)
        if t is None:
            t = self.copies[device] = self.master.to(device)
        return t


class GradScaler:
    """Scale the loss so float16 gradients do not underflow; skip the steps whose gradients overflowed.

    ``device`` is the device type of the gradients (``"cuda"`` by default, as in PyTorch: where CUDA is
    not available the scaler warns and disables itself). In a training step, ``scaler.scale(loss)
    .backward()`` replaces ``loss.backward()``, ``scaler.step(optimizer)`` replaces ``optimizer.step()``
    (it unscales the gradients and skips the step when one is inf or NaN), and ``scaler.update()``
    follows it (it backs the scale off after a skipped step and grows it after ``growth_interval``
    good ones):

    >>> scaler = kiln.amp.GradScaler("cpu", init_scale=1024.0)
    >>> scaler.scale(kiln.ones(2)).tolist(), scaler.get_scale()
    ([1024.0, 1024.0], 1024.0)
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        self._device = device
        self._enabled = enabled
        if device == "cuda" and enabled and not kiln.cuda.is_available():
            warnings.warn("kiln.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale: kiln.Tensor | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: kiln.Tensor | None = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_fresh_state)

    # ------------------------------------------------------------------------------------------ scaling

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[kiln.Tensor, kiln.Tensor]:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self, dev: kiln.device) -> None:
        self._scale = kiln.full((), self._init_scale, dtype=kiln.float32, device=dev)
        self._growth_tracker = kiln.full((), self._init_growth_tracker, dtype=kiln.int32, device=dev)

    def scale(self, outputs):
        """``outputs`` (a tensor, or an iterable of them, nested) multiplied by the scale; unchanged when
        the scaler is disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, kiln.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(outputs.device)
        per_device: list[_PerDevice] = []

        def apply(val):
            if isinstance(val, kiln.Tensor):
                if not per_device:
                    if self._scale is None:
                        self._lazy_init_scale_growth_tracker(val.device)
                    per_device.append(_PerDevice(self._scale))
                return val * per_device[0].get(val.device)
            if isinstance(val, Iterable):
                mapped = map(apply, val)
                return type(val)(mapped) if isinstance(val, (list, tuple)) else mapped
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    def _unscale_grads_(self, optimizer, inv_scale: kiln.Tensor, found_inf: kiln.Tensor, allow_fp16: bool) -> dict:
        """Unscale every gradient of ``optimizer`` in place and flag infs/NaNs, one flag per device."""
        inv = _PerDevice(inv_scale)
        found = _PerDevice(found_inf)
        unscale = kb.op("_amp_non_finite_check_and_unscale_")
        with kiln.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if not isinstance(param, kiln.Tensor):
                        raise AssertionError(f"expected param to be kiln.Tensor, got {type(param).__name__}")
                    grad = param.grad
                    if grad is None:
                        continue
                    if not allow_fp16 and grad.dtype is kiln.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    unscale(grad, found.get(grad.device), inv.get(grad.device))
        return found.copies

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (at most once per optimizer between
        :meth:`update` calls), e.g. to clip them before :meth:`step`. No host synchronisation."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = kiln.full((), 0.0, dtype=kiln.float32, device=self._scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer, *args: Any, **kwargs: Any):
        """Unscale the gradients (unless :meth:`unscale_` did), then run ``optimizer.step(*args, **kwargs)``
        unless a gradient is inf or NaN; returns what ``optimizer.step`` returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = None
        if not sum(v.item() for v in state["found_inf_per_device"].values()):  # the one host sync per step
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale: float | kiln.Tensor | None = None) -> None:
        """Update the scale: back off after a skipped step, grow after ``growth_interval`` good steps, or
        set it to ``new_scale`` (a float, or a 1-element tensor on the scaler's device type)."""
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                scale.fill_(new_scale)
            else:
                reason = (
                    "new_scale should be a float or a 1-element kiln.cuda.FloatTensor or "
                    "kiln.FloatTensor with requires_grad=False."
                )
                if not isinstance(new_scale, kiln.Tensor) or new_scale.device.type != self._device:
                    raise AssertionError(reason)
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise AssertionError(reason)
                scale.copy_(new_scale)
        else:
            found_infs = [
                f.to(scale.device)
                for s in self._per_optimizer_states.values()
                for f in s["found_inf_per_device"].values()
            ]
            if not found_infs:
                raise AssertionError("No inf checks were recorded prior to update.")
            combined = found_infs[0]
            for f in found_infs[1:]:
                combined = combined + f
            kb.op("_amp_update_scale_")(
                scale, tracker, combined, float(self._growth_factor), float(self._backoff_factor), self._growth_interval
            )
        self._per_optimizer_states = defaultdict(_fresh_state)

    # ------------------------------------------------------------------------------------------ settings

    def _get_scale_async(self) -> kiln.Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled); reads it from the device."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        """The factor the scale grows by after ``growth_interval`` good steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor."""
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        """The factor the scale shrinks by after a skipped step."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor."""
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        """How many consecutive good steps grow the scale."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval."""
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())
        return 0

    def is_enabled(self) -> bool:
        """Whether the scaler scales (False when constructed disabled, or for cuda without CUDA)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``) as Python numbers; empty when disabled. Take it after :meth:`update`."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (a no-op when this scaler is disabled)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - state_dict.keys()
        if missing:
            raise KeyError(f"GradScaler state dict is missing {sorted(missing)}")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale.fill_(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(state_dict["_growth_tracker"])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError(
                    "A GradScaler instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update()."
                )
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
            state["_per_optimizer_states"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._enabled:
            self._per_optimizer_states = defaultdict(_fresh_state)
