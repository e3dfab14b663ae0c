"""Small helpers shared by the optimizers: argument checks, state creation, closures."""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._ops.creation import tensor, zeros_like
from kiln.autograd.grad_mode import enable_grad


def check(value, ok: bool, what: str) -> None:
    """Raise PyTorch's ``ValueError("Invalid <what>: <value>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"Invalid {what}: {value}")


def check_betas(betas) -> None:
    """Validate ``(beta1, beta2)`` like PyTorch."""
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")


def scalar_dtype():
    """The dtype of ``step`` counters: float64 when that is the default dtype, else float32 (as PyTorch)."""
    return dt.float64 if dt.get_default_dtype() is dt.float64 else dt.float32


def step_counter(value: float = 0.0):
    """A fresh 0-d ``step`` state tensor."""
    return tensor(value, dtype=scalar_dtype())


def zeros_state(p):
    """A zero tensor shaped like parameter ``p`` (its moment buffers)."""
    return zeros_like(p)


def run_closure(closure):
    """Evaluate ``closure`` with gradients enabled and return its loss (None without a closure)."""
    if closure is None:
        return None
    with enable_grad():
        return closure()
