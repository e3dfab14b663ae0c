"""Rprop, resilient backpropagation (``torch.optim.Rprop``)."""

from __future__ import annotations

from kiln import full_like
from kiln.optim import _functional
from kiln.optim._common import checked_defaults, group_tensors, run_closure, step_counter, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Rprop"]


def _init_state(state, p, group) -> None:
    state["step"] = step_counter()
    state["prev"] = zeros_state(p)
    state["step_size"] = full_like(p.grad, float(group["lr"]))


class Rprop(Optimizer):
    """Rprop: each element moves by its own step size against the gradient's sign; the step grows by
    ``etas[1]`` while the sign holds and shrinks by ``etas[0]`` (skipping the move) when it flips, within
    ``step_sizes``. State per parameter: ``step``, ``prev`` and ``step_size``."""

    def __init__(
        self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *, capturable: bool = False,
        foreach=None, maximize: bool = False, differentiable: bool = False,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr",),
            lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach, maximize=maximize,
            differentiable=differentiable, capturable=capturable,
        )  # fmt: skip
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, prevs, sizes, steps = group_tensors(self, group, ("prev", "step_size", "step"), _init_state)
            etaminus, etaplus = group["etas"]
            size_min, size_max = group["step_sizes"]
            _functional.update(
                "rprop", params, grads, prevs, sizes, steps, step_size_min=size_min, step_size_max=size_max,
                etaminus=etaminus, etaplus=etaplus, maximize=group["maximize"],
            )  # fmt: skip
        return loss
