"""kiln-cpu's fused optimizer updates: SGD (momentum, dampening, Nesterov, weight decay, ``maximize``)
and Adam/AdamW (AMSGrad, ``maximize``), one Numba pass per parameter tensor instead of a chain of
whole-tensor ops (:mod:`kiln_cpu._jit_optim`).

kiln-cpu registers them through the ``kiln_register_fused_updates`` hook; ``kiln.optim``'s ``update``
calls them with the signature of its own update rules (``kiln.optim._functional.sgd``/``adam``) and
runs its loop instead when they return ``False``. Results are bit-identical to that loop for float32
and float64: each element sees the same operations in the same order, every Python number meets the
tensor in the tensor's dtype as it does there, and ``step`` (a 0-d tensor) is counted with the same
arithmetic (``np.add(step, 1)`` in its dtype, one more version; a counter of another dtype with kiln's op).
A whole call is taken or declined: one parameter the loops do not serve sends every one of the call's
parameters to the loop.

A call is declined (``False``, nothing changed) unless every parameter, gradient and state tensor of
it is a dense C-contiguous CPU tensor of the parameter's shape and dtype (float32 or float64), with no
two of one parameter's tensors sharing memory; a gradient that is missing, grad mode on (a
differentiable step, where the loop records or refuses in-place writes), inference tensors outside
inference mode, or hyper-parameters that are not plain Python numbers (or overflow the dtype) also
send the call to the loop, as do Adam betas outside [0, 1) or a negative step count. Below :data:`kiln_cpu.config.min_numel` elements a tensor is updated by
the calling thread alone; above it, in ranges on the thread pool.
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array
from kiln_cpu import _threads, config
from kiln_cpu._kernel_support import _GRAIN, loops

__all__ = ["fused_updates", "sgd", "adam"]

FLOAT = (kiln.float32, kiln.float64)
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_loops = loops("_jit_optim")


def fused_updates() -> dict:
    """Algorithm name -> fused update, what kiln-cpu registers for device ``"cpu"``."""
    return {"sgd": sgd, "adam": adam}


# ------------------------------------------------------------------------------------------- checks


def _writable(t: Tensor) -> bool:
    """Whether an in-place write to ``t`` runs without autograd's involvement (grad mode is off)."""
    return not (t.is_inference() and not kiln.is_inference_mode_enabled())


def _flat(t, d, shape, written: bool = True) -> np.ndarray | None:
    """The flat storage of ``t`` when it is a C-contiguous CPU tensor of dtype ``d`` and ``shape``, else
    None (the loop runs). A ``written`` tensor with stride 0 in a dim longer than 1 (NumPy gives empty
    arrays those) is refused too: kiln's in-place ops raise for it."""
    if not isinstance(t, Tensor) or t._dtype is not d or t._shape != shape or t._device.type != "cpu":
        return None
    if written and 0 in t._stride and any(s == 0 and n > 1 for n, s in zip(shape, t._stride)):
        return None
    x = t._numpy()
    if not x.flags.c_contiguous:
        return None
    return x.reshape(-1)


def _disjoint(arrays: list) -> bool:
    """No two of one parameter's arrays overlap in memory (the loop's whole-tensor ops would see
    each other's writes differently)."""
    return not any(
        np.may_share_memory(a, b) for k, a in enumerate(arrays) for b in arrays[k + 1 :] if a.size and b.size
    )


def _numbers(*values) -> bool:
    """Every hyper-parameter is a plain Python ``int`` or ``float`` (tensors and NumPy scalars compute
    differently in the loop)."""
    return all(type(v) in (int, float) for v in values)


def _scalar(x, d):
    """``x`` as the loop's ops use it with a tensor of dtype ``d``, or None where converting it
    overflows (the loop then raises or gives inf by its own rules)."""
    if d is kiln.float32 and math.isfinite(x) and abs(x) > _FLOAT32_MAX:
        return None
    return d.numpy.type(x)


def _scalars(d, *values) -> tuple | None:
    """:func:`_scalar` of each value, or None if any overflows."""
    out = tuple(_scalar(v, d) for v in values)
    return None if any(v is None for v in out) else out


def _run(fn, args: tuple, n: int) -> None:
    """``fn(*args, lo, hi)`` over ``n`` elements: on the calling thread below ``config.min_numel``, else
    in ranges on the pool."""
    if n == 0:
        return
    if n < config.min_numel:
        fn(*args, 0, n)
    else:
        _threads.parallel(fn, args, n, _GRAIN)


def _bump(*tensors) -> None:
    """Count an in-place write in each tensor's version counter, as an in-place op does."""
    for t in tensors:
        t._vc[0] += 1


def _step_value(step_t: Tensor) -> float:
    """``step_t.item()``."""
    if step_t._dtype in FLOAT:
        return float(step_t._numpy()[()])
    return step_t.item()


def _count_step(step_t: Tensor) -> float:
    """``step_t += 1`` as the rule counts (the reference's ``add``: ``np.add(step, 1)`` in the step's
    dtype, and one more version), straight into a float32/float64 counter, else with kiln's op; the new
    count, as ``item()`` gives it."""
    if step_t._dtype in FLOAT:
        a = step_t._numpy()
        a[()] = np.add(a[()], 1, dtype=a.dtype)
        step_t._vc[0] += 1
        return float(a[()])
    step_t += 1
    return step_t.item()


# --------------------------------------------------------------------------------------------- SGD


def sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize):
    """Fused ``kiln.optim`` SGD update; ``False`` (nothing changed) when the call is not taken."""
    if kiln.is_grad_enabled() or not _numbers(weight_decay, momentum, lr, dampening):
        return False
    use_momentum, l2 = momentum != 0, weight_decay != 0
    plans, scalars = [], {}
    for i, param in enumerate(params):
        d, shape = param._dtype, param._shape
        if d not in FLOAT or not _writable(param):
            return False
        p, g = _flat(param, d, shape), _flat(grads[i], d, shape, written=False)
        if p is None or g is None:
            return False
        arrays, buf = [p, g], None
        if use_momentum and momentum_buffer_list[i] is not None:
            buf = _flat(momentum_buffer_list[i], d, shape)
            if buf is None or not _writable(momentum_buffer_list[i]):
                return False
            arrays.append(buf)
        if not _disjoint(arrays):
            return False
        if d not in scalars:
            scalars[d] = _scalars(d, weight_decay, momentum, 1 - dampening, -lr)
        if scalars[d] is None:
            return False
        plans.append((param, p, g, buf, scalars[d]))
    j = _loops()
    for i, (param, p, g, buf, (wd, mom, damp, neg_lr)) in enumerate(plans):
        flags = (bool(maximize), l2, wd)
        if not use_momentum:
            _run(j.sgd, (p, g, *flags, neg_lr), p.size)
        else:
            fresh = buf is None
            if fresh:  # the rule's grad.clone(): a new dense tensor
                new = np.empty(param._shape, p.dtype)
                momentum_buffer_list[i] = from_array(new, param._dtype)
                buf = new.reshape(-1)
            else:
                _bump(momentum_buffer_list[i])
            _run(j.sgd_momentum, (p, g, buf, *flags, fresh, mom, damp, bool(nesterov), neg_lr), p.size)
        _bump(param)
    return True


# -------------------------------------------------------------------------------------------- Adam


def adam(
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *,
    amsgrad, beta1, beta2, lr, weight_decay, eps, maximize, decoupled_weight_decay,
):  # fmt: skip
    """Fused ``kiln.optim`` Adam/AdamW update; ``False`` (nothing changed) when the call is not taken."""
    if (
        kiln.is_grad_enabled()
        or not _numbers(beta1, beta2, lr, weight_decay, eps)
        or not _adam_bounded(beta1, beta2, lr)
    ):
        return False
    decay_on = weight_decay != 0
    decoupled, l2 = decay_on and bool(decoupled_weight_decay), decay_on and not decoupled_weight_decay
    plans, scalars = [], {}
    for i, param in enumerate(params):
        d, shape, step_t = param._dtype, param._shape, state_steps[i]
        if d not in FLOAT or not isinstance(step_t, Tensor) or step_t._shape != () or step_t._device.type != "cpu":
            return False
        if not _step_value(step_t) >= 0:  # a count of at least 1 (see _adam_bounded)
            return False
        states = [exp_avgs[i], exp_avg_sqs[i]] + ([max_exp_avg_sqs[i]] if amsgrad else [])
        arrays = [
            _flat(param, d, shape),
            _flat(grads[i], d, shape, written=False),
            *(_flat(t, d, shape) for t in states),
        ]
        if any(a is None for a in arrays) or not _disjoint(arrays):
            return False
        if not all(_writable(t) for t in [param, step_t, *states]):
            return False
        if d not in scalars:
            scalars[d] = _scalars(d, weight_decay, 1 - lr * weight_decay, beta2, 1 - beta2, eps, 1 - beta1)
        if scalars[d] is None:
            return False
        plans.append((param, step_t, arrays, scalars[d]))
    j = _loops()
    for i, (param, step_t, arrays, (wd, decay, b2, omb2, eps_d, weight)) in enumerate(plans):
        d = param._dtype
        step = _count_step(step_t)
        bias_correction1, bias_correction2 = 1 - beta1**step, 1 - beta2**step
        step_size = lr / bias_correction1
        from_m = bool(np.abs(weight) < 0.5)  # the reference lerp's two-sided form
        weight = weight if from_m else weight - 1
        flags = (bool(maximize), l2, decoupled, wd, decay, from_m, weight, b2, omb2)
        coefficients = (_scalar(bias_correction2**0.5, d), eps_d, _scalar(-step_size, d))
        loop = j.adam_amsgrad if amsgrad else j.adam
        _run(loop, (*arrays, *flags, *coefficients), arrays[0].size)
        _bump(param, exp_avgs[i], exp_avg_sqs[i], *([max_exp_avg_sqs[i]] if amsgrad else []))
    return True


def _adam_bounded(beta1, beta2, lr) -> bool:
    """Whether every step's coefficients are finite and fit float32, known before any step is counted:
    with betas in [0, 1) and a count of at least 1, ``1 - beta**step`` lies in ``[1 - beta, 1]``, so the
    step size ``lr / (1 - beta1**step)`` is at most ``lr / (1 - beta1)`` (half of float32's range, to
    leave room for rounding)."""
    return 0 <= beta1 < 1 and 0 <= beta2 < 1 and abs(lr) / (1 - beta1) <= _FLOAT32_MAX / 2
