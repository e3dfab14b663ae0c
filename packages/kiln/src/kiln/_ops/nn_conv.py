"""nn primitives: N-d convolution and its transpose (one op, ``convolution``), ``im2col`` and ``col2im``
(behind ``unfold`` and ``fold``), with the ``torch.nn.functional`` front ends ``conv1d``/``conv2d``/``conv3d`` and
``conv_transpose1d``/``conv_transpose2d``/``conv_transpose3d``.

The reference kernels are im2col + one batched matmul over the groups (a convolution), and one batched
matmul + col2im, a scatter-add over the kernel offsets (a transposed convolution). Gradients are
written with ``convolution`` itself: the input's gradient of a convolution is the transposed
convolution of ``grad`` with the same weight (and the other way round), and the weight's gradient is
a convolution of the input by ``grad`` with batch and channel roles swapped (stride and dilation
exchange places). So every derivative, of any order, is again a convolution. ``im2col`` and
``col2im`` are each other's adjoint, hence each other's backward.
"""

from __future__ import annotations

import itertools
import numbers
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import can_cast, common_device, scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._spec import ConvSpec, FoldSpec, WindowSpec
from kiln._tensor import Tensor

# the torch.nn.functional names (kiln.nn.functional re-exports them); ``convolution`` is torch's top-level op
__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "unfold",
    "fold",
]

TOP_LEVEL = (
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

IntOrTuple = "int | tuple[int, ...]"

# PyTorch's names of a dtype in convolution's error messages: the legacy tensor type, the C type
_TENSOR_TYPE = {
    dt.float32: "kiln.FloatTensor",
    dt.float64: "kiln.DoubleTensor",
    dt.float16: "kiln.HalfTensor",
    dt.bfloat16: "CPUBFloat16Type",
    dt.int64: "kiln.LongTensor",
    dt.int32: "kiln.IntTensor",
    dt.int16: "kiln.ShortTensor",
    dt.int8: "kiln.CharTensor",
    dt.uint8: "kiln.ByteTensor",
    dt.bool: "kiln.BoolTensor",
}
_MKLDNN_TYPES = (dt.float32, dt.float16, dt.bfloat16)  # inputs PyTorch's CPU backend checks the "MKLDNN" way


def _int_list(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _as_tuple(value) -> tuple:
    return (int(value),) if isinstance(value, numbers.Integral) else tuple(value)


def _expand_param(value, name: str, n: int) -> tuple[int, ...]:
    """An int or a list of one or ``n`` ints as ``n`` ints (PyTorch's ``expand_param_if_needed``)."""
    v = _as_tuple(value)
    if len(v) == 1:
        return v * n
    if len(v) != n:
        raise RuntimeError(
            f"expected {name} to be a single integer value or a list of {n} values to match the convolution "
            f"dimensions, but got {name}={_int_list(v)}"
        )
    return tuple(int(x) for x in v)


def _check_tensor(name: str, fn: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{fn}(): argument '{name}' (position {1 if name == 'input' else 2}) must be Tensor, not {type(x).__name__}"
        )


# ---------------------------------------------------------------------------------------- convolution


def _conv_params(weight, stride, padding, dilation, output_padding):
    n = len(weight._shape) - 2
    return (
        _expand_param(stride, "stride", n),
        _expand_param(padding, "padding", n),
        _expand_param(dilation, "dilation", n),
        _expand_param(output_padding, "output_padding", n),
    )


def _conv_output_size(in_size, k, s, p, d, transposed, op_):
    if transposed:
        return (in_size - 1) * s - 2 * p + d * (k - 1) + op_ + 1
    return (in_size + 2 * p - d * (k - 1) - 1) // s + 1


def _int_kernel_name(nd: int, transposed: bool, dilated: bool) -> str:
    if transposed:
        return f"slow_conv_transpose{3 if nd == 3 else 2}d_out_cpu"
    if dilated:
        return "slow_conv_dilated<>"
    return "compute_columns3d" if nd == 3 else "slow_conv2d_cpu"


def _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_tensor("input", "convolution", input)
    _check_tensor("weight", "convolution", weight)
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"convolution(): argument 'bias' (position 3) must be Tensor, not {type(bias).__name__}")
    ws = weight._shape
    if len(ws) < 3:
        raise RuntimeError("weight should have at least three dimensions")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    for pos, name, v in ((4, "stride", stride), (5, "padding", padding), (6, "dilation", dilation)):
        if isinstance(v, str):
            raise TypeError(f"convolution(): argument '{name}' (position {pos}) must be tuple of ints, not str")
    if not isinstance(groups, numbers.Integral):
        raise TypeError(f"convolution(): argument 'groups' (position 9) must be int, not {type(groups).__name__}")
    s, p, d, op_ = _conv_params(weight, stride, padding, dilation, output_padding)
    x_dtype = input._dtype
    if bias is not None and bias._dtype is not x_dtype:
        if transposed and x_dtype not in _MKLDNN_TYPES:  # the slow path adds the bias in place
            if not can_cast(bias._dtype, x_dtype):
                raise RuntimeError(
                    f"result type {scalar_type_name(bias._dtype)} can't be cast to the desired output type "
                    f"{scalar_type_name(x_dtype)}"
                )
        elif transposed:
            raise RuntimeError(
                f"Input type ({_TENSOR_TYPE[x_dtype]}) and bias type ({_TENSOR_TYPE[bias._dtype]}) should be the "
                "same or input should be a MKLDNN tensor and bias is a dense tensor"
            )
        else:
            raise RuntimeError(
                f"Input type ({dt.CPP_TYPE_NAMES[x_dtype]}) and bias type ({dt.CPP_TYPE_NAMES[bias._dtype]}) should be the same"
            )
    xs = input._shape
    nd = len(ws) - 2
    if any(v < 0 for v in p):
        raise RuntimeError("negative padding is not supported")
    if any(v < 0 for v in op_):
        raise RuntimeError("negative output_padding is not supported")
    if any(v <= 0 for v in s):
        raise RuntimeError("non-positive stride is not supported")
    if any(v <= 0 for v in d):
        raise RuntimeError("non-positive dilation is not supported")
    if len(xs) != len(ws):
        raise RuntimeError(
            f"Expected {len(ws)}-dimensional input for {len(ws)}-dimensional weight {_int_list(ws)}, but got "
            f"{len(xs)}-dimensional input of size {_int_list(xs)} instead"
        )
    if ws[0] < groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got weight of size "
            f"{_int_list(ws)} instead"
        )
    if ws[0] % groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got weight of "
            f"size [{_int_list(ws)}] instead"
        )
    if not transposed:
        if xs[1] != ws[1] * groups:
            raise RuntimeError(
                f"Given groups={groups}, weight of size {_int_list(ws)}, expected input{_int_list(xs)} to have "
                f"{ws[1] * groups} channels, but got {xs[1]} channels instead"
            )
        if bias is not None and (len(bias._shape) != 1 or bias._shape[0] != ws[0]):
            raise RuntimeError(
                f"Given weight of size {_int_list(ws)}, expected bias to be 1-dimensional with {ws[0]} elements, "
                f"but got bias of size {_int_list(bias._shape)} instead"
            )
        padded = [xs[2 + i] + 2 * p[i] for i in range(nd)]
        kernel = [d[i] * (ws[2 + i] - 1) + 1 for i in range(nd)]
        if any(a < b for a, b in zip(padded, kernel)):
            raise RuntimeError(
                f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
                f"({' x '.join(map(str, kernel))}). Kernel size can't be greater than actual input size"
            )
        out_channels = ws[0] if xs[1] else 0  # PyTorch gives a zero-channel input a zero-channel result
    else:
        if xs[1] != ws[0]:
            raise RuntimeError(
                f"Given transposed=1, weight of size {_int_list(ws)}, expected input{_int_list(xs)} to have "
                f"{ws[0]} channels, but got {xs[1]} channels instead"
            )
        if bias is not None and (len(bias._shape) != 1 or bias._shape[0] != ws[1] * groups):
            raise RuntimeError(
                f"Given transposed=1, weight of size {_int_list(ws)}, expected bias to be 1-dimensional with "
                f"{ws[1] * groups} elements, but got bias of size {_int_list(bias._shape)} instead"
            )
        if any(o >= s[i] and o >= d[i] for i, o in enumerate(op_)):
            # PyTorch runs 1-d as 2-d (a unit height) and names the dims
            names = ("depth", "height", "width")[-max(nd, 2) :]
            lead = ((0,), (1,), (1,)) if nd == 1 else ((), (), ())
            parts = [f"output_padding_{a}: {v}" for a, v in zip(names, lead[0] + op_)]
            parts += [f"stride_{a}: {v}" for a, v in zip(names, lead[1] + s)]
            parts += [f"dilation_{a}: {v}" for a, v in zip(names, lead[2] + d)]
            raise RuntimeError(
                "output padding must be smaller than either stride or dilation, but got " + " ".join(parts)
            )
        if len(xs) > 2 and any(v == 0 for v in xs[2:]):
            raise RuntimeError(
                "Only zero batch or zero channel inputs are supported, but got input shape: " + _int_list(xs)
            )
        out_channels = ws[1] * groups
    if weight._dtype is not x_dtype:
        if x_dtype in _MKLDNN_TYPES:
            raise RuntimeError(
                f"Input type ({_TENSOR_TYPE[x_dtype]}) and weight type ({_TENSOR_TYPE[weight._dtype]}) should be the "
                "same or input should be a MKLDNN tensor and weight is a dense tensor"
            )
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(x_dtype)} but found {scalar_type_name(weight._dtype)}"
        )
    out_spatial = tuple(
        _conv_output_size(xs[2 + i], ws[2 + i], s[i], p[i], d[i], transposed, op_[i]) for i in range(nd)
    )
    # PyTorch returns an empty result for an empty batch before this check, if it can shape it
    if transposed and any(v <= 0 for v in out_spatial) and (_numel(xs) or any(v < 0 for v in out_spatial)):
        lead = "1 x " if nd == 1 else ""
        out_lead = "1 x " if nd == 1 else ""
        raise RuntimeError(
            f"Given input size per channel: ({lead}{' x '.join(map(str, xs[2:]))}). Calculated output size per "
            f"channel: ({out_lead}{' x '.join(map(str, out_spatial))}). Output size is too small"
        )
    if not x_dtype.is_floating_point and x_dtype is not dt.int64 and _numel(xs):
        dilated = any(v > 1 for v in d)
        if x_dtype is dt.bool or transposed or dilated:
            raise NotImplementedError(
                f"\"{_int_kernel_name(nd, transposed, dilated)}\" not implemented for '{scalar_type_name(x_dtype)}'"
            )
    dev = common_device("convolution", input, weight, bias)
    return ConvSpec(((xs[0], out_channels) + out_spatial, x_dtype, dev, s, p, d, op_))


def _numel(shape) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def _windows(x: np.ndarray, kernel, stride, dilation) -> np.ndarray:
    """Read-only view ``(N, C, *out, *kernel)`` of the (already padded) ``x`` ``(N, C, *spatial)``: the
    sliding blocks of a convolution (im2col without the copy)."""
    nd = len(kernel)
    spatial = x.shape[2:]
    out = tuple((spatial[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd))
    st = x.strides[2:]
    return np.lib.stride_tricks.as_strided(
        x,
        x.shape[:2] + out + tuple(kernel),
        x.strides[:2] + tuple(st[i] * stride[i] for i in range(nd)) + tuple(st[i] * dilation[i] for i in range(nd)),
        writeable=False,
    )


def _pad(x: np.ndarray, padding) -> np.ndarray:
    if not any(padding):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])


def _col2im(cols: np.ndarray, stride, dilation, padding, out_size) -> np.ndarray:
    """Scatter-add the blocks ``cols`` ``(N, C, *blocks, *kernel)`` into an ``(N, C, *out_size)`` image
    (the adjoint of :func:`_windows` after padding): one strided ``+=`` per kernel offset."""
    nd = len(out_size)
    blocks = cols.shape[2 : 2 + nd]
    kernel = cols.shape[2 + nd :]
    full = tuple(
        max((blocks[i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1, padding[i] + out_size[i], 0)
        for i in range(nd)
    )
    buf = np.zeros(cols.shape[:2] + full, cols.dtype)
    if all(blocks):
        for k in itertools.product(*(range(n) for n in kernel)):
            where = tuple(
                slice(k[i] * dilation[i], k[i] * dilation[i] + (blocks[i] - 1) * stride[i] + 1, stride[i])
                for i in range(nd)
            )
            buf[(slice(None), slice(None)) + where] += cols[(Ellipsis,) + k]
    return buf[(slice(None), slice(None)) + tuple(slice(padding[i], padding[i] + out_size[i]) for i in range(nd))]


def _conv_np(x, w, stride, padding, dilation, groups):
    n, c = x.shape[:2]
    cout = w.shape[0]
    kernel = w.shape[2:]
    nd = len(kernel)
    win = _windows(_pad(x, padding), kernel, stride, dilation)  # (N, C, *out, *K)
    out = win.shape[2 : 2 + nd]
    cig, cog = c // groups, cout // groups
    kp, op_ = _numel(kernel), _numel(out)
    win = win.reshape((n, groups, cig) + out + kernel)
    # (G, N, *out, Cig, *K): the im2col copy, one matrix per group
    order = (1, 0) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = win.transpose(order).reshape(groups, n * op_, cig * kp)
    wm = w.reshape(groups, cog, cig * kp).transpose(0, 2, 1)
    r = np.matmul(cols, wm)  # (G, N*out, Cog)
    r = r.reshape((groups, n) + out + (cog,))
    r = r.transpose((1, 0, 2 + nd) + tuple(range(2, 2 + nd)))
    return r.reshape((n, cout) + out)


def _conv_transpose_np(x, w, stride, padding, dilation, output_padding, groups, out_size):
    n, cin = x.shape[:2]
    spatial = x.shape[2:]
    nd = len(spatial)
    cog = w.shape[1]
    kernel = w.shape[2:]
    cig = cin // groups
    sp, kp = _numel(spatial), _numel(kernel)
    xm = x.reshape((n, groups, cig, sp)).transpose(1, 0, 3, 2).reshape(groups, n * sp, cig)
    wm = w.reshape(groups, cig, cog * kp)
    cols = np.matmul(xm, wm)  # (G, N*spatial, Cog*K)
    cols = cols.reshape((groups, n) + spatial + (cog,) + kernel)
    order = (1, 0, 2 + nd) + tuple(range(2, 2 + nd)) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = cols.transpose(order).reshape((n, groups * cog) + spatial + kernel)
    return _col2im(cols, stride, dilation, padding, out_size)


def _convolution_ref(spec, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    s, p, d, op_ = spec.stride, spec.padding, spec.dilation, spec.output_padding
    compute = _compute_np(spec.dtype) if spec.dtype.is_floating_point else np.dtype(np.int64)
    if not _numel(spec.shape):
        return np.zeros(spec.shape, spec.dtype.numpy)
    x = x.astype(compute, copy=False)
    w = w.astype(compute, copy=False)
    if transposed:
        out = _conv_transpose_np(x, w, s, p, d, op_, groups, spec.shape[2:])
    else:
        out = _conv_np(x, w, s, p, d, groups)
    if b is not None:
        out = out + b.astype(compute, copy=False).reshape((-1,) + (1,) * (out.ndim - 2))
    return np.ascontiguousarray(out).astype(spec.dtype.numpy, copy=False)


def _weight_grad(input, grad, weight_shape, stride, padding, dilation, groups):
    """The gradient of ``convolution(input, w)`` (not transposed) with respect to ``w`` of
    ``weight_shape``, given the output's ``grad``: a convolution of the input's channels (as batch) by
    ``grad``'s batch (as channels), one group of channels per group, with stride and dilation swapped."""
    n, c = input._shape[:2]
    nd = len(weight_shape) - 2
    cig = c // groups
    cout = weight_shape[0]
    cog = cout // groups
    sp = tuple(range(3, 3 + nd))
    x = input.reshape((n, groups, cig) + input._shape[2:]).permute((2, 1, 0) + sp)
    x = x.reshape((cig, groups * n) + input._shape[2:])
    g = grad.reshape((n, groups, cog) + grad._shape[2:]).permute((1, 2, 0) + sp)
    g = g.reshape((cout, n) + grad._shape[2:])
    r = convolution(x, g, None, dilation, padding, stride, False, (0,) * nd, groups)  # (Cig, Cout, *>=K)
    for i in range(nd):
        if r._shape[2 + i] != weight_shape[2 + i]:
            r = r.narrow(2 + i, 0, weight_shape[2 + i])
    return r.transpose(0, 1)


def _narrow_to(t: Tensor, shape) -> Tensor:
    for i in range(2, len(shape)):
        if t._shape[i] != shape[i]:
            t = t.narrow(i, 0, shape[i])
    return t


def _convolution_backward(
    grad, input, weight, stride, padding, dilation, transposed, output_padding, groups, needs_input_grad
):
    s, p, d, _ = _conv_params(weight, stride, padding, dilation, output_padding)
    nd = len(s)
    gx = gw = gb = None
    if not _numel(grad._shape) or not _numel(input._shape):  # empty batch or channels: zero gradients
        from kiln._ops.creation import zeros

        return tuple(
            zeros(shape, dtype=grad._dtype, device=grad._device) if needed else None
            for needed, shape in zip(
                needs_input_grad,
                (input._shape, weight._shape, (weight._shape[1] * groups if transposed else weight._shape[0],)),
            )
        )
    if needs_input_grad[0]:
        if transposed:
            gx = _narrow_to(convolution(grad, weight, None, s, p, d, False, (0,) * nd, groups), input._shape)
        else:
            xs, ks, gs = input._shape[2:], weight._shape[2:], grad._shape[2:]
            extra = tuple(xs[i] + 2 * p[i] - ((gs[i] - 1) * s[i] + d[i] * (ks[i] - 1) + 1) for i in range(nd))
            gx = convolution(grad, weight, None, s, p, d, True, extra, groups)
    if needs_input_grad[1]:
        if transposed:
            gw = _weight_grad(grad, input, weight._shape, s, p, d, groups)
        else:
            gw = _weight_grad(input, grad, weight._shape, s, p, d, groups)
    if len(needs_input_grad) > 2 and needs_input_grad[2]:
        gb = grad.sum((0,) + tuple(range(2, 2 + nd)))
    return (gx, gw, gb)


@op(
    tags=("nn",),
    meta=_convolution_meta,
    reference=_convolution_ref,
    backward=_convolution_backward,
    autocast="lower",
    grad_fn_name="ConvolutionBackward0",
)
def convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: IntOrTuple,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    transposed: bool,
    output_padding: IntOrTuple,
    groups: int,
) -> Tensor:
    """N-d convolution (or, with ``transposed``, its transpose) of a batched ``input`` ``(N, C, *spatial)``
    by ``weight``, plus ``bias`` (``torch.convolution``)."""


# ---------------------------------------------------------------------------------------- front ends


def _batchify(name: str, input, nd: int):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    k = input.dim()
    if k not in (nd + 1, nd + 2):
        raise RuntimeError(
            f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got input of size: "
            f"{_int_list(input._shape)}"
        )
    return (input, True) if k == nd + 2 else (input.unsqueeze(0), False)


def _pad_same(x: Tensor, weight: Tensor, dilation, nd: int):
    """(x padded on the right where 'same' needs one more zero there, symmetric padding)."""
    d = _expand_param(dilation, "dilation", nd)
    ks = weight._shape[2:] if weight.dim() == nd + 2 else (1,) * nd
    sym = []
    for i in range(nd):
        total = d[i] * (ks[i] - 1)
        left = total // 2
        sym.append(left)
        extra = total - 2 * left
        if extra:
            from kiln._ops.creation import zeros
            from kiln._ops.shape import cat

            warnings.warn(
                "Using padding='same' with even kernel lengths and odd dilation may require a zero-padded copy of "
                "the input be created",
                UserWarning,
                stacklevel=4,
            )
            dim = x.dim() - nd + i
            shape = list(x._shape)
            shape[dim] = extra
            x = cat([x, zeros(shape, dtype=x._dtype, device=x._device)], dim)
    return x, tuple(sym)


def _conv(name, nd, input, weight, bias, stride, padding, dilation, groups):
    x, batched = _batchify(name, input, nd)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if any(v != 1 for v in _as_tuple(stride)):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            x, padding = _pad_same(x, weight, dilation, nd)
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}'")
    out = convolution(
        x,
        weight,
        bias,
        _expand_ints(stride, nd),
        _expand_ints(padding, nd),
        _expand_ints(dilation, nd),
        False,
        (0,) * nd,
        groups,
    )
    return out if batched else out.squeeze(0)


def _expand_ints(v, nd):
    """An int as ``nd`` ints, as torch's argument parser does for ``conv{nd}d``; sequences unchanged."""
    return (int(v),) * nd if isinstance(v, numbers.Integral) else tuple(v)


def _conv_transpose(name, nd, input, weight, bias, stride, padding, output_padding, groups, dilation):
    if isinstance(padding, str):
        raise TypeError(f"{name}(): argument 'padding' must be tuple of ints, not str")
    x, batched = _batchify(name, input, nd)
    out = convolution(
        x,
        weight,
        bias,
        _expand_ints(stride, nd),
        _expand_ints(padding, nd),
        _expand_ints(dilation, nd),
        True,
        _expand_ints(output_padding, nd),
        groups,
    )
    return out if batched else out.squeeze(0)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution over ``(N, C, L)`` (or unbatched ``(C, L)``) input; ``padding`` may be 'valid' or 'same'."""
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d convolution over ``(N, C, H, W)`` (or unbatched ``(C, H, W)``) input; ``padding`` may be 'valid'/'same'."""
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-d convolution over ``(N, C, D, H, W)`` (or unbatched) input; ``padding`` may be 'valid' or 'same'."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """1-d transposed convolution ("deconvolution") over ``(N, C, L)`` (or unbatched) input."""
    return _conv_transpose(
        "conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2-d transposed convolution ("deconvolution") over ``(N, C, H, W)`` (or unbatched) input."""
    return _conv_transpose(
        "conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """3-d transposed convolution ("deconvolution") over ``(N, C, D, H, W)`` (or unbatched) input."""
    return _conv_transpose(
        "conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups, dilation
    )


# ---------------------------------------------------------------------------------------- unfold / fold


def _pair(value, name: str) -> tuple[int, int]:
    v = _as_tuple(value)
    if len(v) == 1:
        return (int(v[0]),) * 2
    if len(v) != 2:
        raise RuntimeError(f"It is expected {name} equals to 2, but got size {len(v)}")
    return (int(v[0]), int(v[1]))


def _block_params(kernel_size, dilation, padding, stride):
    k = _pair(kernel_size, "kernel_size")
    d = _pair(dilation, "dilation")
    p = _pair(padding, "padding")
    s = _pair(stride, "stride")
    if k[0] <= 0 or k[1] <= 0:
        raise RuntimeError(
            f"kernel size should be greater than zero, but got kernel_height: {k[0]} kernel_width: {k[1]}"
        )
    if s[0] <= 0 or s[1] <= 0:
        raise RuntimeError(f"stride should be greater than zero, but got stride_height: {s[0]} stride_width: {s[1]}")
    if d[0] <= 0 or d[1] <= 0:
        raise RuntimeError(
            f"dilation should be greater than zero, but got dilation_height: {d[0]} dilation_width: {d[1]}"
        )
    if p[0] < 0 or p[1] < 0:
        raise RuntimeError(f"padding should be non-negative, but got pad_height: {p[0]} pad_width: {p[1]}")
    return k, d, p, s


def _check_block_dtype(x: Tensor, kernel: str) -> None:
    if not (x._dtype.is_floating_point or x._dtype is dt.bool):
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(x._dtype)}'")


def _im2col_meta(input, kernel_size, dilation, padding, stride):
    _check_tensor("input", "im2col", input)
    k, d, p, s = _block_params(kernel_size, dilation, padding, stride)
    xs = input._shape
    if len(xs) < 3:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-len(xs)}, {len(xs) - 1}], but got 2)")
    if len(xs) > 4 or any(v == 0 for v in xs[len(xs) - 3 :]):
        raise RuntimeError(
            "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for "
            f"input, but got: {_int_list(xs)}"
        )
    h, w = xs[-2:]
    blocks = tuple((xs[-2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    if blocks[0] < 1 or blocks[1] < 1:
        raise RuntimeError(
            f"Given input with spatial size ({h}, {w}), kernel_size=({k[0]}, {k[1]}), dilation=({d[0]}, {d[1]}), "
            f"padding=({p[0]}, {p[1]}), calculated shape of the array of sliding blocks as ({blocks[0]}, "
            f"{blocks[1]}), but its components must be at least one."
        )
    _check_block_dtype(input, "im2col_out_cpu")
    shape = xs[:-3] + (xs[-3] * k[0] * k[1], blocks[0] * blocks[1])
    return WindowSpec((shape, input._dtype, input._device, k, d, p, s))


def _im2col_ref(spec, x, kernel_size, dilation, padding, stride):
    k, d, p, s = spec.kernel_size, spec.dilation, spec.padding, spec.stride
    batched = x.ndim == 4
    if not batched:
        x = x[None]
    win = _windows(_pad(x, p), k, s, d)  # (N, C, bh, bw, kh, kw)
    n, c = x.shape[:2]
    out = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * k[0] * k[1], -1 if win.size else spec.shape[-1])
    return out if batched else out[0]


def _im2col_backward(grad, input_shape, kernel_size, dilation, padding, stride):
    return col2im(grad, input_shape[-2:], kernel_size, dilation, padding, stride)


@op(tags=("nn",), meta=_im2col_meta, reference=_im2col_ref, backward=_im2col_backward, grad_fn_name="Im2ColBackward0")
def im2col(
    input: Tensor, kernel_size: IntOrTuple, dilation: IntOrTuple, padding: IntOrTuple, stride: IntOrTuple
) -> Tensor:
    """The sliding blocks of ``(N, C, H, W)`` (or ``(C, H, W)``) as ``(N, C * kh * kw, L)`` columns (what
    :func:`unfold` computes)."""


def _col2im_meta(input, output_size, kernel_size, dilation, padding, stride):
    _check_tensor("input", "col2im", input)
    out = _pair(output_size, "output_size")
    k, d, p, s = _block_params(kernel_size, dilation, padding, stride)
    xs = input._shape
    if len(xs) not in (2, 3) or any(v == 0 for v in xs[len(xs) - 2 :]):
        raise RuntimeError(
            "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for "
            f"input, but got: {_int_list(xs)}"
        )
    cols, nblocks = xs[-2:]
    if cols % (k[0] * k[1]):
        raise RuntimeError(
            "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got "
            f"input.size(1)={cols} and kernel_size=({k[0]}, {k[1]})."
        )
    blocks = tuple((out[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    given = (
        f"Given output_size=({out[0]}, {out[1]}), kernel_size=({k[0]}, {k[1]}), dilation=({d[0]}, {d[1]}), "
        f"padding=({p[0]}, {p[1]}), stride=({s[0]}, {s[1]}), "
    )
    if blocks[0] * blocks[1] != nblocks:
        raise RuntimeError(
            f"{given}expected size of input's dimension 2 to match the calculated number of sliding blocks "
            f"{blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, but got input.size(2)={nblocks}."
        )
    if blocks[0] < 1 or blocks[1] < 1:
        raise RuntimeError(
            f"{given}calculated shape of the array of sliding blocks as ({blocks[0]}, {blocks[1]}), which is too small "
            "(non-positive)"
        )
    _check_block_dtype(input, "col2im_out_cpu")
    shape = xs[:-2] + (cols // (k[0] * k[1]),) + out
    return FoldSpec((shape, input._dtype, input._device, k, d, p, s, blocks, out))


def _col2im_ref(spec, x, output_size, kernel_size, dilation, padding, stride):
    k, d, p, s, blocks, out = spec.kernel_size, spec.dilation, spec.padding, spec.stride, spec.blocks, spec.output_size
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    compute = _compute_np(spec.dtype) if spec.dtype is not dt.bool else np.dtype(np.int64)
    n = x.shape[0]
    c = x.shape[1] // (k[0] * k[1])
    cols = x.astype(compute, copy=False).reshape(n, c, k[0], k[1], blocks[0], blocks[1]).transpose(0, 1, 4, 5, 2, 3)
    r = _col2im(cols, s, d, p, out)
    r = (r != 0) if spec.dtype is dt.bool else r.astype(spec.dtype.numpy, copy=False)
    return np.ascontiguousarray(r if batched else r[0])


def _col2im_backward(grad, kernel_size, dilation, padding, stride):
    return im2col(grad, kernel_size, dilation, padding, stride)


@op(tags=("nn",), meta=_col2im_meta, reference=_col2im_ref, backward=_col2im_backward, grad_fn_name="Col2ImBackward0")
def col2im(
    input: Tensor,
    output_size: IntOrTuple,
    kernel_size: IntOrTuple,
    dilation: IntOrTuple,
    padding: IntOrTuple,
    stride: IntOrTuple,
) -> Tensor:
    """Sum ``(N, C * kh * kw, L)`` columns of sliding blocks into an ``(N, C, *output_size)`` image (what
    :func:`fold` computes; the adjoint of :func:`im2col`)."""


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Extract sliding local blocks (im2col): ``(N, C, H, W)`` to ``(N, C * prod(kernel_size), L)``."""
    return im2col(input, kernel_size, dilation, padding, stride)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks into an image (col2im), the adjoint of :func:`unfold`: ``(N, C * prod(kernel_size),
    L)`` to ``(N, C, *output_size)``; overlapping blocks add up."""
    return col2im(input, output_size, kernel_size, dilation, padding, stride)
