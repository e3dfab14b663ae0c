"""Muon (``torch.optim.Muon``): orthogonalised momentum for 2-D parameters."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import group_tensors, run_closure
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["Muon"]


def _init_state(state, p, group) -> None:
    state["momentum_buffer"] = p.grad.new_zeros(p.grad.shape)


class Muon(Optimizer):
    """Muon (Keller Jordan et al., 2024) for the 2-D weights of hidden layers: the (Nesterov) momentum of the
    gradient is orthogonalised by ``ns_steps`` Newton-Schulz iterations (coefficients ``ns_coefficients``,
    in bfloat16), then applied with decoupled ``weight_decay`` and a learning rate scaled by the shape:
    ``sqrt(max(1, rows/cols))`` (``adjust_lr_fn=None`` or ``"original"``) or ``0.2 * sqrt(max(rows, cols))``
    (``"match_rms_adamw"``). Optimise biases and embeddings with another optimizer. State:
    ``momentum_buffer``."""

    def __init__(
        self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
        ns_coefficients=(3.4445, -4.775, 2.0315), eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn=None,
    ) -> None:  # fmt: skip
        if not lr >= 0.0:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not momentum >= 0.0:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        defaults = {
            "lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
            "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn,
        }  # fmt: skip
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(
                        f"Muon only supports 2D parameters whereas we found a parameter with size: {p.size()}"
                    )

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
            params, grads, bufs = group_tensors(self, group, ("momentum_buffer",), _init_state)
            _functional.update(
                "muon", params, grads, bufs, lr=group["lr"], weight_decay=group["weight_decay"],
                momentum=group["momentum"], nesterov=group["nesterov"], ns_coefficients=group["ns_coefficients"],
                ns_steps=group["ns_steps"], eps=group["eps"], adjust_lr_fn=group["adjust_lr_fn"],
            )  # fmt: skip
        return loss
