"""Adadelta (``torch.optim.Adadelta``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Adadelta"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["square_avg"] = zeros_state(p)
    state["acc_delta"] = zeros_state(p)


class Adadelta(Optimizer):
    """Adadelta; state ``step``, ``square_avg``, ``acc_delta``."""

    def __init__(
        self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
        foreach=None, *, capturable: bool = False, maximize: bool = False, differentiable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "rho", "eps", "weight_decay"),
            lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize, capturable=capturable,
            foreach=foreach, differentiable=differentiable,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, sq, acc, steps = group_tensors(self, group, ("square_avg", "acc_delta", "step"), _init_state)
            _functional.update(
                "adadelta", params, grads, sq, acc, steps, lr=group["lr"], rho=group["rho"], eps=group["eps"],
                weight_decay=group["weight_decay"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
