"""nn primitives: ``ctc_loss`` (``torch.nn.functional`` semantics): the fused op ``_ctc_loss`` and its
backward ``_ctc_loss_backward``, each with a NumPy reference (the alpha/beta recursions).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.loss_reduction import _kiln, _reduce, _reduction
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["ctc_loss"]


# ---------------------------------------------------------------------------------------- ctc_loss


def _ctc_check(log_probs, targets, input_lengths, target_lengths, blank):
    """Validate the (batched) arguments; returns (T, N, C)."""
    t_max, n, c = log_probs._shape
    if not 0 <= blank < c:
        raise RuntimeError("blank must be in label range")
    if len(input_lengths) != n:
        raise RuntimeError("input_lengths must be of size batch_size")
    if len(target_lengths) != n:
        raise RuntimeError("target_lengths must be of size batch_size")
    where = " (while checking arguments for ctc_loss_allocate_outputs)"
    for v in input_lengths:
        if v < 0:
            raise RuntimeError(f"Expected input_lengths to have value at least 0, but got value {v}{where}")
        if v > t_max:
            raise RuntimeError(f"Expected input_lengths to have value at most {t_max}, but got value {v}{where}")
    for v in target_lengths:
        if v < 0:
            raise RuntimeError(f"Expected target_lengths to have value at least 0, but got value {v}{where}")
    if len(targets._shape) == 1:
        total = sum(target_lengths)
        if targets._shape[0] != total:
            raise RuntimeError(
                f"Expected tensor to have size {total} at dimension 0, but got size {targets._shape[0]} for "
                f"argument #2 'targets'{where}"
            )
    else:
        longest = max(target_lengths, default=0)
        if targets._shape[1] < longest:
            raise RuntimeError(
                f"Expected tensor to have size at least {longest} at dimension 1, but got size {targets._shape[1]} "
                f"for argument #2 'targets'{where}"
            )
    if not log_probs._dtype.is_floating_point:
        raise NotImplementedError(f"\"ctc_loss_cpu\" not implemented for '{scalar_type_name(log_probs._dtype)}'")
    return t_max, n, c


def _ctc_meta(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, n, _ = _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    return Spec(((n,), log_probs._dtype, log_probs._device))


def _ctc_labels(targets: np.ndarray, target_lengths, blank: int) -> np.ndarray:
    """Extended label sequences ``blank, l1, blank, l2, ..., blank``, padded with blank to a common length."""
    n = len(target_lengths)
    longest = max(target_lengths, default=0)
    ext = np.full((n, 2 * longest + 1), blank, np.int64)
    offset = 0
    for i, length in enumerate(target_lengths):  # one row per sample: loops over the batch only
        row = targets[offset : offset + length] if targets.ndim == 1 else targets[i, :length]
        offset += length
        ext[i, 1 : 2 * length : 2] = row.astype(np.int64)
    return ext


def _ctc_alpha_beta(lp: np.ndarray, ext: np.ndarray, input_lengths, target_lengths, blank: int, need_beta: bool):
    """Forward (and backward) log-variables over time, vectorised over batch and label positions.

    ``lp`` is (T, N, C) float64; returns (nll (N,), log alpha (T, N, S), log beta (T, N, S) or None)."""
    t_max, n, _ = lp.shape
    s_max = ext.shape[1]
    lengths = np.asarray(target_lengths, np.int64)
    tlen = np.asarray(input_lengths, np.int64)
    pos = np.arange(s_max)
    valid = pos[None, :] < (2 * lengths + 1)[:, None]  # (N, S)
    # a skip from s-2 is allowed onto a non-blank label that differs from the one two back
    skip = np.zeros((n, s_max), bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    emit = np.take_along_axis(lp, np.broadcast_to(ext[None], (t_max, n, s_max)), axis=2)  # (T, N, S)
    neg = -np.inf
    alpha = np.full((t_max, n, s_max), neg)
    if t_max:
        alpha[0, :, 0] = emit[0, :, 0]
        alpha[0, :, 1] = np.where(lengths > 0, emit[0, :, 1], neg) if s_max > 1 else neg
        alpha[0] = np.where(valid, alpha[0], neg)
    with np.errstate(invalid="ignore"):
        for t in range(1, t_max):
            prev = alpha[t - 1]
            acc = prev.copy()
            acc[:, 1:] = np.logaddexp(acc[:, 1:], prev[:, :-1])
            acc[:, 2:] = np.where(skip[:, 2:], np.logaddexp(acc[:, 2:], prev[:, :-2]), acc[:, 2:])
            alpha[t] = np.where(valid, acc + emit[t], neg)
        last = np.clip(tlen - 1, 0, None)
        a_end = alpha[last, np.arange(n)] if t_max else np.full((n, s_max), neg)  # (N, S)
        end = 2 * lengths
        ll = a_end[np.arange(n), end]
        ll = np.where(lengths > 0, np.logaddexp(ll, a_end[np.arange(n), np.maximum(end - 1, 0)]), ll)
        ll = np.where(tlen == 0, np.where(lengths == 0, 0.0, neg), ll)
        nll = -ll
        if not need_beta:
            return nll, alpha, None
        beta = np.full((t_max, n, s_max), neg)
        for t in range(t_max - 1, -1, -1):
            init = np.full((n, s_max), neg)
            init[np.arange(n), end] = emit[t, np.arange(n), end]
            has = lengths > 0
            init[np.arange(n)[has], end[has] - 1] = emit[t, np.arange(n)[has], end[has] - 1]
            if t + 1 < t_max:
                nxt = beta[t + 1]
                acc = nxt.copy()
                acc[:, :-1] = np.logaddexp(acc[:, :-1], nxt[:, 1:])
                acc[:, :-2] = np.where(skip[:, 2:], np.logaddexp(acc[:, :-2], nxt[:, 2:]), acc[:, :-2])
                rec = acc + emit[t]
            else:
                rec = np.full((n, s_max), neg)
            step = np.where((t == tlen - 1)[:, None], init, np.where((t < tlen - 1)[:, None], rec, neg))
            beta[t] = np.where(valid, step, neg)
    return nll, alpha, beta


def _ctc_ref(spec, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp = log_probs.astype(np.float64)
    ext = _ctc_labels(targets, target_lengths, blank)
    nll, _, _ = _ctc_alpha_beta(lp, ext, input_lengths, target_lengths, blank, False)
    return nll.astype(_compute_np(spec.dtype))


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    return _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, blank, zero_infinity), None


@op(
    tags=("nn",),
    meta=_ctc_meta,
    reference=_ctc_ref,
    backward=_ctc_backward,
    autocast="fp32",
    grad_fn_name="CtcLossBackward0",
)
def _ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: tuple,
    target_lengths: tuple,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """Per-sample CTC negative log likelihood of batched ``log_probs`` (T, N, C) and ``targets``."""


def _ctc_bwd_meta(grad, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, n, _ = _ctc_check(log_probs, targets, input_lengths, target_lengths, blank)
    if not grad._dtype.is_floating_point:
        raise NotImplementedError(f"\"ctc_loss_backward_cpu\" not implemented for '{scalar_type_name(grad._dtype)}'")
    if grad._shape != (n,):
        raise RuntimeError(f"grad of shape {list(grad._shape)} does not match the loss shape {[n]}")
    return Spec((log_probs._shape, log_probs._dtype, log_probs._device))


def _ctc_bwd_ref(spec, grad, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp = log_probs.astype(np.float64)
    t_max, n, c = lp.shape
    ext = _ctc_labels(targets, target_lengths, blank)
    nll, alpha, beta = _ctc_alpha_beta(lp, ext, input_lengths, target_lengths, blank, True)
    ab = alpha + beta  # (T, N, S): log of (paths through s at t) * p(l'_s at t)
    post = np.full((t_max, n, c), -np.inf)
    rows = np.arange(n)
    for s in range(ext.shape[1]):  # one pass per extended-label position; each sample adds to one class
        cls = ext[:, s]
        post[:, rows, cls] = np.logaddexp(post[:, rows, cls], ab[:, :, s])
    with np.errstate(invalid="ignore", over="ignore"):
        g = np.exp(lp) - np.exp(post + nll[None, :, None] - lp)
    live = np.arange(t_max)[:, None] < np.asarray(input_lengths, np.int64)[None, :]
    g = np.where(live[:, :, None], g, 0.0)
    if zero_infinity:
        g = np.where(np.isinf(nll)[None, :, None], 0.0, g)
    return (g * grad.astype(np.float64)[None, :, None]).astype(_compute_np(spec.dtype))


def _ctc_bwd_backward(grad):
    # as in PyTorch: CTC has no second derivative; refusing beats a silently partial one
    raise RuntimeError("derivative for aten::_ctc_loss_backward is not implemented")


@op(
    tags=("nn", "backward"),
    meta=_ctc_bwd_meta,
    reference=_ctc_bwd_ref,
    backward=_ctc_bwd_backward,
    autocast="fp32",
    grad_fn_name="CtcLossBackwardBackward0",
)
def _ctc_loss_backward(
    grad: Tensor,
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: tuple,
    target_lengths: tuple,
    blank: int = 0,
    zero_infinity: bool = False,
) -> Tensor:
    """Gradient of :func:`_ctc_loss` for log-softmax outputs (PyTorch's formula: ``exp(lp) - posterior``)."""


def _lengths(v, name: str) -> tuple:
    if isinstance(v, Tensor):
        if v._dtype.is_floating_point or v._dtype is dt.bool:
            raise RuntimeError(f"{name} must be integral")
        return tuple(int(x) for x in np.asarray(v.detach().cpu().numpy()).reshape(-1))
    if not isinstance(v, (tuple, list)):
        raise TypeError(f"ctc_loss(): argument '{name}' must be tuple of ints or Tensor, not {type(v).__name__}")
    return tuple(int(x) for x in v)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """Connectionist Temporal Classification loss of ``log_probs`` (T, N, C) or unbatched (T, C)."""
    k = _kiln()
    reduction = _reduction(reduction)
    unbatched = len(log_probs._shape) == 2
    il = _lengths(input_lengths, "input_lengths")
    tl = _lengths(target_lengths, "target_lengths")
    if unbatched:
        log_probs = log_probs.unsqueeze(1)  # targets stay 1-D: one sample in the concatenated format
    if targets._dtype.is_floating_point:
        targets = targets.to(dt.int64)
    res = _ctc_loss(log_probs, targets, il, tl, blank, zero_infinity)
    if zero_infinity:
        res = k.where(k.isinf(res), 0.0, res)
    if unbatched:
        res = res.squeeze(0)
    if reduction == "mean":
        lengths = k.tensor([max(x, 1) for x in tl], dtype=res.dtype, device=res.device)
        return (res / (lengths.squeeze(0) if unbatched else lengths)).mean()
    return _reduce(res, reduction)
