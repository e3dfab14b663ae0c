"""Stochastic gradient descent (``torch.optim.SGD``)."""

from __future__ import annotations

from kiln.optim import _functional
from kiln.optim._common import checked_defaults, run_closure
from kiln.optim.optimizer import Optimizer, _use_grad

__all__ = ["SGD"]


class SGD(Optimizer):
    """SGD with optional momentum, dampening, Nesterov momentum, L2 weight decay and ``maximize``.

    ``foreach``/``fused``/``differentiable`` are accepted for PyTorch compatibility (see
    :func:`kiln.optim.register_fused_update`).
    """

    def __init__(
        self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0, weight_decay: float = 0,
        nesterov: bool = False, *, maximize: bool = False, foreach=None, differentiable: bool = False, fused=None,
    ) -> None:  # fmt: skip
        defaults = checked_defaults(
            ("lr", "momentum", "weight_decay"),
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
            maximize=maximize, foreach=foreach, differentiable=differentiable, fused=fused,
        )  # fmt: skip
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)

    @_use_grad
    def step(self, closure=None):
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = run_closure(closure)
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                params.append(p)
                grads.append(p.grad)
                if group["momentum"] != 0:
                    bufs.append(self.state[p].get("momentum_buffer"))
                else:
                    bufs.append(None)
            _functional.update(
                "sgd", params, grads, bufs, weight_decay=group["weight_decay"], momentum=group["momentum"],
                lr=group["lr"], dampening=group["dampening"], nesterov=group["nesterov"], maximize=group["maximize"],
            )  # fmt: skip
            if group["momentum"] != 0:
                for p, buf in zip(params, bufs):
                    self.state[p]["momentum_buffer"] = buf
        return loss
