"""Pooling functions of ``torch.nn.functional`` the core has no op for, composed from its 1-d/2-d pooling
ops (so every backend's kernels for those serve them, gradients included):

* ``avg_pool3d``: window sums over (H, W) then over D (2-d average pooling with ``divisor_override=1``),
  divided by PyTorch's divisor per output position;
* ``adaptive_avg_pool3d`` / ``adaptive_max_pool3d``: adaptive windows are boxes, so pooling (H, W) then
  D gives the box's mean or maximum; for the maximum, the first maximum in (d, h, w) order wins and the
  last NaN, as in PyTorch's kernel, and the flat index is rebuilt from both stages' indices;
* ``lp_pool1d/2d/3d``: PyTorch's formula over average pooling;
* ``max_unpool1d/2d/3d``: a scatter of the values at their indices into zeros.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

import kiln
from kiln import Tensor
from kiln.nn._pool_args import (
    check_3d_input,
    check_int_list,
    check_pool_window,
    int_tuple,
    ntuple,
    scalar_type_name,
    shape_list,
)
from kiln.nn._pool_args import not_implemented as _not_implemented

__all__ = [
    "avg_pool3d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "adaptive_max_pool3d_with_indices",
    "lp_pool1d",
    "lp_pool2d",
    "lp_pool3d",
    "max_unpool1d",
    "max_unpool2d",
    "max_unpool3d",
]


def _F():
    from kiln.nn import functional

    return functional


# ---------------------------------------------------------------------------------------- average pooling


def _window_counts(size: int, out: int, k: int, s: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output position along one dim: the window's length inside input + padding, and inside the input."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    padded = end - start
    inside = np.minimum(end, size) - np.maximum(start, 0)
    return padded, inside


def avg_pool3d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """3-d average pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` (``torch.nn.functional.avg_pool3d``).

    ``count_include_pad`` counts the zero padding in each window's divisor; ``divisor_override``
    replaces the divisor. Float32, float64 and int64 inputs (an int64 mean truncates, as PyTorch's).
    """
    fn = "avg_pool3d"
    k = int_tuple(
        kernel_size, 3, fn, "kernel_size", 2, f"{fn}: kernel_size must be a single int, or a tuple of three ints"
    )
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        s = k
    else:
        s = int_tuple(
            stride, 3, fn, "stride", 3, f"{fn}: stride must be omitted, a single int, or a tuple of three ints"
        )
    p = int_tuple(padding, 3, fn, "padding", 4, f"{fn}: padding must be a single int, or a tuple of three ints")
    check_3d_input(fn, input)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    check_pool_window(k, s, p)
    sizes = tuple(input.shape[-3:])
    if any(n < kk for n, kk in zip(sizes, k)):
        raise RuntimeError(
            f"input image (T: {sizes[0]} H: {sizes[1]} W: {sizes[2]}) smaller than kernel size "
            f"(kT: {k[0]} kH: {k[1]} kW: {k[2]})"
        )
    if input.dtype not in (kiln.float32, kiln.float64, kiln.int64):
        raise _not_implemented("avg_pool3d_out_frame", input.dtype)
    F = _F()
    lead = tuple(input.shape[:-3])
    d, h, w = sizes
    x = input.reshape(math.prod(lead), d, h, w)
    # window sums over (H, W), then over D (a (kD, 1) window on the (D, oH*oW) plane)
    x = F.avg_pool2d(x, k[1:], s[1:], p[1:], ceil_mode, True, 1)
    oh, ow = x.shape[-2:]
    x = F.avg_pool2d(x.reshape(x.shape[0], 1, d, oh * ow), (k[0], 1), (s[0], 1), (p[0], 0), ceil_mode, True, 1)
    od = x.shape[-2]
    sums = x.reshape(*lead, od, oh, ow)
    if divisor_override is not None:
        divisor = np.full((od, oh, ow), divisor_override, np.int64)
    else:
        counts = [_window_counts(n, o, kk, ss, pp) for n, o, kk, ss, pp in zip(sizes, (od, oh, ow), k, s, p)]
        which = 0 if count_include_pad else 1
        cd, ch, cw = (c[which] for c in counts)
        divisor = cd[:, None, None] * ch[None, :, None] * cw[None, None, :]
    div = kiln.tensor(divisor, dtype=input.dtype, device=input.device)
    if input.dtype == kiln.int64:
        return kiln.div(sums, div, rounding_mode="trunc")
    return sums / div


# ---------------------------------------------------------------------------------------- adaptive pooling


def _list_with_default(output_size, input: Tensor):
    """``output_size`` with each ``None`` replaced by the input's size there (PyTorch's Python-side step)."""
    if isinstance(output_size, numbers.Integral):
        return output_size
    if input.dim() <= len(output_size):
        raise ValueError(f"Input dimension should be at least {len(output_size) + 1}")
    defaults = tuple(input.shape[-len(output_size) :])
    return [d if v is None else v for v, d in zip(output_size, defaults)]


def _adaptive_size(output_size, fn: str, length_message: str) -> tuple[int, int, int]:
    check_int_list(fn, "output_size", 2, output_size)
    if isinstance(output_size, numbers.Integral):
        return (int(output_size),) * 3
    if len(output_size) != 3:
        raise RuntimeError(length_message)
    return tuple(int(v) for v in output_size)


def _check_adaptive_input(fn: str, input: Tensor, colon: str) -> None:
    shape = tuple(input.shape)
    if len(shape) not in (4, 5):
        raise RuntimeError(f"{fn}(): Expected 4D or 5D tensor, but got{colon} {shape_list(shape)}")
    for i in range(1, len(shape)):
        if shape[i] == 0:
            raise RuntimeError(
                f"{fn}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
                f"{shape_list(shape)} with dimension {i} being empty"
            )


def _empty_result(input: Tensor, shape: tuple) -> Tensor:
    """A result with no elements, still connected to ``input``'s graph."""
    return input.reshape(-1)[:0].reshape(shape)


def adaptive_avg_pool3d(input: Tensor, output_size) -> Tensor:
    """3-d adaptive average pooling of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` to ``output_size`` (an int,
    or a triple whose ``None`` keeps the input's size) (``torch.nn.functional.adaptive_avg_pool3d``)."""
    fn = "adaptive_avg_pool3d"
    out = _adaptive_size(_list_with_default(output_size, input), fn, f"{fn}: output_size must be 3")
    if any(v < 0 for v in out):
        raise RuntimeError(
            f"{fn}: elements of output_size must be greater than or equal to 0 but received "
            f"{{{out[0]}, {out[1]},{out[2]}}}"
        )
    _check_adaptive_input(fn, input, "")
    if not input.dtype.is_floating_point:
        raise _not_implemented("adaptive_avg_pool3d_cpu", input.dtype)
    lead = tuple(input.shape[:-3])
    if 0 in out or 0 in lead:
        return _empty_result(input, (*lead, *out))
    F = _F()
    d, h, w = input.shape[-3:]
    x = F.adaptive_avg_pool2d(input.reshape(math.prod(lead), d, h, w), out[1:])  # (B, D, oH, oW)
    x = x.reshape(x.shape[0], d, out[1] * out[2]).transpose(1, 2)
    x = F.adaptive_avg_pool1d(x, out[0])  # (B, oH*oW, oD)
    return x.transpose(1, 2).reshape(*lead, *out)


def adaptive_max_pool3d_with_indices(input: Tensor, output_size, return_indices: bool = False) -> tuple[Tensor, Tensor]:
    """3-d adaptive max pooling returning ``(values, indices)``, each index flat in its ``D*H*W`` plane
    (``torch.nn.functional.adaptive_max_pool3d_with_indices``)."""
    fn = "adaptive_max_pool3d"
    output_size = _list_with_default(output_size, input)
    check_int_list(fn, "output_size", 2, output_size)
    _check_adaptive_input(fn, input, ":")
    out = _adaptive_size(output_size, fn, f"{fn}(): internal error: output_size.size() must be 3")
    lead = tuple(input.shape[:-3])
    for v in out:
        if v < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {v}: {shape_list((*lead, *out))}")
    if not input.dtype.is_floating_point:
        raise _not_implemented("adaptive_max_pool3d_cpu", input.dtype)
    if 0 in out or 0 in lead:
        empty = kiln.zeros((*lead, *out), dtype=kiln.int64, device=input.device)
        return _empty_result(input, (*lead, *out)), empty
    F = _F()
    d, h, w = input.shape[-3:]
    b = math.prod(lead)
    v1, i1 = F.adaptive_max_pool2d_with_indices(input.reshape(b, d, h, w), out[1:])  # per d: max over (h, w)
    plane = out[1] * out[2]
    v1 = v1.reshape(b, d, plane).transpose(1, 2)
    v2, i2 = F.adaptive_max_pool1d_with_indices(v1, out[0])  # (B, oH*oW, oD): max over d
    hw_index = i1.reshape(b, d, plane).transpose(1, 2).gather(2, i2)
    index = i2 * (h * w) + hw_index
    shape = (*lead, *out)
    return v2.transpose(1, 2).reshape(shape), index.transpose(1, 2).reshape(shape)


def adaptive_max_pool3d(input: Tensor, output_size, return_indices: bool = False):
    """3-d adaptive max pooling to ``output_size``; with ``return_indices`` also the flat argmax in each
    ``D*H*W`` plane (``torch.nn.functional.adaptive_max_pool3d``)."""
    out = adaptive_max_pool3d_with_indices(input, output_size)
    return out if return_indices else out[0]


# ---------------------------------------------------------------------------------------- power-average pooling


def _lp_pool(nd: int, input: Tensor, norm_type, kernel_size, stride, ceil_mode: bool) -> Tensor:
    F = _F()
    max_pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
    avg_pool = (F.avg_pool1d, F.avg_pool2d, avg_pool3d)[nd - 1]
    window = kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * nd
    if isinstance(norm_type, (int, float)) and math.isinf(norm_type):
        if norm_type > 0:
            return max_pool(input.abs(), kernel_size, stride, 0, 1, ceil_mode)
        return -max_pool(-input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    if stride is not None:
        out = avg_pool(input.pow(norm_type), kernel_size, stride, 0, ceil_mode)
    else:
        out = avg_pool(input.pow(norm_type), kernel_size, padding=0, ceil_mode=ceil_mode)
    # sign's gradient is zero: detached, its product cannot turn pow's infinite slope at 0 into NaN
    return (kiln.sign(out).detach() * F.relu(out.abs())).mul(math.prod(window)).pow(1.0 / norm_type)


def lp_pool1d(input: Tensor, norm_type: int | float, kernel_size: int, stride=None, ceil_mode: bool = False) -> Tensor:
    """1-d power-average pooling ``(Σ x^p)^(1/p)`` over each window (``torch.nn.functional.lp_pool1d``);
    ``p = ±inf`` is max pooling of ``|x|`` (of ``-|x|``, negated, for ``-inf``). A window whose sum is 0 has
    gradient 0."""
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input: Tensor, norm_type: int | float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    """2-d power-average pooling ``(Σ x^p)^(1/p)`` over each window (``torch.nn.functional.lp_pool2d``)."""
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input: Tensor, norm_type: int | float, kernel_size, stride=None, ceil_mode: bool = False) -> Tensor:
    """3-d power-average pooling ``(Σ x^p)^(1/p)`` over each window (``torch.nn.functional.lp_pool3d``)."""
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


# ---------------------------------------------------------------------------------------- unpooling


def _unpool_output_size(input: Tensor, kernel_size, stride, padding, output_size) -> list[int]:
    """The unpooled spatial size: the default ``(in - 1) * stride + kernel - 2 * padding``, or
    ``output_size`` (its last ``nd`` entries) when it lies within one stride of that."""
    nd = len(kernel_size)
    default = [(input.shape[-nd + i] - 1) * stride[i] + kernel_size[i] - 2 * padding[i] for i in range(nd)]
    if output_size is None:
        ret = default
    else:
        if len(output_size) == nd + 2:
            output_size = output_size[2:]
        if len(output_size) != nd:
            raise ValueError(
                f"output_size should be a sequence containing {nd} or {nd + 2} elements, but it has a length of "
                f"'{len(output_size)}'"
            )
        for i in range(nd):
            lo, hi = default[i] - stride[i], default[i] + stride[i]
            if not lo < output_size[i] < hi:
                raise ValueError(f'invalid output_size "{output_size}" (dim {i} must be between {lo} and {hi})')
        ret = output_size
    for i, v in enumerate(ret):
        if isinstance(v, numbers.Integral) and v < 0:
            raise ValueError(
                f"max_unpooling: output_size must contain non-negative spatial dimensions, but got output_size[{i}]={v}"
            )
    return list(ret)


def _max_unpool(input: Tensor, indices: Tensor, size: list, name: str, nd: int) -> Tensor:
    """``input`` written at ``indices`` (flat in each output plane of ``size``) into zeros."""
    check_int_list(f"max_unpool{nd}d", "output_size", 3, size)
    size = [int(v) for v in size]
    if indices.dtype != kiln.int64:
        raise RuntimeError(f"elements in indices should be type int64 but got: {scalar_type_name(indices.dtype)}")
    rank = input.dim()
    if rank not in (nd + 1, nd + 2):
        what = "max_unpooling2d" if nd == 2 else "max_unpooling3d"
        raise RuntimeError(
            f"Input to {what} should be a {nd + 1}d or {nd + 2}d Tensor, but got a tensor with {rank} dimensions."
        )
    if tuple(indices.shape) != tuple(input.shape):
        raise RuntimeError(
            f"Expected shape of indices to be same as that of the input tensor ({shape_list(input.shape)}) but got "
            f"indices tensor with shape: {shape_list(indices.shape)}"
        )
    for i in range(1, rank):
        if input.shape[i] == 0:
            raise RuntimeError(
                f"{name}_forward_out_cpu(): Expected input to have non-zero size for non-batch dimensions, but got "
                f"{shape_list(input.shape)} with dimension {i} being empty."
            )
    if input.dtype not in (kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16):
        raise _not_implemented(f"max_unpool{nd}d", input.dtype)
    lead = tuple(input.shape[:-nd])
    plane = math.prod(size)
    flat = indices.reshape(*lead, math.prod(input.shape[-nd:]))
    bad = ((flat < 0) | (flat >= plane)).reshape(-1)
    if flat.numel() and bool(bad.any()):
        last = int(flat.reshape(-1)[bad.nonzero()[-1, 0]].item())  # PyTorch's loop reports the last one
        raise RuntimeError(
            f"Found an invalid max index: {last} (output volumes are of size {'x'.join(map(str, size))})"
        )
    out = kiln.zeros((*lead, plane), dtype=input.dtype, device=input.device)
    return out.scatter(-1, flat, input.reshape(flat.shape)).reshape(*lead, *size)


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool1d``: ``input`` at its argmax ``indices`` in zeros
    (``torch.nn.functional.max_unpool1d``); ``output_size`` picks among the sizes that pool to ``input``'s."""
    k = ntuple(kernel_size, 1)
    s = ntuple(stride, 1) if stride is not None else k
    p = ntuple(padding, 1)
    size = _unpool_output_size(input, k, s, p, output_size)
    return _max_unpool(input.unsqueeze(-1), indices.unsqueeze(-1), [*size, 1], "max_unpooling2d", 2).squeeze(-1)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool2d``: ``input`` at its argmax ``indices`` (flat in each ``H*W`` plane)
    in zeros (``torch.nn.functional.max_unpool2d``)."""
    k = ntuple(kernel_size, 2)
    s = ntuple(stride, 2) if stride is not None else k
    p = ntuple(padding, 2)
    size = _unpool_output_size(input, k, s, p, output_size)
    return _max_unpool(input, indices, size, "max_unpooling2d", 2)


def max_unpool3d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of ``max_pool3d``: ``input`` at its argmax ``indices`` (flat in each ``D*H*W``
    plane) in zeros (``torch.nn.functional.max_unpool3d``)."""
    k = ntuple(kernel_size, 3)
    s = ntuple(stride, 3) if stride is not None else k
    p = ntuple(padding, 3)
    size = _unpool_output_size(input, k, s, p, output_size)
    if any(v <= 0 for v in s):
        raise RuntimeError(f"strides should be greater than zero, but got stride: {shape_list(s)}")
    return _max_unpool(input, indices, size, "max_unpooling3d", 3)
