"""ASGD, averaged stochastic gradient descent (``torch.optim.ASGD``)."""

from __future__ import annotations

from kiln import ones, tensor
from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, scalar_dtype, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["ASGD"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["eta"] = tensor(float(group["lr"]), dtype=scalar_dtype(), device=p.device)
    state["mu"] = ones((), dtype=scalar_dtype(), device=p.device)
    state["ax"] = zeros_state(p)


class ASGD(Optimizer):
    """Averaged SGD (Polyak and Juditsky): SGD with a step ``eta_t = lr / (1 + lambd * lr * t) ** alpha``
    and the running average ``ax`` of the iterates, averaging from step ``t0`` on.

    State per parameter: ``step``, ``eta``, ``mu`` and ``ax``.
    """

    def __init__(
        self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
        weight_decay: float = 0, foreach=None, maximize: bool = False, differentiable: bool = False,
        capturable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "weight_decay"),
            lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, foreach=foreach, maximize=maximize,
            differentiable=differentiable, capturable=capturable,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, axs, mus, etas, steps = group_tensors(self, group, ("ax", "mu", "eta", "step"), _init_state)
            _functional.update(
                "asgd", params, grads, axs, mus, etas, steps, lambd=group["lambd"], lr=group["lr"], t0=group["t0"],
                alpha=group["alpha"], weight_decay=group["weight_decay"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
