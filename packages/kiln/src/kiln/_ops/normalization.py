"""nn primitives: normalization (``batch_norm``, ``instance_norm``, ``layer_norm``, ``group_norm``,
``rms_norm``, ``normalize``, ``local_response_norm``; ``torch.nn.functional`` names).

Fused ops: ``_native_batch_norm``, ``_native_layer_norm``, ``_native_group_norm`` (one normalization
kernel and one backward formula shared by the three), with their backward a fused op too,
``_native_norm_backward`` (batch, layer and group norm: one op, one reference), whose reference computes
what the composite formula in kiln ops (``_norm_grads``) computes and whose own backward re-runs that
composite under autograd (:func:`kiln._ops.softmax._vjp_of_composite`).

The rest is composed of ops as PyTorch composes it on the CPU (so the autograd node names match):
``instance_norm`` (a batch norm of the ``(1, N*C, ...)`` view), ``rms_norm``, ``normalize`` and
``local_response_norm``.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import wrap_dim
from kiln._ops.elementwise import _compute_np
from kiln._ops.reduction import mean as _mean
from kiln._ops.reduction import sum as _sum
from kiln._ops.softmax import _HALF, _check_tensor, _require_float, _shape_list, _upcast, _vjp_of_composite
from kiln._spec import NormLayout, NormSpec, Spec
from kiln._tensor import Tensor, _numel

__all__ = ["batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm", "normalize", "local_response_norm"]

TOP_LEVEL = (
    "group_norm",
    "layer_norm",
    "rms_norm",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

_EPS = {
    dt.float16: 0.0009765625,
    dt.bfloat16: 0.0078125,
    dt.float32: 1.1920928955078125e-07,
    dt.float64: 2.220446049250313e-16,
}


# ---------------------------------------------------------------------------------------- normalization


def _channel_layout(shape: tuple) -> NormLayout:
    nd = len(shape)
    red = (0,) + tuple(range(2, nd))
    c = shape[1] if nd > 1 else 0
    return NormLayout(shape, red, (c,) + (1,) * (nd - 2), red, "batch")


def _layer_layout(shape: tuple, normalized_shape: tuple) -> NormLayout:
    nd, k = len(shape), len(normalized_shape)
    red = tuple(range(nd - k, nd))
    return NormLayout(shape, red, (1,) * (nd - k) + tuple(normalized_shape), tuple(range(nd - k)), "layer")


def _group_layout(shape: tuple, groups: int) -> NormLayout:
    nd = len(shape)
    per_group = shape[1] // groups * _numel(shape[2:])
    red = (0,) + tuple(range(2, nd))
    return NormLayout((shape[0], groups, per_group), (2,), (shape[1],) + (1,) * (nd - 2), red, "group")


def _param_shape(shape: tuple, lay: NormLayout) -> tuple:
    """The shape of the affine parameters' gradients: the input dims that are not summed over."""
    return tuple(n for i, n in enumerate(shape) if i not in lay.param_red)


def _norm_np(spec, x, weight, bias, mean, var, eps):
    """The shared normalization kernel: batch statistics (``mean is None``) or the given ones."""
    lay: NormLayout = spec.layout
    compute = _compute_np(spec.dtype)
    if x.size == 0:
        return np.empty(spec.shape, compute)
    xs = x.astype(compute, copy=False).reshape(lay.stats_shape)
    if mean is None:
        mu = np.mean(xs, axis=lay.red, keepdims=True)
        centered = xs - mu
        v = np.mean(np.square(centered), axis=lay.red, keepdims=True)
    else:
        centered = xs - mean.astype(compute, copy=False).reshape(lay.param_view)
        v = var.astype(compute, copy=False).reshape(lay.param_view)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (centered * (1 / np.sqrt(v + compute.type(eps)))).reshape(spec.shape)
    if weight is not None:
        y = y * weight.astype(compute, copy=False).reshape(lay.param_view)
    if bias is not None:
        y = y + bias.astype(compute, copy=False).reshape(lay.param_view)
    return y


def _norm_grads(grad, input, weight, mean, var, eps, lay: NormLayout, output_mask):
    """The shared normalization's gradients composed of kiln ops: (input, weight, bias), the parameters'
    in :func:`_param_shape` (None where ``output_mask`` is False, or without a weight). What
    ``_native_norm_backward`` computes; its double backward differentiates this."""
    from kiln._ops.scans import _var
    from kiln._ops.unary_math import rsqrt

    shape = input._shape
    grad, x, weight, mean, var = _upcast(grad, input, weight, mean, var)
    xs = x.reshape(lay.stats_shape)
    batch = mean is None
    if batch:
        mu = _mean(xs, lay.red, True)
        r = rsqrt(_var(xs, lay.red, 0, True) + eps)
    else:
        mu = mean.detach().reshape(lay.param_view).to(x.dtype)
        r = rsqrt(var.detach().reshape(lay.param_view).to(x.dtype) + eps)
    xhat = (xs - mu) * r
    gx = gw = gb = None
    if output_mask[0]:
        gy = grad if weight is None else grad * weight.reshape(lay.param_view)
        if batch:
            gs = gy.reshape(lay.stats_shape)
            gx = (r * (gs - _mean(gs, lay.red, True) - xhat * _mean(gs * xhat, lay.red, True))).reshape(shape)
        else:
            gx = gy * r
    if weight is not None and output_mask[1]:
        prod = grad * xhat.reshape(shape)
        gw = _sum(prod, lay.param_red) if lay.param_red else prod
    if output_mask[2]:
        gb = _sum(grad, lay.param_red) if lay.param_red else grad
    return gx, gw, gb


def _var0_np(xs: np.ndarray, red: tuple, compute: np.dtype) -> np.ndarray:
    """The biased variance over ``red`` (kept dims) as kiln's ``_var`` reference computes it: the mean of
    the centred squares, exactly 0 for a constant slice."""
    n = math.prod(xs.shape[i] for i in red)
    m = np.mean(xs, axis=red, keepdims=True, dtype=compute)
    v = np.asarray(np.sum(np.square(xs - m), axis=red, keepdims=True, dtype=compute) / compute.type(n))
    same = np.max(xs, axis=red, keepdims=True) == np.min(xs, axis=red, keepdims=True)
    return np.where(same & ~np.isnan(v), np.zeros((), compute) * v, v)


_NORM_BACKWARD_NAMES = {
    "batch": "NativeBatchNormBackwardBackward0",
    "layer": "NativeLayerNormBackwardBackward0",
    "group": "NativeGroupNormBackwardBackward0",
}


def _norm_bwd_meta(grad, input, weight, mean, var, eps, layout, output_mask):
    _check_tensor(grad, "_native_norm_backward", "grad")
    _check_tensor(input, "_native_norm_backward", "input", 2)
    if grad._shape != input._shape:
        raise RuntimeError(
            f"_native_norm_backward: grad of shape {_shape_list(grad._shape)} does not match input of shape "
            f"{_shape_list(input._shape)}"
        )
    if (mean is None) != (var is None):
        raise RuntimeError("_native_norm_backward: mean and var are given together or not at all")
    if len(output_mask) != 3:
        raise RuntimeError(f"_native_norm_backward: output_mask must have 3 entries, got {len(output_mask)}")
    _require_float(input, "_native_norm_backward")
    dtype = dt.promote_types(grad._dtype, input._dtype)
    dtype = dt.float32 if dtype in _HALF else dtype
    pshape = _param_shape(input._shape, layout)
    dev = input._device
    return (
        Spec((input._shape if output_mask[0] else (0,), dtype, dev)),
        Spec((pshape if output_mask[1] and weight is not None else (0,), dtype, dev)),
        Spec((pshape if output_mask[2] else (0,), dtype, dev)),
    )


def _norm_bwd_ref(spec, grad, input, weight, mean, var, eps, lay, output_mask):
    """What :func:`_norm_grads` computes, in NumPy: the same operations in the same order."""
    compute = _compute_np(spec[0].dtype)
    shape = input.shape
    g = grad.astype(compute, copy=False)
    if input.size == 0:
        gx = np.empty(spec[0].shape, compute)
        gw = np.zeros(spec[1].shape, compute)
        gb = np.zeros(spec[2].shape, compute)
        return gx, gw, gb
    xs = input.astype(compute, copy=False).reshape(lay.stats_shape)
    if mean is None:
        mu = np.mean(xs, axis=lay.red, keepdims=True, dtype=compute)
        v = _var0_np(xs, lay.red, compute)
    else:
        mu = mean.astype(compute, copy=False).reshape(lay.param_view)
        v = var.astype(compute, copy=False).reshape(lay.param_view)
    r = np.divide(1, np.sqrt(v + compute.type(eps)), dtype=compute)
    xhat = (xs - mu) * r
    empty = np.zeros((0,), compute)
    gx = gw = gb = empty
    if output_mask[0]:
        gy = g if weight is None else g * weight.astype(compute, copy=False).reshape(lay.param_view)
        if mean is None:
            gs = gy.reshape(lay.stats_shape)
            m1 = np.mean(gs, axis=lay.red, keepdims=True, dtype=compute)
            m2 = np.mean(gs * xhat, axis=lay.red, keepdims=True, dtype=compute)
            gx = (r * (gs - m1 - xhat * m2)).reshape(shape)
        else:
            gx = gy * r
    # no dim to sum over (a layer norm over every dim): the products themselves, as the composite
    if output_mask[1] and weight is not None:
        prod = g * xhat.reshape(shape)
        gw = np.sum(prod, axis=lay.param_red, dtype=compute) if lay.param_red else prod
    if output_mask[2]:
        gb = np.sum(g, axis=lay.param_red, dtype=compute) if lay.param_red else np.array(g, copy=True)
    return gx, gw.reshape(spec[1].shape), gb.reshape(spec[2].shape)


def _norm_bwd_backward(grads, grad, input, weight, mean, var, eps, layout, output_mask, needs_input_grad):
    def formula(g, x, w):
        return _norm_grads(g, x, w, mean, var, eps, layout, output_mask)

    got = _vjp_of_composite(formula, (grad, input, weight), grads, needs_input_grad[:3])
    return (*got, None, None)


def _native_norm_backward_decomposed(grad, input, weight, mean, var, eps, layout, output_mask):
    """``_native_norm_backward`` in kiln ops: the composite :func:`_norm_grads`, with an empty ``(0,)``
    tensor for each output it does not compute (zeros for the parameters of an empty input)."""
    from kiln._ops.creation import zeros

    specs = _norm_bwd_meta(grad, input, weight, mean, var, eps, layout, output_mask)
    if _numel(input._shape) == 0:
        return tuple(zeros(s[0], dtype=s[1], device=s[2]) for s in specs)
    outs = _norm_grads(grad, input, weight, mean, var, eps, layout, output_mask)
    return tuple(zeros(s[0], dtype=s[1], device=s[2]) if o is None else o.to(s[1]) for o, s in zip(outs, specs))


@op(
    decompose=_native_norm_backward_decomposed,
    tags=("nn", "backward", "fused"),
    meta=_norm_bwd_meta,
    reference=_norm_bwd_ref,
    backward=_norm_bwd_backward,
    num_outputs=3,
    grad_fn_name=lambda args: _NORM_BACKWARD_NAMES[args[6].kind],
)
def _native_norm_backward(
    grad: Tensor,
    input: Tensor,
    weight: Tensor | None,
    mean: Tensor | None,
    var: Tensor | None,
    eps: float,
    layout: tuple,
    output_mask: tuple,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of batch, layer and group norm (one op for the three, told apart by ``layout``, a
    ``NormLayout``): (input, weight, bias) for output gradient ``grad``. Statistics of the input
    (``mean``/``var`` None) or the given ones (batch norm in eval mode); the parameters' gradients have
    the shape of the dims not summed over. An output whose ``output_mask`` entry is False (and the weight's
    without a ``weight``) is an empty ``(0,)`` tensor. Half precision is computed and returned in float32."""


def _norm_backward(grad, input, weight, bias, mean, var, eps, lay: NormLayout, needs_input_grad):
    """The backward formula of the three norm ops: :func:`_native_norm_backward` for the gradients asked for,
    the parameters' reshaped to the parameters' own shapes."""
    mask = (
        bool(needs_input_grad[0]),
        weight is not None and bool(needs_input_grad[1]),
        bias is not None and bool(needs_input_grad[2]),
    )
    if not any(mask):
        return None, None, None
    gx, gw, gb = _native_norm_backward(grad, input, weight, mean, var, eps, lay, mask)

    def fit(g, p):
        return g if g._shape == p._shape else g.reshape(p._shape)

    return gx if mask[0] else None, fit(gw, weight) if mask[1] else None, fit(gb, bias) if mask[2] else None


def _check_mixed(input: Tensor, *params) -> None:
    """PyTorch's CPU rule: parameters share the input's dtype, or are float32 for a half input."""
    ds = [p._dtype for p in params if p is not None]
    if all(d is input._dtype for d in ds):
        return
    if input._dtype in _HALF and all(d is dt.float32 for d in ds):
        return
    if input._dtype is dt.float32 or input._dtype in _HALF:
        raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")
    raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")


def _param_checks(op_name: str, tensors) -> None:
    """Optional tensor arguments: None or a Tensor."""
    for position, (name, t) in tensors:
        if t is not None:
            _check_tensor(t, op_name, name, position)


# batch norm


def _batch_norm_meta(input, weight, bias, running_mean, running_var, training, eps):
    _check_tensor(input, "batch_norm")
    _param_checks(
        "batch_norm",
        (
            (2, ("weight", weight)),
            (3, ("bias", bias)),
            (4, ("running_mean", running_mean)),
            (5, ("running_var", running_var)),
        ),
    )
    shape = input._shape
    c = shape[wrap_dim(1, len(shape))]  # PyTorch's error for input without a channel dim
    if not training:
        for name, t in (("running_mean", running_mean), ("running_var", running_var)):
            if t is None:
                raise RuntimeError(f"{name} must be defined in evaluation mode")
    # PyTorch checks the running statistics' sizes before the affine parameters'
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and _numel(t._shape) != c:
            raise RuntimeError(f"{name} should contain {c} elements not {_numel(t._shape)}")
    _require_float(input, "batch_norm")
    _check_mixed(input, weight, bias, running_mean, running_var)
    return NormSpec((shape, input._dtype, input._device, _channel_layout(shape)))


def _batch_norm_ref(spec, input, weight, bias, running_mean, running_var, training, eps):
    if training:
        return _norm_np(spec, input, weight, bias, None, None, eps)
    return _norm_np(spec, input, weight, bias, running_mean, running_var, eps)


def _batch_norm_backward(grad, input, weight, bias, running_mean, running_var, training, eps, needs_input_grad):
    lay = _channel_layout(input._shape)
    stats = (None, None) if training else (running_mean, running_var)
    gx, gw, gb = _norm_backward(grad, input, weight, bias, *stats, eps, lay, needs_input_grad)
    return gx, gw, gb, None, None


def _norm_decomposed(spec, input, weight, bias, mean, var, eps):
    """:func:`_norm_np` in kiln ops: ``(x - mean) * (1 / sqrt(var + eps))`` over the layout's statistics
    (the batch's, biased, when ``mean`` is None), then the affine (half precision in float32)."""
    from kiln._ops.creation import empty
    from kiln._ops.elementwise import sqrt
    from kiln._ops.unary_math import reciprocal

    shape, dtype, device, lay = spec[0], spec[1], spec[2], spec[3]
    if _numel(input._shape) == 0:
        return empty(shape, dtype=dtype, device=device)
    compute = dt.float32 if dtype in _HALF else dtype
    xs = input.to(compute).reshape(lay.stats_shape)
    if mean is None:
        centered = xs - _mean(xs, lay.red, True)
        v = _mean(centered * centered, lay.red, True)
    else:
        centered = xs - mean.to(compute).reshape(lay.param_view)
        v = var.to(compute).reshape(lay.param_view)
    y = (centered * reciprocal(sqrt(v + eps))).reshape(shape)
    if weight is not None:
        y = y * weight.to(compute).reshape(lay.param_view)
    if bias is not None:
        y = y + bias.to(compute).reshape(lay.param_view)
    return y.to(dtype)


def _native_batch_norm_decomposed(input, weight, bias, running_mean, running_var, training, eps):
    """``_native_batch_norm`` in kiln ops (:func:`_norm_decomposed`)."""
    spec = _batch_norm_meta(input, weight, bias, running_mean, running_var, training, eps)
    stats = (None, None) if training else (running_mean, running_var)
    return _norm_decomposed(spec, input, weight, bias, *stats, eps)


@op(
    decompose=_native_batch_norm_decomposed,
    tags=("nn", "fused"),
    meta=_batch_norm_meta,
    reference=_batch_norm_ref,
    backward=_batch_norm_backward,
    grad_fn_name="NativeBatchNormBackward0",
)
def _native_batch_norm(
    input: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    eps: float,
) -> Tensor:
    """Batch normalization over every dim but 1: batch statistics (``training``) or the running ones."""


def _bn_stats_meta(input):
    _check_tensor(input, "_batch_norm_stats")
    if len(input._shape) < 2:
        raise RuntimeError(f"_batch_norm_stats: expected an input with a channel dim, got {len(input._shape)} dims")
    _require_float(input, "_batch_norm_stats")
    spec = Spec(((input._shape[1],), dt.float32 if input._dtype in _HALF else input._dtype, input._device))
    return (spec, spec)


def _bn_stats_ref(spec, input):
    """As ``_mean(x, red)`` and ``_var(x, red, 1)`` compute them (kiln's reference kernels)."""
    compute = _compute_np(spec[0].dtype)
    x = input.astype(compute, copy=False)
    red = (0,) + tuple(range(2, x.ndim))
    c = spec[0].shape
    if x.size == 0:
        return np.full(c, np.nan, compute), np.full(c, np.nan, compute)
    n = x.size // max(c[0], 1)
    mean = np.mean(x, axis=red, dtype=compute)
    m = np.mean(x, axis=red, keepdims=True, dtype=compute)
    var = np.asarray(np.sum(np.square(x - m), axis=red, dtype=compute) / compute.type(max(n - 1, 0)))
    same = np.max(x, axis=red) == np.min(x, axis=red)
    return mean, np.where(same & ~np.isnan(var), np.zeros((), compute) * var, var)


def _batch_norm_stats_decomposed(input):
    """``_batch_norm_stats`` in kiln ops: ``_mean`` and ``_var`` (correction 1) over every dim but 1."""
    from kiln._ops.scans import _var

    dtype = _bn_stats_meta(input)[0][1]
    x = input.to(dtype)
    red = (0,) + tuple(range(2, x.dim()))
    return _mean(x, red), _var(x, red, 1)


@op(
    decompose=_batch_norm_stats_decomposed,
    tags=("nn", "fused"),
    meta=_bn_stats_meta,
    reference=_bn_stats_ref,
    num_outputs=2,
)
def _batch_norm_stats(input: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (mean, unbiased variance) of an ``(N, C, *)`` input over every dim but 1, as ``mean`` and
    ``var`` compute them (half precision in float32): the batch statistics that batch norm's running
    statistics take in (no autograd)."""


def _batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, unbiased variance) per channel (no autograd), in float32 at least."""
    return _batch_norm_stats(x)


def _update_running(running: Tensor | None, value: Tensor, momentum: float) -> None:
    if running is not None:
        running.copy_(running * (1 - momentum) + value.to(running.dtype) * momentum)


def _size_text(shape) -> str:
    from kiln._tensor import Size

    return str(Size(shape))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Batch normalization of ``(N, C, *)`` input per channel; in training, uses batch statistics and
    updates ``running_mean``/``running_var`` in place (unbiased variance), as ``torch.nn.functional``."""
    from kiln.autograd.grad_mode import no_grad

    _check_tensor(input, "batch_norm")
    if not isinstance(momentum, (int, float)):
        raise TypeError(f"batch_norm(): argument 'momentum' (position 7) must be float, not {type(momentum).__name__}")
    if training:
        shape = input._shape
        if len(shape) >= 1 and shape[0] * _numel(shape[2:]) == 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {_size_text(shape)}"
            )
        # validated here: the op does not see the statistics it does not read (they change in place below,
        # after autograd would have saved them)
        _batch_norm_meta(input, weight, bias, running_mean, running_var, training, eps)
        out = _native_batch_norm(input, weight, bias, None, None, training, eps)
    else:
        out = _native_batch_norm(input, weight, bias, running_mean, running_var, training, eps)
    if training and (running_mean is not None or running_var is not None) and _numel(input._shape):
        with no_grad():
            m, v = _batch_stats(input.detach())
            _update_running(running_mean, m, momentum)
            _update_running(running_var, v, momentum)
    return out


def instance_norm(
    input,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats=True,
    momentum=0.1,
    eps=1e-5,
):
    """Normalization of each sample's channels over their spatial dims (batch norm of the ``(1, N*C, *)``
    view); running statistics, when given, are averaged over the batch and updated in place."""
    from kiln.autograd.grad_mode import no_grad

    _check_tensor(input, "instance_norm")
    shape = input._shape
    if use_input_stats and len(shape) >= 2 and _numel(shape[2:]) == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {_size_text(shape)}")
    if not use_input_stats and (running_mean is None or running_var is None):
        raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
    n, c = shape[0], shape[1]

    def rep(t):
        return None if t is None else t.repeat(n)

    view = (1, n * c) + shape[2:]
    out = _native_batch_norm(
        input.reshape(view), rep(weight), rep(bias), rep(running_mean), rep(running_var), use_input_stats, eps
    )
    if use_input_stats and (running_mean is not None or running_var is not None) and _numel(shape):
        with no_grad():
            m, v = _batch_stats(input.detach().reshape(view))
            _update_running(running_mean, _mean(m.reshape(n, c), 0), momentum)
            _update_running(running_var, _mean(v.reshape(n, c), 0), momentum)
    return out.view(shape)


# layer norm


def _layer_norm_checks(name, input, normalized_shape, weight, bias, star: str) -> tuple:
    _check_tensor(input, name)
    if not isinstance(normalized_shape, (tuple, list)) and not hasattr(normalized_shape, "__len__"):
        raise TypeError(
            f"{name}(): argument 'normalized_shape' (position 2) must be tuple of ints, not "
            f"{type(normalized_shape).__name__}"
        )
    ns = tuple(int(s) for s in normalized_shape)
    if not ns:
        raise RuntimeError(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, "
            "but got normalized_shape = []"
        )
    _param_checks(name, ((3, ("weight", weight)), (4, ("bias", bias))))
    for pname, t in (("weight", weight), ("bias", bias)):
        if t is not None and t._shape != ns:
            raise RuntimeError(
                f"Expected {pname} to be of same shape as normalized_shape, but got {pname} of shape "
                f"{_shape_list(t._shape)} and normalized_shape = {_shape_list(ns)}"
            )
    shape = input._shape
    if len(shape) < len(ns) or shape[len(shape) - len(ns) :] != ns:
        raise RuntimeError(
            f"Given normalized_shape={_shape_list(ns)}, expected input with shape "
            f"[*{star}{', '.join(str(s) for s in ns)}], but got input of size{_shape_list(shape)}"
        )
    return ns


def _layer_norm_meta(input, normalized_shape, weight, bias, eps):
    ns = _layer_norm_checks("layer_norm", input, normalized_shape, weight, bias, ", ")
    _require_float(input, "LayerNormKernelImpl")
    _check_mixed(input, weight, bias)
    return NormSpec((input._shape, input._dtype, input._device, _layer_layout(input._shape, ns)))


def _layer_norm_ref(spec, input, normalized_shape, weight, bias, eps):
    return _norm_np(spec, input, weight, bias, None, None, eps)


def _layer_norm_backward(grad, input, normalized_shape, weight, bias, eps, needs_input_grad):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return _norm_backward(grad, input, weight, bias, None, None, eps, _layer_layout(input._shape, ns), needs_input_grad)


def _native_layer_norm_decomposed(input, normalized_shape, weight, bias, eps):
    """``_native_layer_norm`` in kiln ops (:func:`_norm_decomposed`)."""
    spec = _layer_norm_meta(input, normalized_shape, weight, bias, eps)
    return _norm_decomposed(spec, input, weight, bias, None, None, eps)


@op(
    decompose=_native_layer_norm_decomposed,
    tags=("nn", "fused"),
    meta=_layer_norm_meta,
    reference=_layer_norm_ref,
    backward=_layer_norm_backward,
    autocast="fp32_float16",
    grad_fn_name="NativeLayerNormBackward0",
)
def _native_layer_norm(
    input: Tensor, normalized_shape: tuple, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """Layer normalization over the trailing ``normalized_shape`` dims, then the elementwise affine."""


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalize over the last ``len(normalized_shape)`` dims (biased variance), then scale by ``weight``
    and shift by ``bias`` (each of shape ``normalized_shape``)."""
    ns = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else normalized_shape
    return _native_layer_norm(input, ns, weight, bias, eps)


# group norm


def _group_norm_meta(input, num_groups, weight, bias, eps):
    _check_tensor(input, "group_norm")
    shape = input._shape
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {len(shape)}")
    _param_checks("group_norm", ((3, ("weight", weight)), (4, ("bias", bias))))
    c = shape[1]
    if num_groups <= 0:
        raise RuntimeError(f"Expected num groups to be greater than 0, got {num_groups}")
    if c % num_groups:
        raise RuntimeError(
            "Expected number of channels in input to be divisible by num_groups, but got input of shape "
            f"{_shape_list(shape)} and num_groups={num_groups}"
        )
    for pname, t in (("weight", weight), ("bias", bias)):
        if t is not None and (len(t._shape) != 1 or t._shape[0] != c):
            # PyTorch's message shows the weight's shape (``[0]`` when there is none) for both parameters
            shown = weight._shape if weight is not None else (0,)
            raise RuntimeError(
                f"Expected {pname} to be a vector of size equal to the number of channels in input, but got "
                f"{pname} of shape {_shape_list(shown)} and input of shape {_shape_list(shape)}"
            )
    _require_float(input, "GroupNormKernelImpl")
    _check_mixed(input, weight, bias)
    return NormSpec((shape, input._dtype, input._device, _group_layout(shape, num_groups)))


def _group_norm_ref(spec, input, num_groups, weight, bias, eps):
    return _norm_np(spec, input, weight, bias, None, None, eps)


def _group_norm_backward(grad, input, num_groups, weight, bias, eps, needs_input_grad):
    lay = _group_layout(input._shape, num_groups)
    return _norm_backward(grad, input, weight, bias, None, None, eps, lay, needs_input_grad)


def _native_group_norm_decomposed(input, num_groups, weight, bias, eps):
    """``_native_group_norm`` in kiln ops (:func:`_norm_decomposed`)."""
    spec = _group_norm_meta(input, num_groups, weight, bias, eps)
    return _norm_decomposed(spec, input, weight, bias, None, None, eps)


@op(
    decompose=_native_group_norm_decomposed,
    tags=("nn", "fused"),
    meta=_group_norm_meta,
    reference=_group_norm_ref,
    backward=_group_norm_backward,
    autocast="fp32_float16",
    grad_fn_name="NativeGroupNormBackward0",
)
def _native_group_norm(
    input: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """Group normalization: channels split into ``num_groups`` groups, each normalized per sample."""


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalize each sample over groups of ``C // num_groups`` channels (and the spatial dims), then apply
    the per-channel ``weight`` and ``bias``."""
    _check_tensor(input, "group_norm")
    shape = input._shape
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {len(shape)}")
    if num_groups == 0:
        raise ZeroDivisionError("integer division or modulo by zero")
    if isinstance(num_groups, int) and num_groups > 0:
        # torch.nn.functional checks the (N * C // groups, groups, *spatial) view: more than one value per group
        view = [shape[0] * shape[1] // num_groups, num_groups, *shape[2:]]
        if view[0] * _numel(tuple(view[2:])) == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {view}")
    return _native_group_norm(input, num_groups, weight, bias, eps)


# rms norm, normalize


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """Divide by the root mean square over the trailing ``normalized_shape`` dims (plus ``eps``, by default
    the dtype's machine epsilon), then scale by ``weight``."""
    from kiln._ops.unary_math import rsqrt

    ns = _layer_norm_checks("rms_norm", input, normalized_shape, weight, None, "")
    _require_float(input, "rms_norm")
    x = input.to(dt.float32) if input._dtype in _HALF else input
    if eps is None:
        eps = _EPS[input._dtype]
    dims = tuple(range(len(input._shape) - len(ns), len(input._shape)))
    out = x * rsqrt(_mean(x * x, dims, True) + eps)
    if weight is not None:
        out = out * weight
    out = out.to(input.dtype) if out.dtype is not input.dtype else out
    return out.contiguous()  # as PyTorch's composite (a CloneBackward0 node for non-contiguous input)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """``input / max(||input||_p, eps)`` along ``dim``."""
    from kiln._ops.clamp import clamp_min

    _check_tensor(input, "normalize")
    denom = clamp_min(input.norm(p, dim, keepdim=True), eps).expand_as(input)
    if out is not None:
        return out.copy_(input / denom)
    return input / denom


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """Divide by ``(k + alpha * mean of the squares over a window of `size` neighbouring channels) ** beta``
    (the window is zero-padded at the channel edges)."""
    from kiln._ops.shape import cat

    _check_tensor(input, "local_response_norm")
    nd = input.dim()
    if nd < 3:
        raise ValueError(f"Expected 3D or higher dimensionality                          input (got {nd} dimensions)")
    if _numel(input._shape) == 0:
        return input
    sq = input * input
    c = input._shape[1]
    before, after = size // 2, (size - 1) // 2
    parts = [sq.new_zeros((input._shape[0], before) + input._shape[2:])] if before else []
    parts.append(sq)
    if after:
        parts.append(sq.new_zeros((input._shape[0], after) + input._shape[2:]))
    padded = cat(parts, 1) if len(parts) > 1 else sq
    window = padded.narrow(1, 0, c)
    for offset in range(1, size):  # one shifted slice per window offset, not per element
        window = window + padded.narrow(1, offset, c)
    div = (window * (alpha / size) + k) ** beta
    return input / div
