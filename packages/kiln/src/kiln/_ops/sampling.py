"""Sampling from categorical distributions: ``multinomial``.

Like ``randperm`` and ``randint``, the draws are made on the host from a :class:`kiln.Generator` (the
default generator of the input's device when none is given) and the indices are copied to the input's
device, so a seeded program draws the same indices on every backend.
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import with_out
from kiln._ops._meta import scalar_type_name
from kiln._tensor import Tensor

__all__ = ["multinomial"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

_MAX_CATEGORIES = 2**24


@with_out
def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """``num_samples`` category indices (int64) drawn from each row of ``input``, a 1-D or 2-D tensor of
    non-negative weights (not necessarily summing to one), as ``torch.multinomial``.

    Without ``replacement`` each row's indices are distinct (so ``num_samples`` can be at most the number
    of categories); once the categories of positive weight are used up, zero-weight ones follow in index
    order. The result has shape ``(num_samples,)`` or ``(rows, num_samples)``.
    """
    from kiln._ops.copy import from_host
    from kiln._ops.random_ops import _generator

    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(
            f"multinomial(): argument 'num_samples' (position 2) must be int, not {type(num_samples).__name__}"
        )
    num_samples = int(num_samples)
    if input.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not input._dtype.is_floating_point:
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got: {scalar_type_name(input._dtype)}"
        )
    n_categories = input._shape[-1]
    if n_categories > _MAX_CATEGORIES:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > n_categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    probs = input.detach().to(dt.float64).cpu().numpy().reshape(-1, n_categories)
    rows = probs.shape[0]
    if probs.size and not (np.isfinite(probs).all() and (probs >= 0).all()):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if rows and n_categories and (probs.sum(axis=1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    rng = _generator(generator, input._device)._rng
    if rows == 0:
        picks = np.zeros((0, num_samples), dtype=np.int64)
    elif replacement:
        cdf = np.cumsum(probs, axis=1)
        u = rng.random((rows, num_samples)) * cdf[:, -1:]
        last_positive = n_categories - 1 - np.argmax(probs[:, ::-1] > 0, axis=1)
        picks = np.empty((rows, num_samples), dtype=np.int64)
        for r in range(rows):
            picks[r] = np.minimum(np.searchsorted(cdf[r], u[r], side="right"), last_positive[r])
    else:
        # the exponential race: each category's weight over an Exp(1) draw; the largest keys win, in order
        keys = probs / rng.exponential(size=probs.shape)
        picks = np.argsort(-keys, axis=1, kind="stable")[:, :num_samples].astype(np.int64)
    if input.dim() == 1:
        picks = picks.reshape(num_samples)
    return from_host(picks, dt.int64, input._device)


Tensor.multinomial = multinomial
