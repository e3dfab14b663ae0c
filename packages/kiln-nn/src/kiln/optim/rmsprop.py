"""RMSprop (``torch.optim.RMSprop``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["RMSprop"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["square_avg"] = zeros_state(p)
    if group["momentum"] > 0:
        state["momentum_buffer"] = zeros_state(p)
    if group["centered"]:
        state["grad_avg"] = zeros_state(p)


class RMSprop(Optimizer):
    """RMSprop, optionally ``centered`` and with ``momentum``; state ``step``, ``square_avg`` (+ buffers)."""

    def __init__(
        self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
        momentum: float = 0, centered: bool = False, capturable: bool = False, foreach=None,
        maximize: bool = False, differentiable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "eps", "momentum", "weight_decay", "alpha"),
            lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered, weight_decay=weight_decay,
            capturable=capturable, foreach=foreach, maximize=maximize, differentiable=differentiable,
        )  # fmt: skip
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, sq, gavg, bufs, steps = group_tensors(
                self,
                group,
                ("square_avg", "grad_avg", "momentum_buffer", "step"),
                _init_state,
                optional=("grad_avg", "momentum_buffer"),
            )
            _functional.update(
                "rmsprop", params, grads, sq, gavg, bufs, steps, lr=group["lr"], alpha=group["alpha"],
                eps=group["eps"], weight_decay=group["weight_decay"], momentum=group["momentum"],
                centered=group["centered"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
