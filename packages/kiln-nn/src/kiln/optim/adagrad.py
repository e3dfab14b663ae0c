"""Adagrad (``torch.optim.Adagrad``)."""

from __future__ import annotations

from kiln import full_like
from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad with ``lr_decay`` and ``initial_accumulator_value``; state (``step``, ``sum``) exists from construction."""

    def __init__(
        self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
        initial_accumulator_value: float = 0, eps: float = 1e-10, foreach=None, *, maximize: bool = False,
        differentiable: bool = False, fused=None,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"),
            lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
            differentiable=differentiable, fused=fused,
        )  # fmt: skip
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = step_counter()
                state["sum"] = full_like(p, group["initial_accumulator_value"])

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, sums, steps = group_tensors(self, group, ("sum", "step"))
            _functional.update(
                "adagrad", params, grads, sums, steps, lr=group["lr"], weight_decay=group["weight_decay"],
                lr_decay=group["lr_decay"], eps=group["eps"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
