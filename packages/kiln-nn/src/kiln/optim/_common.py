"""Small helpers shared by the optimizers: argument checks, state creation, closures."""

from __future__ import annotations

import kiln
from kiln import tensor, zeros_like
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


# hyperparameter -> (what PyTorch's message calls it, the test it must pass); any other name checked by
# checked_defaults must be non-negative and is called "<name> value"
_RULES = {
    "lr": ("learning rate", lambda v: v >= 0.0),
    "eps": ("epsilon value", lambda v: v >= 0.0),
    "rho": ("rho value", lambda v: 0.0 <= v <= 1.0),
}


def checked_defaults(checked, **defaults) -> dict:
    """``defaults`` as a dict, after validating the hyperparameters named in ``checked``, in that order,
    with PyTorch's ``ValueError`` messages (``betas`` through :func:`check_betas`)."""
    for name in checked:
        value = defaults[name]
        if name == "betas":
            check_betas(value)
            continue
        what, ok = _RULES.get(name, (f"{name} value", lambda v: v >= 0.0))
        check(value, ok(value), what)
    return defaults


def scalar_dtype():
    """The dtype of ``step`` counters: float64 when that is the default dtype, else float32 (as PyTorch)."""
    return kiln.float64 if kiln.get_default_dtype() is kiln.float64 else kiln.float32


def step_counter(value: float = 0.0):
    """A fresh 0-d ``step`` state tensor."""
    return tensor(value, dtype=scalar_dtype())


def zeros_state(p):
    """A zero tensor shaped like parameter ``p`` (its moment buffers)."""
    return zeros_like(p)


def group_tensors(optimizer, group, keys, init_state=None, optional=()):
    """The tensors one update of ``group`` works on: the parameters that have a gradient, their gradients,
    then one list per state key in ``keys`` (``None`` for a parameter without an ``optional`` buffer).

    ``init_state(state, p, group)`` first fills the state of a parameter that has none yet.
    """
    params, grads = [], []
    lists = [[] for _ in keys]
    for p in group["params"]:
        if p.grad is None:
            continue
        state = optimizer.state[p]
        if init_state is not None and len(state) == 0:
            init_state(state, p, group)
        params.append(p)
        grads.append(p.grad)
        for key, values in zip(keys, lists):
            values.append(state.get(key) if key in optional else state[key])
    return (params, grads, *lists)


def run_closure(closure):
    """Evaluate ``closure`` with gradients enabled and return its loss (None without a closure)."""
    if closure is None:
        return None
    with enable_grad():
        return closure()
