"""RAdam (``torch.optim.RAdam``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["RAdam"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["exp_avg"] = zeros_state(p)
    state["exp_avg_sq"] = zeros_state(p)


class RAdam(Optimizer):
    """RAdam (variance-rectified Adam); state ``step``, ``exp_avg``, ``exp_avg_sq``."""

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
        decoupled_weight_decay: bool = False, *, foreach=None, maximize: bool = False, capturable: bool = False,
        differentiable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "eps", "betas", "weight_decay"),
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize, foreach=foreach,
            capturable=capturable, decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, m1, m2, steps = group_tensors(self, group, ("exp_avg", "exp_avg_sq", "step"), _init_state)
            beta1, beta2 = group["betas"]
            _functional.update(
                "radam", params, grads, m1, m2, steps, beta1=beta1, beta2=beta2, lr=group["lr"],
                weight_decay=group["weight_decay"], eps=group["eps"],
                decoupled_weight_decay=group["decoupled_weight_decay"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
