"""SparseAdam (``torch.optim.SparseAdam``): Adam for sparse gradients."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, run_closure, zeros_state
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["SparseAdam"]


class SparseAdam(Optimizer):
    """Adam for sparse (COO) gradients: the moments and the parameter change only where the gradient has
    entries, so rows an embedding lookup did not touch keep their state. Parameters must be dense; a dense
    gradient raises (use :class:`~kiln.optim.Adam`). State per parameter: ``step`` (an int), ``exp_avg``,
    ``exp_avg_sq``."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, maximize: bool = False) -> None:
        defaults = checked_defaults(("lr", "eps", "betas"), lr=lr, betas=betas, eps=eps, maximize=maximize)
        super().__init__(params, defaults)
        sparse = [
            [gi, pi]
            for gi, group in enumerate(self.param_groups)
            for pi, p in enumerate(group["params"])
            if p.is_sparse
        ]
        if sparse:
            raise ValueError(f"Sparse params at indices {sparse}: SparseAdam requires dense parameter tensors")

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, avgs, sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not p.grad.is_sparse:
                    raise RuntimeError("SparseAdam does not support dense gradients, please consider Adam instead")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = zeros_state(p)
                    state["exp_avg_sq"] = zeros_state(p)
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                avgs.append(state["exp_avg"])
                sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            beta1, beta2 = group["betas"]
            _functional.update(
                "sparse_adam", params, grads, avgs, sqs, steps, beta1=beta1, beta2=beta2, lr=group["lr"],
                eps=group["eps"], maximize=group["maximize"],
            )  # fmt: skip
        return loss
