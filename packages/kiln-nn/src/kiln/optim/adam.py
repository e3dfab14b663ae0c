"""Adam and AdamW (``torch.optim.Adam``, ``torch.optim.AdamW``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Adam", "AdamW"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["exp_avg"] = zeros_state(p)
    state["exp_avg_sq"] = zeros_state(p)
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = zeros_state(p)


class Adam(Optimizer):
    """Adam with optional AMSGrad, L2 (or decoupled) weight decay and ``maximize``.

    State per parameter: ``step``, ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with AMSGrad).
    """

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
        amsgrad: bool = False, *, foreach=None, maximize: bool = False, capturable: bool = False,
        differentiable: bool = False, fused=None, decoupled_weight_decay: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "eps", "betas", "weight_decay"),
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
            foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, m1, m2, mmax, steps = group_tensors(
                self,
                group,
                ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"),
                _init_state,
                optional=("max_exp_avg_sq",),
            )
            beta1, beta2 = group["betas"]
            _functional.update(
                "adam", params, grads, m1, m2, mmax, steps, amsgrad=group["amsgrad"], beta1=beta1, beta2=beta2,
                lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
            )  # fmt: skip
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (default ``weight_decay=1e-2``), ``torch.optim.AdamW``."""

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
        amsgrad: bool = False, *, maximize: bool = False, foreach=None, capturable: bool = False,
        differentiable: bool = False, fused=None,
    ) -> None:  # fmt: skip
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
            capturable=capturable, differentiable=differentiable, fused=fused, decoupled_weight_decay=True,
        )  # fmt: skip
