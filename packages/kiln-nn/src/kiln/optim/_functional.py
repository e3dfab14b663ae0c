"""The update rules of every optimizer, one function per algorithm over whole lists of tensors.

Each function takes the parameters, gradients and state tensors of one parameter group as parallel
lists and updates them in place (PyTorch's ``_single_tensor_*`` arithmetic, in the same order, so
results match to float rounding). This is the hook point for fused kernels: a backend plugin implements
the ``kiln_register_fused_updates`` hook (:mod:`kiln.hookspecs`), or code calls
``register_fused_update("adam", "cuda", fn)``, with ``fn`` of the same signature, and :func:`update`
hands it the lists for parameters on that device type instead of running the per-parameter loop here.
A fused function returns ``False`` to decline a call (having changed nothing): the loop runs instead.
Scalar state (``step``) arrives as 0-d tensors and is incremented by the rule itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kiln import Tensor, maximum

__all__ = ["register_fused_update", "update"]

# explicit registrations (they win over the plugins'); None: always the loop
_FUSED: dict[tuple[str, str], Callable | None] = {}


def register_fused_update(name: str, device_type: str, fn: Callable | None) -> None:
    """Use ``fn`` for algorithm ``name`` (``"sgd"``, ``"adam"``...) on parameters of ``device_type``, in
    place of what a plugin registered through ``kiln_register_fused_updates``; ``None`` runs the loop."""
    _FUSED[(name, device_type)] = fn


def _fused(name: str, device_type: str) -> Callable | None:
    """The fused update for ``name`` on ``device_type``: an explicit registration, else a plugin's (the
    plugins' hooks run once, on the first call that gets here), else None."""
    key = (name, device_type)
    if key in _FUSED:
        return _FUSED[key]
    import kiln.plugins

    return kiln.plugins.fused_update(name, device_type)


def update(name: str, params: list[Tensor], *lists, **hyper) -> None:
    """Run algorithm ``name`` on one group: a registered fused version for the device, else (or when it
    declines by returning ``False``) the loop."""
    if not params:
        return
    device_type = params[0].device.type
    fused = _fused(name, device_type)
    taken = (
        fused is not None
        and all(p.device.type == device_type for p in params)
        and fused(params, *lists, **hyper) is not False
    )
    if not taken:
        _RULES[name](params, *lists, **hyper)


def _step(step_t: Tensor) -> float:
    step_t += 1
    return step_t.item()


def _grad(param, grad, maximize, weight_decay, lr=None, decoupled_weight_decay=False):
    """``grad`` (negated to ``maximize``) with L2 weight decay added, or with ``param`` shrunk in place by
    decoupled (AdamW-style) weight decay instead."""
    if maximize:
        grad = -grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    return grad


def _adam_moments(exp_avg, exp_avg_sq, grad, step_t, beta1, beta2) -> tuple[float, float, float]:
    """Count the step and update Adam's running first and second moments of ``grad`` in place; returns
    ``(step, bias_correction1, bias_correction2)``."""
    step = _step(step_t)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return step, 1 - beta1**step, 1 - beta2**step


def sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize) -> None:
    """SGD with optional momentum, dampening, Nesterov momentum and L2 weight decay."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay)
        if momentum != 0:
            buf = momentum_buffer_list[i]
            if buf is None:
                buf = grad.clone().detach()
                momentum_buffer_list[i] = buf
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.add_(grad, alpha=-lr)


def adam(
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *,
    amsgrad, beta1, beta2, lr, weight_decay, eps, maximize, decoupled_weight_decay,
) -> None:  # fmt: skip
    """Adam / AdamW (``decoupled_weight_decay``), with optional AMSGrad."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay, lr, decoupled_weight_decay)
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        _, bias_correction1, bias_correction2 = _adam_moments(exp_avg, exp_avg_sq, grad, state_steps[i], beta1, beta2)
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        if amsgrad:
            max_exp_avg_sqs[i].copy_(maximum(max_exp_avg_sqs[i], exp_avg_sq))
            denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def rmsprop(
    params, grads, square_avgs, grad_avgs, momentum_buffer_list, state_steps, *,
    lr, alpha, eps, weight_decay, momentum, centered, maximize,
) -> None:  # fmt: skip
    """RMSprop, optionally centered and with momentum."""
    for i, param in enumerate(params):
        _step(state_steps[i])
        grad = _grad(param, grads[i], maximize, weight_decay)
        square_avg = square_avgs[i]
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if centered:
            grad_avg = grad_avgs[i]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(eps)
        if momentum > 0:
            buf = momentum_buffer_list[i]
            buf.mul_(momentum).addcdiv_(grad, avg)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)


def adagrad(params, grads, state_sums, state_steps, *, lr, weight_decay, lr_decay, eps, maximize) -> None:
    """Adagrad with learning-rate decay."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay)
        step = _step(state_steps[i])
        clr = lr / (1 + (step - 1) * lr_decay)
        state_sums[i].addcmul_(grad, grad, value=1)
        std = state_sums[i].sqrt().add_(eps)
        param.addcdiv_(grad, std, value=-clr)


def adadelta(params, grads, square_avgs, acc_deltas, state_steps, *, lr, rho, eps, weight_decay, maximize) -> None:
    """Adadelta."""
    for i, param in enumerate(params):
        _step(state_steps[i])
        grad = _grad(param, grads[i], maximize, weight_decay)
        square_avg, acc_delta = square_avgs[i], acc_deltas[i]
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_()
        delta.div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.add_(delta, alpha=-lr)


def adamax(params, grads, exp_avgs, exp_infs, state_steps, *, eps, beta1, beta2, lr, weight_decay, maximize) -> None:
    """Adamax (Adam with the infinity norm)."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay)
        step = _step(state_steps[i])
        exp_avg, exp_inf = exp_avgs[i], exp_infs[i]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_inf.copy_(maximum(exp_inf.mul_(beta2), grad.abs().add_(eps)))
        clr = lr / (1 - beta1**step)
        param.addcdiv_(exp_avg, exp_inf, value=-clr)


def nadam(
    params, grads, exp_avgs, exp_avg_sqs, mu_products, state_steps, *,
    beta1, beta2, lr, weight_decay, momentum_decay, eps, decoupled_weight_decay, maximize,
) -> None:  # fmt: skip
    """NAdam (Nesterov-accelerated Adam)."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay, lr, decoupled_weight_decay)
        exp_avg, exp_avg_sq, mu_product = exp_avgs[i], exp_avg_sqs[i], mu_products[i]
        step, _, bias_correction2 = _adam_moments(exp_avg, exp_avg_sq, grad, state_steps[i], beta1, beta2)
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
        mu_product *= mu
        denom = exp_avg_sq.div(bias_correction2).sqrt()
        mu_product_value = mu_product.item()
        mu_product_next = mu_product_value * mu_next
        denom.add_(eps)
        param.addcdiv_(grad, denom, value=(-lr * (1.0 - mu) / (1.0 - mu_product_value)))
        param.addcdiv_(exp_avg, denom, value=(-lr * mu_next) / (1.0 - mu_product_next))


def radam(
    params, grads, exp_avgs, exp_avg_sqs, state_steps, *,
    beta1, beta2, lr, weight_decay, eps, decoupled_weight_decay, maximize,
) -> None:  # fmt: skip
    """RAdam (rectified Adam)."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay, lr, decoupled_weight_decay)
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        step, bias_correction1, bias_correction2 = _adam_moments(
            exp_avg, exp_avg_sq, grad, state_steps[i], beta1, beta2
        )
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            adaptive_lr = (bias_correction2**0.5) / exp_avg_sq.sqrt().add(eps)
            param.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
        else:
            param.add_(bias_corrected_exp_avg * lr, alpha=-1.0)


_RULES: dict[str, Callable] = {
    "sgd": sgd,
    "adam": adam,
    "rmsprop": rmsprop,
    "adagrad": adagrad,
    "adadelta": adadelta,
    "adamax": adamax,
    "nadam": nadam,
    "radam": radam,
}
