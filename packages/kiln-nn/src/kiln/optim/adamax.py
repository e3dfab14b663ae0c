"""Adamax (``torch.optim.Adamax``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Adamax"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["exp_avg"] = zeros_state(p)
    state["exp_inf"] = zeros_state(p)


class Adamax(Optimizer):
    """Adamax (Adam with the infinity norm); state ``step``, ``exp_avg``, ``exp_inf``."""

    def __init__(
        self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
        foreach=None, *, maximize: bool = False, differentiable: bool = False, capturable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "eps", "betas", "weight_decay"),
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach, maximize=maximize,
            differentiable=differentiable, capturable=capturable,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, m1, inf, steps = group_tensors(self, group, ("exp_avg", "exp_inf", "step"), _init_state)
            beta1, beta2 = group["betas"]
            _functional.update(
                "adamax", params, grads, m1, inf, steps, eps=group["eps"], beta1=beta1, beta2=beta2,
                lr=group["lr"], weight_decay=group["weight_decay"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
