"""Fractional max pooling (``torch.nn.functional.fractional_max_pool2d/3d``, Graham 2014): windows of a
fixed size whose start positions advance by pseudo-random steps of ``floor(alpha)`` or ``ceil(alpha)``,
``alpha = (input - kernel) / (output - 1)``, one sample in [0, 1) per plane and spatial dim.

Composed from kiln ops: the window starts are computed from the samples in the input's dtype (as
PyTorch computes them, so the same samples give the same windows), the windows are gathered from each
plane, and the maximum of each is picked with PyTorch's rules (the first maximum; a NaN wins, the last
one); the gradient flows back through the gathers.
"""

from __future__ import annotations

import math

import kiln
from kiln import Tensor
from kiln.nn._pool_args import int_tuple, not_implemented, ntuple, shape_list

__all__ = [
    "fractional_max_pool2d",
    "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d",
    "fractional_max_pool3d_with_indices",
]

_DIM_WORDS = {2: ("height", "width"), 3: ("time", "height", "width")}


def _intervals(sample: Tensor, size: int, out: int, k: int) -> Tensor:
    """Window starts ``(..., out)`` along one dim for per-plane ``sample``s ``(...)``, in the samples' dtype."""
    lead = tuple(sample.shape)
    if out == 0:
        return kiln.zeros((*lead, 0), dtype=kiln.int64, device=sample.device)
    last = kiln.full((*lead, 1), size - k, dtype=kiln.int64, device=sample.device)
    if out == 1:
        return last
    dtype = sample.dtype
    alpha = kiln.tensor(float(size - k), dtype=dtype) / kiln.tensor(float(out - 1), dtype=dtype)
    i = kiln.arange(out - 1, device=sample.device).to(dtype)
    u = sample.unsqueeze(-1)
    starts = ((i + u) * alpha).trunc().long() - (u * alpha).trunc().long()
    return kiln.cat([starts, last], dim=-1)


def _fractional(nd: int, input: Tensor, kernel_size, output_size, samples: Tensor) -> tuple[Tensor, Tensor]:
    fn = f"fractional_max_pool{nd}d"
    name = fn if nd == 2 else "fractional_max_pool3d_out"
    words = "Ints" if nd == 2 else "three Ints"
    k = int_tuple(
        kernel_size, nd, fn, "kernel_size", 2, f"{fn}: kernel_size must either be a single Int or tuple of {words}"
    )
    out = int_tuple(
        output_size, nd, fn, "output_size", 3, f"{fn}: output_size must either be a single Int or tuple of {words}"
    )
    rank = input.dim()
    if rank not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got: {shape_list(input.shape)}")
    for i in range(1, rank):
        if input.shape[i] == 0:
            raise RuntimeError(
                f"{name}(): Expected input to have non-zero size for non-batch dimensions, but got"
                f"{shape_list(input.shape)} with dimension {i} being empty."
            )
    batched = rank == nd + 2
    n = input.shape[0] if batched else 1
    c = input.shape[-nd - 1]
    sizes = tuple(input.shape[-nd:])
    for o, kk, size, word in zip(out, k, sizes, _DIM_WORDS[nd]):
        # PyTorch's 3-d check is strict, its 2-d one is not
        if o + kk - 1 > size or (nd == 3 and o + kk - 1 == size):
            raise RuntimeError(f"{name}(): pool {word} {kk} too large relative to input {word} {size}")
    for v in out:
        if v < 0:
            raise RuntimeError(
                f"Trying to create tensor with negative dimension {v}: {shape_list(input.shape[:-nd] + tuple(out))}"
            )
    if samples.dtype != input.dtype:
        raise RuntimeError("Expect _random_samples to have the same dtype as input")
    if samples.dim() != 3:
        raise RuntimeError(f"Expect _random_samples to have 3 dimensions, got {samples.dim()}")
    if samples.shape[0] < n:
        raise RuntimeError("Expect _random_samples.size(0) no less then input batch size.")
    if samples.shape[1] != c:
        raise RuntimeError("Expect _random_samples.size(1) equals to input channel size.")
    if samples.shape[2] != nd:
        raise RuntimeError(f"Expect _random_samples.size(2) equals to {nd}; got {samples.shape[2]}.")
    if not input.dtype.is_floating_point:
        raise not_implemented(f"{fn}_out_frame", input.dtype)
    x = input if batched else input.unsqueeze(0)
    u = samples[:n]
    # PyTorch's sample order: (width, height) in 2-d, (time, height, width) in 3-d
    which = (1, 0) if nd == 2 else (0, 1, 2)
    starts = [_intervals(u[..., j], size, o, kk) for j, size, o, kk in zip(which, sizes, out, k)]
    # flat index into each plane of every (output position, window offset): (N, C, *out, *k), the
    # offsets in scan order once flattened
    strides = [math.prod(sizes[d + 1 :]) for d in range(nd)]
    index = 0
    for d in range(nd):
        at = [1] * (2 * nd)
        at[d] = out[d]
        pos = starts[d].reshape(n, c, *at[:nd], *[1] * nd)
        at = [1] * (2 * nd)
        at[nd + d] = k[d]
        offs = kiln.arange(k[d], device=input.device).reshape(*at)
        index = index + (pos + offs) * strides[d]
    window = math.prod(k)
    index = index.expand(n, c, *out, *k).reshape(n, c, *out, window)
    plane = math.prod(sizes)
    values = x.reshape(n, c, plane).gather(2, index.reshape(n, c, math.prod(out) * window)).reshape(n, c, *out, window)
    nan = values.isnan()
    first_max = values.masked_fill(nan, -math.inf).argmax(-1, keepdim=True)
    last_nan = (nan.long() * kiln.arange(1, window + 1, device=input.device)).argmax(-1, keepdim=True)
    pick = kiln.where(nan.any(-1, keepdim=True), last_nan, first_max)
    result, indices = values.gather(-1, pick).squeeze(-1), index.gather(-1, pick).squeeze(-1)
    if not batched:
        result, indices = result.squeeze(0), indices.squeeze(0)
    return result, indices


def _with_indices(nd: int, input, kernel_size, output_size, output_ratio, _random_samples):
    fn = f"fractional_max_pool{nd}d"
    if output_size is None and output_ratio is None:
        raise ValueError(f"{fn} requires specifying either an output_size or an output_ratio")
    if output_size is None:
        if nd == 2 and len(output_ratio) > 2:
            raise ValueError(f"{fn} requires output_ratio to either be a single Int or tuple of Ints.")
        ratio = ntuple(output_ratio, nd)
        output_size = [int(input.shape[-nd + i] * ratio[i]) for i in range(nd)]
    if _random_samples is None:
        n_batch = 1 if input.dim() == nd + 1 else input.size(0)
        _random_samples = kiln.rand(n_batch, input.size(-nd - 1), nd, dtype=input.dtype, device=input.device)
    return _fractional(nd, input, kernel_size, output_size, _random_samples)


def fractional_max_pool2d_with_indices(
    input: Tensor, kernel_size, output_size=None, output_ratio=None, return_indices: bool = False,
    _random_samples: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """2-d fractional max pooling returning ``(values, indices)`` (flat in each ``H*W`` plane)
    (``torch.nn.functional.fractional_max_pool2d_with_indices``)."""
    return _with_indices(2, input, kernel_size, output_size, output_ratio, _random_samples)


def fractional_max_pool2d(
    input: Tensor, kernel_size, output_size=None, output_ratio=None, return_indices: bool = False,
    _random_samples: Tensor | None = None,
):  # fmt: skip
    """2-d fractional max pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.functional.fractional_max_pool2d``).

    Give ``output_size`` (ints) or ``output_ratio`` (fractions of the input size, a pair for the
    functional form as in PyTorch); ``_random_samples`` ``(N, C, 2)`` in [0, 1) fixes the windows (drawn
    with ``kiln.rand`` otherwise); ``return_indices`` also returns the argmax positions.
    """
    out = _with_indices(2, input, kernel_size, output_size, output_ratio, _random_samples)
    return out if return_indices else out[0]


def fractional_max_pool3d_with_indices(
    input: Tensor, kernel_size, output_size=None, output_ratio=None, return_indices: bool = False,
    _random_samples: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """3-d fractional max pooling returning ``(values, indices)`` (flat in each ``D*H*W`` plane)
    (``torch.nn.functional.fractional_max_pool3d_with_indices``)."""
    return _with_indices(3, input, kernel_size, output_size, output_ratio, _random_samples)


def fractional_max_pool3d(
    input: Tensor, kernel_size, output_size=None, output_ratio=None, return_indices: bool = False,
    _random_samples: Tensor | None = None,
):  # fmt: skip
    """3-d fractional max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``
    (``torch.nn.functional.fractional_max_pool3d``); ``_random_samples`` is ``(N, C, 3)``."""
    out = _with_indices(3, input, kernel_size, output_size, output_ratio, _random_samples)
    return out if return_indices else out[0]
