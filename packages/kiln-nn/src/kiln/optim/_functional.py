"""The update rules of every optimizer, one function per algorithm over whole lists of tensors.

Each function takes the parameters, gradients and state tensors of one parameter group as parallel
lists and updates them in place (PyTorch's ``_single_tensor_*`` arithmetic, in the same order, so
results match to float rounding). This is the hook point for fused kernels: a backend plugin implements
the ``kiln_register_fused_updates`` hook (:mod:`kiln.hookspecs`), or code calls
``register_fused_update("adam", "cuda", fn)``, with ``fn`` of the same signature, and :func:`update`
hands it the lists for parameters on that device type instead of running the per-parameter loop here.
A fused function returns ``False`` to decline a call (having changed nothing): the loop runs instead.
Scalar state (``step``) arrives as 0-d tensors and is incremented by the rule itself. While kiln.compile
traces, the count stays a tensor (as under ``torch.compile``): Adam's bias corrections, Adagrad's and
Adamax's step sizes are then ops on it, so one trace serves every step. Read into Python, it would be
guarded by value and every step traced again.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import kiln
import kiln.backend
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
    # a fused update writes the parameters itself, which a tracer (kiln.compile) would not see: ops then
    fused = None if kiln.backend.recording() else _fused(name, device_type)
    taken = (
        fused is not None
        and all(p.device.type == device_type for p in params)
        and fused(params, *lists, **hyper) is not False
    )
    if not taken:
        _RULES[name](params, *lists, **hyper)


def _step(step_t: Tensor, traceable: bool = False) -> float | Tensor:
    """Count a step: the new count as a Python number; with ``traceable`` (a rule whose arithmetic takes a
    0-d tensor as well), while kiln.compile traces, the count as a 0-d float64 tensor: the bias corrections
    cancel (``1 - 0.999**6``), and computed in the count's float32 they would lose five digits that the
    Python float keeps."""
    step_t += 1
    return step_t.double() if traceable and _tracing() else step_t.item()


def _tracing() -> bool:
    """Whether kiln.compile is tracing on this thread (kiln-compile is optional: absent, nothing traces)."""
    if not kiln.backend.recording():
        return False
    compiler = sys.modules.get("kiln.compile")
    is_compiling = getattr(compiler, "is_compiling", None)
    return is_compiling is not None and is_compiling()


def _opmath(t: Tensor):
    """The dtype kernels compute ``t``'s dtype in (:func:`kiln.backend.compute_dtype`: float32 for the half
    types, else its own), as a kiln dtype."""
    return getattr(kiln, kiln.backend.compute_dtype(t.dtype).name)


def _py_max(t: Tensor, bound: float) -> Tensor:
    """``max(bound, t)`` as Python's on the traced number ``t``: the bound where ``t`` is NaN."""
    return kiln.where(t > bound, t, bound)


def _py_min(t: Tensor, bound: float) -> Tensor:
    """``min(bound, t)`` as Python's: the bound where ``t`` is NaN."""
    return kiln.where(t < bound, t, bound)


def _addcdiv(param: Tensor, t1: Tensor, t2: Tensor, value) -> None:
    """``param += value * t1 / t2`` for a number ``value``, or a 0-d tensor one (a traced step count's)."""
    if isinstance(value, Tensor):  # addcdiv's order, in its compute dtype (float32 for the half types)
        o = _opmath(param)
        param.add_(value * t1.to(o) / t2.to(o))
    else:
        param.addcdiv_(t1, t2, value=value)


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


def _adam_moments(exp_avg, exp_avg_sq, grad, step_t, beta1, beta2) -> tuple:
    """Count the step and update Adam's running first and second moments of ``grad`` in place; returns
    ``(step, bias_correction1, bias_correction2)`` (numbers, or 0-d tensors while kiln.compile traces)."""
    step = _step(step_t, traceable=True)
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
        _addcdiv(param, exp_avg, denom, -step_size)


def rmsprop(
    params, grads, square_avgs, grad_avgs, momentum_buffer_list, state_steps, *,
    lr, alpha, eps, weight_decay, momentum, centered, maximize,
) -> None:  # fmt: skip
    """RMSprop, optionally centered and with momentum."""
    for i, param in enumerate(params):
        state_steps[i] += 1  # counted, never read: no value for a trace to guard
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
        step = _step(state_steps[i], traceable=True)
        clr = lr / (1 + (step - 1) * lr_decay)
        state_sums[i].addcmul_(grad, grad, value=1)
        std = state_sums[i].sqrt().add_(eps)
        _addcdiv(param, grad, std, -clr)


def adadelta(params, grads, square_avgs, acc_deltas, state_steps, *, lr, rho, eps, weight_decay, maximize) -> None:
    """Adadelta."""
    for i, param in enumerate(params):
        state_steps[i] += 1  # counted, never read: no value for a trace to guard
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
        step = _step(state_steps[i], traceable=True)
        exp_avg, exp_inf = exp_avgs[i], exp_infs[i]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_inf.copy_(maximum(exp_inf.mul_(beta2), grad.abs().add_(eps)))
        clr = lr / (1 - beta1**step)
        _addcdiv(param, exp_avg, exp_inf, -clr)


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
        mu_product_value = mu_product.double() if isinstance(step, Tensor) else mu_product.item()  # traced: float64
        mu_product_next = mu_product_value * mu_next
        denom.add_(eps)
        _addcdiv(param, grad, denom, -lr * (1.0 - mu) / (1.0 - mu_product_value))
        _addcdiv(param, exp_avg, denom, (-lr * mu_next) / (1.0 - mu_product_next))


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
        if isinstance(step, Tensor):  # traced: both branches as ops, the rectified one chosen by where
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)).clamp(min=0).sqrt()
            adaptive_lr = (bias_correction2**0.5) / exp_avg_sq.sqrt().add(eps)
            step_t = bias_corrected_exp_avg * lr
            param.sub_(kiln.where(rho_t > 5.0, step_t * adaptive_lr * rect, step_t))
        elif rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            adaptive_lr = (bias_correction2**0.5) / exp_avg_sq.sqrt().add(eps)
            param.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
        else:
            param.add_(bias_corrected_exp_avg * lr, alpha=-1.0)


def asgd(params, grads, axs, mus, etas, state_steps, *, lambd, lr, t0, alpha, weight_decay, maximize) -> None:
    """Averaged SGD: a decaying step ``eta`` and the running average ``ax`` of the iterates, which starts
    averaging after ``t0`` steps."""
    for i, param in enumerate(params):
        grad = _grad(param, grads[i], maximize, weight_decay)
        step = _step(state_steps[i], traceable=True)
        eta, mu, ax = etas[i], mus[i], axs[i]
        if isinstance(step, Tensor):  # traced: the same arithmetic on 0-d tensors, the switch a where
            param.mul_(1 - lambd * eta.double())  # in float64, as eager's Python number, then cast
            param.add_(grad.to(_opmath(param)) * -eta)  # eager's alpha multiplies in the compute dtype
            ax.copy_(kiln.where(mu != 1, ax + param.sub(ax).mul_(mu), param))
            eta.copy_(lr / ((1 + lambd * lr * step) ** alpha))
            mu.copy_(1 / (step - t0).clamp(min=1))
            continue
        param.mul_(1 - lambd * eta.item())
        param.add_(grad, alpha=-eta.item())
        if mu.item() != 1:
            ax.add_(param.sub(ax).mul_(mu))
        else:
            ax.copy_(param)
        eta.fill_(lr / ((1 + lambd * lr * step) ** alpha))
        mu.fill_(1 / max(1, step - t0))


def rprop(params, grads, prevs, step_sizes, state_steps, *, step_size_min, step_size_max, etaminus, etaplus,
          maximize) -> None:  # fmt: skip
    """Resilient backpropagation: a per-element step grown by ``etaplus`` while the gradient keeps its sign,
    shrunk by ``etaminus`` (and the move skipped) when it flips."""
    for i, param in enumerate(params):
        grad = -grads[i] if maximize else grads[i]
        prev, step_size = prevs[i], step_sizes[i]
        state_steps[i] += 1  # counted, never read: no value for a trace to guard
        sign = grad.mul(prev).sign()
        flipped = sign < 0
        factor = kiln.ones_like(step_size).masked_fill_(sign > 0, etaplus).masked_fill_(flipped, etaminus)
        step_size.mul_(factor).clamp_(step_size_min, step_size_max)
        grad = grad.masked_fill(flipped, 0)
        param.addcmul_(grad.sign(), step_size, value=-1)
        prev.copy_(grad)


def sparse_adam(params, grads, exp_avgs, exp_avg_sqs, state_steps, *, beta1, beta2, lr, eps, maximize) -> None:
    """Adam on the rows a sparse gradient touches: the moments and the parameter change only at the
    gradient's (coalesced) indices; ``state_steps`` holds Python ints."""
    for i, param in enumerate(params):
        grad = grads[i].coalesce()
        if maximize:
            grad = -grad
        index = tuple(grad.indices())
        values = grad.values()
        if values.numel() == 0:
            continue
        step = state_steps[i]
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        old_avg = exp_avg[index]
        avg_update = values.sub(old_avg).mul_(1 - beta1)
        exp_avg.index_put_(index, old_avg + avg_update)
        old_sq = exp_avg_sq[index]
        sq_update = values.pow(2).sub_(old_sq).mul_(1 - beta2)
        exp_avg_sq.index_put_(index, old_sq + sq_update)
        numer = avg_update.add_(old_avg)
        denom = sq_update.add_(old_sq).sqrt_().add_(eps)
        step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
        param.index_put_(index, param[index] + numer.div_(denom).mul_(-step_size))


def adafactor(params, grads, row_vars, col_vars, variances, state_steps, *, d, lr, beta2_decay, weight_decay, eps1,
              eps2, maximize) -> None:  # fmt: skip
    """Adafactor: the second moment of a matrix gradient kept as row and column means (a rank-1 factor),
    a relative step size ``min(lr, 1/sqrt(t))`` scaled by the parameter's RMS, and update clipping at RMS
    ``d``."""
    from kiln.linalg import vector_norm

    for i, param in enumerate(params):
        grad = -grads[i] if maximize else grads[i]
        step = _step(state_steps[i], traceable=True)
        traced = isinstance(step, Tensor)  # the step sizes as float64 0-d tensors, never read into Python
        e1 = eps1 if eps1 is not None else kiln.finfo(param.dtype).eps
        beta2_complement = step**beta2_decay
        if traced:  # Python's max and min: a NaN norm gives the bound, as eager's
            rho = _py_min(1 / (step**0.5), lr)
            alpha = _py_max(vector_norm(param).double() / (param.numel() ** 0.5), eps2) * rho
        else:
            rho = min(lr, 1 / (step**0.5))
            alpha = max(eps2, vector_norm(param).item() / (param.numel() ** 0.5)) * rho
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        if grad.dim() > 1:
            row_var, col_var = row_vars[i], col_vars[i]
            row_var.lerp_(vector_norm(grad, dim=-1, keepdim=True).square_().div_(grad.size(-1)), beta2_complement)
            col_var.lerp_(vector_norm(grad, dim=-2, keepdim=True).square_().div_(grad.size(-2)), beta2_complement)
            estimate = row_var @ col_var
            estimate.div_(row_var.mean(dim=-2, keepdim=True).clamp_(min=e1))
        else:
            variances[i].lerp_(grad * grad, beta2_complement)
            estimate = variances[i].clone()
        update = estimate.clamp_(min=e1 * e1).rsqrt_().mul_(grad)
        if traced:
            denom = _py_max(vector_norm(update).double() / ((update.numel() ** 0.5) * d), 1.0)
            param.add_(update.to(_opmath(param)) * (-alpha / denom))
            continue
        denom = max(1.0, vector_norm(update).item() / ((update.numel() ** 0.5) * d))
        param.add_(update, alpha=-alpha / denom)


def _newton_schulz(grad: Tensor, coefficients, steps: int, eps: float) -> Tensor:
    """``grad`` orthogonalised by ``steps`` quintic Newton-Schulz iterations in bfloat16 (Muon's ``NS``)."""
    if steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if grad.dim() != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.bfloat16()
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = kiln.addmm(gram, gram, gram, beta=b, alpha=c)
        x = kiln.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def _muon_lr(lr: float, adjust_lr_fn, shape) -> float:
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def muon(params, grads, momentum_bufs, *, lr, weight_decay, momentum, nesterov, ns_coefficients, ns_steps, eps,
         adjust_lr_fn) -> None:  # fmt: skip
    """Muon: the (Nesterov) momentum of a matrix gradient, orthogonalised by Newton-Schulz iterations, with
    decoupled weight decay and a shape-dependent learning rate."""
    for i, param in enumerate(params):
        grad = grads[i]
        if grad.dim() != 2:
            raise ValueError("Param gradient must be a 2D matrix")
        buf = momentum_bufs[i]
        buf.lerp_(grad, 1 - momentum)
        update = grad.lerp(buf, momentum) if nesterov else buf
        update = _newton_schulz(update, ns_coefficients, ns_steps, eps)
        param.mul_(1 - lr * weight_decay)
        param.add_(update, alpha=-_muon_lr(lr, adjust_lr_fn, param.shape))


_RULES: dict[str, Callable] = {
    "sgd": sgd,
    "adam": adam,
    "rmsprop": rmsprop,
    "adagrad": adagrad,
    "adadelta": adadelta,
    "adamax": adamax,
    "nadam": nadam,
    "radam": radam,
    "asgd": asgd,
    "rprop": rprop,
    "sparse_adam": sparse_adam,
    "adafactor": adafactor,
    "muon": muon,
}
