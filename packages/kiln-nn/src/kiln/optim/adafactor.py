"""Adafactor (``torch.optim.Adafactor``): Adam-like steps with factored second moments."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Adafactor"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    if p.grad.dim() > 1:
        state["row_var"] = p.grad.new_zeros((*p.grad.shape[:-1], 1))
        state["col_var"] = p.grad.new_zeros((*p.grad.shape[:-2], 1, p.grad.shape[-1]))
    else:
        state["variance"] = zeros_state(p)


class Adafactor(Optimizer):
    """Adafactor (Shazeer and Stern, 2018): the second moment of a matrix gradient is kept as its row and
    column means (``row_var``, ``col_var``: memory sublinear in the parameter's size), ``variance`` for
    vectors; ``beta2_t = 1 - t ** beta2_decay``; the step is ``min(lr, 1/sqrt(t))`` times the parameter's
    RMS (at least ``eps[1]``), the update is clipped to RMS ``d``; ``lr`` also scales decoupled
    ``weight_decay``. ``eps[0]`` (default: the dtype's machine epsilon) floors the second moment."""

    def __init__(
        self, params, lr: float = 1e-2, beta2_decay: float = -0.8, eps=(None, 1e-3), d: float = 1.0,
        weight_decay: float = 0.0, *, foreach=None, maximize: bool = False,
    ) -> None:  # fmt: skip
        if not lr >= 0.0:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not beta2_decay <= 0.0:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not eps[0] >= 0.0:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not eps[1] >= 0.0:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not d >= 1.0:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        defaults = {
            "lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d, "weight_decay": weight_decay,
            "foreach": foreach, "maximize": maximize,
        }  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError("Adafactor does not support sparse gradients")
            params, grads, rows, cols, variances, steps = group_tensors(
                self, group, ("row_var", "col_var", "variance", "step"), _init_state,
                optional=("row_var", "col_var", "variance"),
            )  # fmt: skip
            eps1, eps2 = group["eps"]
            _functional.update(
                "adafactor", params, grads, rows, cols, variances, steps, d=group["d"], lr=group["lr"],
                beta2_decay=group["beta2_decay"], weight_decay=group["weight_decay"], eps1=eps1, eps2=eps2,
                maximize=group["maximize"],
            )  # fmt: skip
        return loss
