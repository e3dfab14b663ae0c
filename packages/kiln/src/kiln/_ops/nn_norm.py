"""nn primitives: the softmax family, normalization, embedding and dropout (``torch.nn.functional`` names).

Fused ops (each with a NumPy reference and a backward formula written in kiln ops, so higher-order
gradients work): ``_softmax`` / ``_log_softmax`` (``SoftmaxBackward0`` / ``LogSoftmaxBackward0``),
``_native_batch_norm``, ``_native_layer_norm``, ``_native_group_norm`` (one normalization kernel and
one backward formula shared by the three), ``_embedding`` (``EmbeddingBackward0``) and
``_embedding_bag`` (``EmbeddingBagBackward0``).

Their backward passes are fused ops too, as in PyTorch: ``_softmax_backward_data``,
``_log_softmax_backward_data`` and ``_native_norm_backward`` (batch, layer and group norm: one op, one
reference); a backend accelerates a training step by giving each a kernel. Each reference computes what
the composite formula in kiln ops (``_softmax_backward``, ``_log_softmax_backward``, ``_norm_grads``)
computes; their own backward (double backward) re-runs that composite under autograd
(:func:`_vjp_of_composite`), so gradients of any order need no hand-written derivative.

The rest is composed of ops as PyTorch composes it on the CPU (so the autograd node names match):
``softmin``, ``instance_norm`` (a batch norm of the ``(1, N*C, ...)`` view), ``rms_norm``,
``normalize``, ``local_response_norm`` and the dropout family, whose masks are drawn from kiln's default
generator of the input's device (``kiln.manual_seed`` makes them reproducible) once in forward and saved
by the product for backward.

Sparse gradients do not exist in kiln: ``sparse=True`` is accepted and the gradient is dense.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import NamedTuple

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name, wrap_dim
from kiln._ops.elementwise import _compute_np, exp, where
from kiln._ops.reduction import mean as _mean
from kiln._ops.reduction import sum as _sum
from kiln._state import state
from kiln._tensor import Tensor, _numel

__all__ = [
    "softmax",
    "log_softmax",
    "softmin",
    "batch_norm",
    "layer_norm",
    "group_norm",
    "instance_norm",
    "rms_norm",
    "normalize",
    "local_response_norm",
    "embedding",
    "embedding_bag",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
]

_HALF = (dt.float16, dt.bfloat16)
_EPS = {
    dt.float16: 0.0009765625,
    dt.bfloat16: 0.0078125,
    dt.float32: 1.1920928955078125e-07,
    dt.float64: 2.220446049250313e-16,
}


def _check_tensor(x, name: str, arg: str = "input", position: int = 1) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not {type(x).__name__}")


def _require_float(x: Tensor, kernel: str) -> None:
    if not x._dtype.is_floating_point:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(x._dtype)}'")


def _shape_list(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


# ---------------------------------------------------------------------------------------- softmax family


def _softmax_meta(name: str):
    def meta(input, dim):
        _check_tensor(input, name)
        nd = len(input._shape)
        d = wrap_dim(dim, nd)
        if not input._dtype.is_floating_point:
            last = nd == 0 or d == nd - 1
            kernel = f"{name}_lastdim_kernel_impl" if last else f"{name}_kernel_impl"
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(input._dtype)}'")
        return (input._shape, input._dtype, input._device, d)

    return meta


def _softmax_ref(log: bool):
    def ref(spec, a, dim):
        compute = _compute_np(spec[1])
        x = a.astype(compute, copy=False)
        if x.ndim == 0:
            x = x.reshape(1)
        axis = spec[3] if a.ndim else 0
        if x.size == 0:
            return np.empty(spec[0], compute)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            # subtracting the max keeps exp in range; an all -inf row gives NaN, as in PyTorch
            z = x - np.max(x, axis=axis, keepdims=True)
            e = np.exp(z)
            s = np.sum(e, axis=axis, keepdims=True)
            r = z - np.log(s) if log else e / s
        return r.reshape(spec[0])

    return ref


def _upcast(*tensors):
    """Half-precision tensors in float32 (backward formulas compute as PyTorch's kernels do; the engine
    casts the gradients back to the inputs' dtypes)."""
    return tuple(t.to(dt.float32) if t is not None and t._dtype in _HALF else t for t in tensors)


def _softmax_backward(grad, dim, result):
    """Softmax's gradient composed of kiln ops: ``y * (g - sum(g * y))`` (what ``_softmax_backward_data``
    computes; its double backward differentiates this)."""
    d = wrap_dim(dim, len(result._shape))
    grad, result = _upcast(grad, result)
    return result * (grad - _sum(grad * result, d, True))


def _log_softmax_backward(grad, dim, result):
    """Log-softmax's gradient composed of kiln ops: ``g - exp(y) * sum(g)``."""
    d = wrap_dim(dim, len(result._shape))
    grad, result = _upcast(grad, result)
    return grad - exp(result) * _sum(grad, d, True)


def _vjp_of_composite(formula, inputs: tuple, cotangents: tuple, needs: tuple) -> tuple:
    """The backward of a fused backward op: gradients of ``formula(*inputs)`` (a tensor, or a tuple of
    tensors with None for outputs it does not compute) with respect to the ``inputs`` flagged in ``needs``,
    given ``cotangents`` (one per output). The composite that the fused op computes in one kernel is re-run
    in kiln ops with grad mode on and differentiated by the engine, which is re-entrant (this runs inside a
    node's backward), so gradients of every order work without a hand-written second derivative.

    When a graph is being built (``create_graph``), an input that requires grad enters through an alias
    (a view) that keeps its history: the result then depends on the inputs' own history, so the next order
    is right too. Otherwise every input is a detached leaf and the result is a plain tensor."""
    from kiln.autograd import grad as autograd_grad
    from kiln.autograd.grad_mode import enable_grad

    create = state.grad_enabled
    xs: list = []
    targets: list[int] = []
    with enable_grad():
        for t, need in zip(inputs, needs):
            if t is None or not need:
                xs.append(None if t is None else t.detach())
                continue
            targets.append(len(xs))
            xs.append(t.view_as(t) if create and t._requires_grad else t.detach().requires_grad_(True))
        outs = formula(*xs) if targets else ()
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [(o, c) for o, c in zip(outs, cotangents) if o is not None and c is not None and o._requires_grad]
    result: list = [None] * len(inputs)
    if pairs:
        got = autograd_grad(
            [o for o, _ in pairs],
            [xs[i] for i in targets],
            [c for _, c in pairs],
            create_graph=create,
            allow_unused=True,
        )
        for i, g in zip(targets, got):
            result[i] = g
    return tuple(result)


def _softmax_bwd_meta(name: str):
    def meta(grad_output, output, dim):
        _check_tensor(grad_output, name, "grad_output")
        _check_tensor(output, name, "output", 2)
        if grad_output._shape != output._shape:
            raise RuntimeError(
                f"{name}: grad_output of shape {_shape_list(grad_output._shape)} does not match output of shape "
                f"{_shape_list(output._shape)}"
            )
        d = wrap_dim(dim, len(output._shape))
        dtype = dt.promote_types(grad_output._dtype, output._dtype)
        _require_float(output, name)
        return (output._shape, dt.float32 if dtype in _HALF else dtype, output._device, d)

    return meta


def _softmax_bwd_ref(log: bool):
    def ref(spec, grad_output, output, dim):
        compute = _compute_np(spec[1])
        g = grad_output.astype(compute, copy=False)
        y = output.astype(compute, copy=False)
        axis = spec[3]
        if y.ndim == 0:
            g, y, axis = g.reshape(1), y.reshape(1), 0
        if log:
            r = g - np.exp(y) * np.sum(g, axis=axis, keepdims=True, dtype=compute)
        else:
            r = y * (g - np.sum(g * y, axis=axis, keepdims=True, dtype=compute))
        return r.reshape(spec[0])

    return ref


def _softmax_bwd_backward(grad, grad_output, output, dim, needs_input_grad):
    return _vjp_of_composite(
        lambda g, y: _softmax_backward(g, dim, y), (grad_output, output), (grad,), needs_input_grad
    )


def _log_softmax_bwd_backward(grad, grad_output, output, dim, needs_input_grad):
    return _vjp_of_composite(
        lambda g, y: _log_softmax_backward(g, dim, y), (grad_output, output), (grad,), needs_input_grad
    )


@op(
    meta=_softmax_bwd_meta("_softmax_backward_data"),
    reference=_softmax_bwd_ref(False),
    backward=_softmax_bwd_backward,
    grad_fn_name="SoftmaxBackwardDataBackward0",
)
def _softmax_backward_data(grad_output: Tensor, output: Tensor, dim: int) -> Tensor:
    """Softmax's input gradient from its ``output`` ``y``: ``y * (grad_output - sum(grad_output * y))``
    along ``dim`` (half precision computed and returned in float32)."""


@op(
    meta=_softmax_bwd_meta("_log_softmax_backward_data"),
    reference=_softmax_bwd_ref(True),
    backward=_log_softmax_bwd_backward,
    grad_fn_name="LogSoftmaxBackwardDataBackward0",
)
def _log_softmax_backward_data(grad_output: Tensor, output: Tensor, dim: int) -> Tensor:
    """Log-softmax's input gradient from its ``output`` ``y``: ``grad_output - exp(y) * sum(grad_output)``
    along ``dim`` (half precision computed and returned in float32)."""


def _softmax_grad(grad, dim, result):
    return _softmax_backward_data(grad, result, dim)


def _log_softmax_grad(grad, dim, result):
    return _log_softmax_backward_data(grad, result, dim)


@op(
    meta=_softmax_meta("softmax"),
    reference=_softmax_ref(False),
    backward=_softmax_grad,
    autocast="fp32",
    grad_fn_name="SoftmaxBackward0",
)
def _softmax(input: Tensor, dim: int) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``, computed stably (the max is subtracted first)."""


@op(
    meta=_softmax_meta("log_softmax"),
    reference=_softmax_ref(True),
    backward=_log_softmax_grad,
    autocast="fp32",
    grad_fn_name="LogSoftmaxBackward0",
)
def _log_softmax(input: Tensor, dim: int) -> Tensor:
    """``x - log(sum(exp(x)))`` along ``dim``, computed stably."""


def _implicit_dim(name: str, ndim: int, stacklevel: int) -> int:
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        UserWarning,
        stacklevel=stacklevel,
    )
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_input(name, input, dim, stacklevel, dtype):
    _check_tensor(input, name)
    if dim is None:
        dim = _implicit_dim(name, len(input._shape), stacklevel + 1)
    return (input if dtype is None else input.to(dtype)), dim


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Softmax along ``dim`` (``dtype``: cast the input first); rows sum to 1."""
    x, dim = _softmax_input("softmax", input, dim, _stacklevel, dtype)
    return _softmax(x, dim)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Logarithm of the softmax along ``dim``, computed stably (``dtype``: cast the input first)."""
    x, dim = _softmax_input("log_softmax", input, dim, _stacklevel, dtype)
    return _log_softmax(x, dim)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """Softmax of ``-input`` along ``dim``: small values get large weights."""
    x, dim = _softmax_input("softmin", input, dim, _stacklevel, dtype)
    return _softmax(-x, dim)


def _tensor_softmax(self, dim, dtype=None):
    """Softmax along ``dim`` (``torch.softmax`` / ``Tensor.softmax``)."""
    return _softmax(self if dtype is None else self.to(dtype), dim)


def _tensor_log_softmax(self, dim, dtype=None):
    """Log-softmax along ``dim`` (``torch.log_softmax`` / ``Tensor.log_softmax``)."""
    return _log_softmax(self if dtype is None else self.to(dtype), dim)


Tensor.softmax = _tensor_softmax
Tensor.log_softmax = _tensor_log_softmax


# ---------------------------------------------------------------------------------------- normalization


class _Layout(NamedTuple):
    """How one normalization sees its input: statistics over ``red`` of the input viewed as
    ``stats_shape``; affine parameters viewed as ``param_view`` (broadcast against the input), their
    gradients summed over the input dims ``param_red``; ``kind``: "batch", "layer" or "group"."""

    stats_shape: tuple
    red: tuple
    param_view: tuple
    param_red: tuple
    kind: str = "batch"


def _channel_layout(shape: tuple) -> _Layout:
    nd = len(shape)
    red = (0,) + tuple(range(2, nd))
    c = shape[1] if nd > 1 else 0
    return _Layout(shape, red, (c,) + (1,) * (nd - 2), red, "batch")


def _layer_layout(shape: tuple, normalized_shape: tuple) -> _Layout:
    nd, k = len(shape), len(normalized_shape)
    red = tuple(range(nd - k, nd))
    return _Layout(shape, red, (1,) * (nd - k) + tuple(normalized_shape), tuple(range(nd - k)), "layer")


def _group_layout(shape: tuple, groups: int) -> _Layout:
    nd = len(shape)
    per_group = shape[1] // groups * _numel(shape[2:])
    red = (0,) + tuple(range(2, nd))
    return _Layout((shape[0], groups, per_group), (2,), (shape[1],) + (1,) * (nd - 2), red, "group")


def _param_shape(shape: tuple, lay: _Layout) -> tuple:
    """The shape of the affine parameters' gradients: the input dims that are not summed over."""
    return tuple(n for i, n in enumerate(shape) if i not in lay.param_red)


def _norm_np(spec, x, weight, bias, mean, var, eps):
    """The shared normalization kernel: batch statistics (``mean is None``) or the given ones."""
    lay: _Layout = spec[3]
    compute = _compute_np(spec[1])
    if x.size == 0:
        return np.empty(spec[0], compute)
    xs = x.astype(compute, copy=False).reshape(lay.stats_shape)
    if mean is None:
        mu = np.mean(xs, axis=lay.red, keepdims=True)
        centered = xs - mu
        v = np.mean(np.square(centered), axis=lay.red, keepdims=True)
    else:
        centered = xs - mean.astype(compute, copy=False).reshape(lay.param_view)
        v = var.astype(compute, copy=False).reshape(lay.param_view)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (centered * (1 / np.sqrt(v + compute.type(eps)))).reshape(spec[0])
    if weight is not None:
        y = y * weight.astype(compute, copy=False).reshape(lay.param_view)
    if bias is not None:
        y = y + bias.astype(compute, copy=False).reshape(lay.param_view)
    return y


def _norm_grads(grad, input, weight, mean, var, eps, lay: _Layout, output_mask):
    """The shared normalization's gradients composed of kiln ops: (input, weight, bias), the parameters'
    in :func:`_param_shape` (None where ``output_mask`` is False, or without a weight). What
    ``_native_norm_backward`` computes; its double backward differentiates this."""
    from kiln._ops.math import rsqrt
    from kiln._ops.scans import _var

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
        (input._shape if output_mask[0] else (0,), dtype, dev),
        (pshape if output_mask[1] and weight is not None else (0,), dtype, dev),
        (pshape if output_mask[2] else (0,), dtype, dev),
    )


def _norm_bwd_ref(spec, grad, input, weight, mean, var, eps, lay, output_mask):
    """What :func:`_norm_grads` computes, in NumPy: the same operations in the same order."""
    compute = _compute_np(spec[0][1])
    shape = input.shape
    g = grad.astype(compute, copy=False)
    if input.size == 0:
        gx = np.empty(spec[0][0], compute)
        gw = np.zeros(spec[1][0], compute)
        gb = np.zeros(spec[2][0], compute)
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
    return gx, gw.reshape(spec[1][0]), gb.reshape(spec[2][0])


def _norm_bwd_backward(grads, grad, input, weight, mean, var, eps, layout, output_mask, needs_input_grad):
    def formula(g, x, w):
        return _norm_grads(g, x, w, mean, var, eps, layout, output_mask)

    got = _vjp_of_composite(formula, (grad, input, weight), grads, needs_input_grad[:3])
    return (*got, None, None)


@op(
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
    ``_Layout``): (input, weight, bias) for output gradient ``grad``. Statistics of the input
    (``mean``/``var`` None) or the given ones (batch norm in eval mode); the parameters' gradients have
    the shape of the dims not summed over. An output whose ``output_mask`` entry is False (and the weight's
    without a ``weight``) is an empty ``(0,)`` tensor. Half precision is computed and returned in float32."""


def _norm_backward(grad, input, weight, bias, mean, var, eps, lay: _Layout, needs_input_grad):
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
    return (shape, input._dtype, input._device, _channel_layout(shape))


def _batch_norm_ref(spec, input, weight, bias, running_mean, running_var, training, eps):
    if training:
        return _norm_np(spec, input, weight, bias, None, None, eps)
    return _norm_np(spec, input, weight, bias, running_mean, running_var, eps)


def _batch_norm_backward(grad, input, weight, bias, running_mean, running_var, training, eps, needs_input_grad):
    lay = _channel_layout(input._shape)
    stats = (None, None) if training else (running_mean, running_var)
    gx, gw, gb = _norm_backward(grad, input, weight, bias, *stats, eps, lay, needs_input_grad)
    return gx, gw, gb, None, None


@op(
    meta=_batch_norm_meta,
    reference=_batch_norm_ref,
    backward=_batch_norm_backward,
    autocast="fp32",
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
    spec = ((input._shape[1],), dt.float32 if input._dtype in _HALF else input._dtype, input._device)
    return (spec, spec)


def _bn_stats_ref(spec, input):
    """As ``_mean(x, red)`` and ``_var(x, red, 1)`` compute them (kiln's reference kernels)."""
    compute = _compute_np(spec[0][1])
    x = input.astype(compute, copy=False)
    red = (0,) + tuple(range(2, x.ndim))
    c = spec[0][0]
    if x.size == 0:
        return np.full(c, np.nan, compute), np.full(c, np.nan, compute)
    n = x.size // max(c[0], 1)
    mean = np.mean(x, axis=red, dtype=compute)
    m = np.mean(x, axis=red, keepdims=True, dtype=compute)
    var = np.asarray(np.sum(np.square(x - m), axis=red, dtype=compute) / compute.type(max(n - 1, 0)))
    same = np.max(x, axis=red) == np.min(x, axis=red)
    return mean, np.where(same & ~np.isnan(var), np.zeros((), compute) * var, var)


@op(meta=_bn_stats_meta, reference=_bn_stats_ref, num_outputs=2)
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
    return (input._shape, input._dtype, input._device, _layer_layout(input._shape, ns))


def _layer_norm_ref(spec, input, normalized_shape, weight, bias, eps):
    return _norm_np(spec, input, weight, bias, None, None, eps)


def _layer_norm_backward(grad, input, normalized_shape, weight, bias, eps, needs_input_grad):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return _norm_backward(grad, input, weight, bias, None, None, eps, _layer_layout(input._shape, ns), needs_input_grad)


@op(
    meta=_layer_norm_meta,
    reference=_layer_norm_ref,
    backward=_layer_norm_backward,
    autocast="fp32",
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
    return (shape, input._dtype, input._device, _group_layout(shape, num_groups))


def _group_norm_ref(spec, input, num_groups, weight, bias, eps):
    return _norm_np(spec, input, weight, bias, None, None, eps)


def _group_norm_backward(grad, input, num_groups, weight, bias, eps, needs_input_grad):
    lay = _group_layout(input._shape, num_groups)
    return _norm_backward(grad, input, weight, bias, None, None, eps, lay, needs_input_grad)


@op(
    meta=_group_norm_meta,
    reference=_group_norm_ref,
    backward=_group_norm_backward,
    autocast="fp32",
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
    from kiln._ops.math import rsqrt

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
    from kiln._ops.math import clamp_min

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


# ---------------------------------------------------------------------------------------- embedding


def _embedding_meta(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_tensor(weight, "embedding", "weight")
    _check_tensor(indices, "embedding", "indices", 2)
    if len(weight._shape) != 2:
        raise RuntimeError("'weight' must be 2-D")
    if indices._dtype not in (dt.int64, dt.int32):
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
            f"but got kiln.{scalar_type_name(indices._dtype)}Tensor instead (while checking arguments for embedding)"
        )
    return (indices._shape + (weight._shape[1],), weight._dtype, weight._device)


def _embedding_ref(spec, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    i = indices.astype(np.int64, copy=False)
    if ((i < 0) | (i >= weight.shape[0])).any():
        raise IndexError("index out of range in self")
    return weight[i]


def _embedding_backward(grad, weight_shape, indices, padding_idx, scale_grad_by_freq):
    from kiln._ops.creation import zeros
    from kiln._ops.indexing import bincount, index_add, index_select

    n, d = weight_shape
    flat = indices.reshape(-1).to(dt.int64)
    g = grad.reshape(-1, d)
    if padding_idx is not None and padding_idx >= 0:
        g = where((flat != padding_idx).unsqueeze(1), g, 0.0)
    if scale_grad_by_freq and _numel(flat._shape):
        counts = index_select(bincount(flat, None, n), 0, flat)
        g = g / counts.unsqueeze(1).to(g.dtype)
    return index_add(zeros(n, d, dtype=grad.dtype, device=grad.device), 0, flat, g), None


@op(meta=_embedding_meta, reference=_embedding_ref, backward=_embedding_backward, grad_fn_name="EmbeddingBackward0")
def _embedding(
    weight: Tensor, indices: Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
) -> Tensor:
    """Rows of ``weight`` at ``indices`` (``torch.embedding``'s argument order); gradients accumulate into
    the rows used, none into ``padding_idx``'s row; ``sparse`` still gives a dense gradient."""


def _embedding_renorm_(weight: Tensor, indices: Tensor, max_norm: float, norm_type: float) -> None:
    """Rescale in place the rows of ``weight`` used by ``indices`` whose ``norm_type``-norm exceeds ``max_norm``."""
    from kiln._ops.indexing import index_put, index_select, unique
    from kiln._ops.scans import vector_norm
    from kiln.autograd.grad_mode import no_grad

    with no_grad():
        flat = indices.reshape(-1).to(dt.int64)
        if not _numel(flat._shape):
            return
        used = unique(flat)
        if isinstance(used, tuple):
            used = used[0]
        n = weight.shape[0]
        bad = (used < -n) | (used >= n)
        if bool(bad.any()):
            i = int(used[bad.to(dt.uint8).argmax()].item())
            raise IndexError(
                f"select(): index {i} out of range for tensor of size {_shape_list(weight._shape)} at dimension 0"
            )
        used = where(used < 0, used + n, used)
        rows = index_select(weight, 0, used)
        norms = vector_norm(rows, float(norm_type), 1, True)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        weight.copy_(index_put(weight, (used,), rows * scale))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """Look up rows of the ``(num_embeddings, dim)`` ``weight`` at the integer ``input``. ``padding_idx``'s
    row gets no gradient; ``max_norm`` renormalizes the used rows in place first; ``sparse=True`` is
    accepted but the gradient is dense (kiln has no sparse tensors)."""
    _check_tensor(weight, "embedding", "weight", 2)
    if padding_idx is not None:
        n = weight.shape[0] if weight.dim() else 0
        if padding_idx > 0:
            if padding_idx >= n:
                raise AssertionError("Padding_idx must be within num_embeddings")
        elif padding_idx < 0:
            if padding_idx < -n:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = n + padding_idx
    else:
        padding_idx = -1
    if max_norm is not None:
        _embedding_meta(weight, input)  # validate before writing into weight
        _embedding_renorm_(weight, input, max_norm, norm_type)
    return _embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)


_CHECK_I = (
    "Expected i < index_size to be true, but got false.  (Could this error message be improved?  If so, please "
    "report an enhancement request to PyTorch.)"
)


def _bag_layout(offs, length: int, include_last_offset: bool) -> tuple[np.ndarray, int, int]:
    """(bag of every entry, number of bags, end of the last bag) from the offsets' values."""
    offs = np.asarray(offs, np.int64).reshape(-1)
    n_bags = max(offs.size - 1 if include_last_offset else offs.size, 0)
    # PyTorch's kernels disagree about entries past the last offset with include_last_offset (sum keeps
    # them, mean divides by them without adding them); kiln follows the documentation and drops them
    end = int(offs[-1]) if include_last_offset and offs.size else length
    if not n_bags:
        return np.zeros(length, np.int64), 0, end
    ids = np.searchsorted(offs[:n_bags], np.arange(length), side="right") - 1
    return np.maximum(ids, 0).astype(np.int64), n_bags, end


def _bag_ids(input, offsets, include_last_offset) -> tuple[np.ndarray, int, int]:
    """:func:`_bag_layout` of the host copy of ``offsets``, after PyTorch's checks of their values."""
    length = _numel(input._shape)
    offs = [int(v) for v in offsets.tolist()]
    if offs and offs[0] != 0:
        raise RuntimeError(
            "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
            f"However, got {offs[0]}\n[ kiln.{scalar_type_name(offsets._dtype)}Tensor{{}} ]"
        )
    if offs and offs[-1] > length:
        raise RuntimeError(
            f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {offs[-1]}"
        )
    if any(b < a for a, b in itertools.pairwise(offs)):
        raise RuntimeError(_CHECK_I)
    return _bag_layout(offs, length, include_last_offset)


def _embedding_bag_meta(
    weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, scale_grad_by_freq
):
    _check_tensor(weight, "embedding_bag", "weight")
    _check_tensor(indices, "embedding_bag", "indices", 2)
    _check_tensor(offsets, "embedding_bag", "offsets", 3)
    if len(weight._shape) != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {len(weight._shape)}")
    if len(indices._shape) != 1 or len(offsets._shape) != 1:
        raise ValueError("input and offsets have to be 1D Tensors")
    for name, t in (("indices", indices), ("offsets", offsets)):
        if t._dtype not in (dt.int64, dt.int32):
            raise RuntimeError(
                f"Expected tensor for argument #1 '{name}' to have one of the following scalar types: Long, Int; "
                f"but got kiln.{scalar_type_name(t._dtype)}Tensor instead (while checking arguments for "
                "embedding_bag)"
            )
    if mode not in ("sum", "mean", "max"):
        raise ValueError("mode has to be one of sum, mean or max")
    if per_sample_weights is not None:
        if per_sample_weights._shape != indices._shape:
            raise ValueError(
                f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it must have "
                f"the same shape as the input ({indices.shape})"
            )
        if mode != "sum":
            raise NotImplementedError(
                "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for "
                f"mode='sum' (got mode='{mode}'). Please open a feature request on GitHub."
            )
    _require_float(weight, "embedding_bag")
    n_bags = max(offsets._shape[0] - (1 if include_last_offset else 0), 0)
    shape = (n_bags, weight._shape[1])
    return ((shape, weight._dtype, weight._device), (shape, dt.int64, weight._device))


def _embedding_bag_ref(
    spec, weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, scale_grad_by_freq
):
    compute = _compute_np(spec[0][1])
    n, d = weight.shape
    idx = indices.astype(np.int64, copy=False)
    if ((idx < 0) | (idx >= n)).any():
        raise RuntimeError(_CHECK_I)
    ids, n_bags, end = _bag_layout(offsets, idx.size, include_last_offset)
    keep = (np.arange(idx.size) < end) & (idx != padding_idx)
    ids, idx = ids[keep], idx[keep]
    rows = weight.astype(compute, copy=False)[idx]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(compute, copy=False)[keep][:, None]
    count = np.bincount(ids, minlength=n_bags)[:, None]
    arg = np.zeros((n_bags, d), np.int64)
    if mode == "max":
        out = np.full((n_bags, d), -np.inf, compute)
        np.maximum.at(out, ids, rows)
        # the (first) row holding each maximum, for the backward
        hit = rows == out[ids]
        first = np.full((n_bags, d), idx.size, np.int64)
        np.minimum.at(first, ids, np.where(hit, np.arange(idx.size)[:, None], idx.size))
        arg = np.where(count > 0, idx[np.minimum(first, max(idx.size - 1, 0))] if idx.size else 0, 0)
        out = np.where(count > 0, out, 0)
    else:
        out = np.zeros((n_bags, d), compute)
        np.add.at(out, ids, rows)
        if mode == "mean":
            out = out / np.maximum(count, 1)
    return out, arg


def _embedding_bag_backward(
    grads,
    weight,
    indices,
    offsets,
    mode,
    per_sample_weights,
    include_last_offset,
    padding_idx,
    scale_grad_by_freq,
    result,
    needs_input_grad,
):
    from kiln._ops.creation import tensor, zeros
    from kiln._ops.indexing import bincount, index_add, index_select, scatter_add

    grad = grads[0]
    n, d = weight._shape
    dev = weight.device
    idx = indices.to(dt.int64)
    ids_np, n_bags, end = _bag_layout(offsets.tolist(), _numel(idx._shape), include_last_offset)
    keep_np = (np.arange(ids_np.size) < end) & (np.asarray(idx.tolist(), np.int64).reshape(-1) != padding_idx)
    gw = gp = None
    if mode == "max":
        if needs_input_grad[0]:
            filled = np.bincount(ids_np[keep_np], minlength=n_bags) > 0  # an empty bag's zeros come from no row
            g = where(tensor(filled, device=dev).unsqueeze(1), grad, 0.0)
            gw = scatter_add(zeros(n, d, dtype=grad.dtype, device=dev), 0, result[1], g)
        return gw, None, None, None
    ids = tensor(ids_np, device=dev)
    keep = tensor(keep_np, device=dev).unsqueeze(1)
    g = index_select(grad, 0, ids) if ids_np.size else zeros(0, d, dtype=grad.dtype, device=dev)
    if mode == "mean":
        count = np.maximum(np.bincount(ids_np[keep_np], minlength=n_bags), 1)
        g = g / tensor(count[ids_np].astype(np.float64), device=dev).to(g.dtype).unsqueeze(1)
    g = where(keep, g, 0.0)
    if per_sample_weights is not None and needs_input_grad[3]:
        gp = _sum(g * index_select(weight, 0, idx), 1)
    if needs_input_grad[0]:
        gwe = g if per_sample_weights is None else g * per_sample_weights.unsqueeze(1)
        if scale_grad_by_freq and ids_np.size:
            gwe = gwe / index_select(bincount(idx, None, n), 0, idx).unsqueeze(1).to(gwe.dtype)
        gw = index_add(zeros(n, d, dtype=grad.dtype, device=dev), 0, idx, gwe)
    return gw, None, None, gp


@op(
    meta=_embedding_bag_meta,
    reference=_embedding_bag_ref,
    backward=_embedding_bag_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="EmbeddingBagBackward0",
)
def _embedding_bag(
    weight: Tensor,
    indices: Tensor,
    offsets: Tensor,
    mode: str,
    per_sample_weights: Tensor | None,
    include_last_offset: bool,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> tuple[Tensor, Tensor]:
    """Sum, mean or max of the rows of ``weight`` at the 1-D ``indices``, one bag per offset, and the row
    each maximum came from (mode ``'max'``; zeros otherwise). ``padding_idx`` entries (``-1``: none) are
    left out of their bag."""


def _check_bag_indices(idx: Tensor, n: int, mode: str, ids: np.ndarray) -> None:
    """Indices in ``[0, n)``, with the message of the PyTorch kernel that would meet the bad one (observed:
    max mode checks each index; sum and mean name its position in its bag, or fail an internal check for a
    bag of one)."""
    if not _numel(idx._shape):
        return
    bad = (idx < 0) | (idx >= n)
    if not bool(bad.any()):
        return
    pos = int(bad.reshape(-1).to(dt.uint8).argmax().item())
    value = int(idx.reshape(-1)[pos].item())
    if mode == "max":
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}")
    same_bag = np.flatnonzero(ids == ids[pos])
    if same_bag.size == 1:
        raise RuntimeError(_CHECK_I)
    raise RuntimeError(
        f"Index {pos - int(same_bag[0])} of input takes value {value} which is not in the valid range [0, {n})"
    )


def _type_text(x) -> str:
    return "<class 'kiln.Tensor'>" if isinstance(x, Tensor) else str(type(x))


def embedding_bag(
    input,
    weight,
    offsets=None,
    max_norm=None,
    norm_type=2,
    scale_grad_by_freq=False,
    mode="mean",
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=None,
):
    """Sums, means or maxima of bags of embedding rows: 2-D ``input`` is one bag per row; 1-D ``input`` is
    split into bags at ``offsets``. ``per_sample_weights`` scale the rows (mode ``'sum'``); ``padding_idx``
    entries are left out of their bag; empty bags give zeros. Gradients are dense."""
    from kiln._ops.creation import tensor

    idx = input
    _check_tensor(idx, "embedding_bag")
    _check_tensor(weight, "embedding_bag", "weight", 2)
    if weight._dtype is dt.int64 and idx._dtype.is_floating_point:
        warnings.warn(
            "Argument order of nn.functional.embedding_bag was changed. Usage `embedding_bag(weight, input, ...)` "
            "is deprecated, and should now be `embedding_bag(input, weight, ...)`.",
            UserWarning,
            stacklevel=2,
        )
        weight, idx = idx, weight
    if per_sample_weights is not None and idx.shape != per_sample_weights.shape:
        raise ValueError(
            f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it must have the "
            f"same shape as the input ({idx.shape})"
        )
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    if idx.dim() == 2:
        if offsets is not None:
            raise ValueError(
                "if input is 2D, then offsets has to be None, as input is treated is a mini-batch of fixed length "
                f"sequences. However, found offsets of type {_type_text(offsets)}"
            )
        rows_per_bag = idx._shape[1]
        starts = list(range(0, _numel(idx._shape), rows_per_bag)) if rows_per_bag else [0] * idx._shape[0]
        offsets = tensor(starts, dtype=dt.int64, device=idx.device)
        include_last_offset = False
        idx = idx.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif idx.dim() == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {idx.dim()}")
    if mode == "max":
        if scale_grad_by_freq:
            raise ValueError("max mode does not support scaling the gradient by the frequency")
        if sparse:
            raise ValueError("max mode does not support sparse weights")
    elif mode not in ("sum", "mean"):
        raise ValueError("mode has to be one of sum, mean or max")
    if max_norm is not None:
        _embedding_renorm_(weight, idx, max_norm, norm_type)
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only supported for mode='sum' "
            f"(got mode='{mode}'). Please open a feature request on GitHub."
        )
    if idx._dtype not in (dt.int64, dt.int32):
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
            f"but got kiln.{scalar_type_name(idx._dtype)}Tensor instead (while checking arguments for embedding_bag)"
        )
    if per_sample_weights is not None and per_sample_weights._dtype is not weight._dtype:
        raise RuntimeError(
            "Expected tensor for argument #1 'weight' to have the same type as tensor for argument #1 "
            f"'per_sample_weights'; but type kiln.{scalar_type_name(weight._dtype)}Tensor does not equal "
            f"kiln.{scalar_type_name(per_sample_weights._dtype)}Tensor (while checking arguments for embedding_bag)"
        )
    n = weight._shape[0]
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise RuntimeError(
                f"padding_idx must be within the number of embeddings, {-n} through {n - 1}, but got {padding_idx}"
            )
        padding_idx = padding_idx + n if padding_idx < 0 else padding_idx
    ids_np, _, _ = _bag_ids(idx, offsets, include_last_offset)
    _check_bag_indices(idx, n, mode, ids_np)
    pad = -1 if padding_idx is None else padding_idx
    out, _ = _embedding_bag(
        weight, idx, offsets, mode, per_sample_weights, include_last_offset, pad, scale_grad_by_freq
    )
    return out


# ---------------------------------------------------------------------------------------- dropout


def _check_p(p) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _noise(input: Tensor, p: float, feature: bool) -> Tensor:
    """A 0/1 keep mask (probability ``1 - p``) of the input's dtype, drawn from kiln's default generator
    of its device: elementwise, or one value per (sample, channel) for feature dropout."""
    from kiln._ops.creation import rand

    shape = input._shape
    if feature:
        if len(shape) < 2:
            raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
        shape = shape[:2] + (1,) * (len(shape) - 2)
    if not input._dtype.is_floating_point:
        raise RuntimeError(
            f"result type Float can't be cast to the desired output type {scalar_type_name(input._dtype)}"
        )
    return (rand(shape, dtype=dt.float64, device=input.device) < (1.0 - p)).to(input.dtype)


def _fused_dropout_meta(input, uniform, p):
    if not isinstance(input, Tensor) or not isinstance(uniform, Tensor) or uniform._shape != input._shape:
        raise RuntimeError("_fused_dropout: uniform must be a tensor of the input's shape")
    if uniform._dtype is not dt.float64 or not input._dtype.is_floating_point:
        raise RuntimeError("_fused_dropout: a floating input and float64 uniform draws are expected")
    spec = (input._shape, input._dtype, input._device)
    return spec, spec


def _fused_dropout_ref(spec, x, u, p):
    d = spec[0][1]
    compute = _compute_np(d)
    # the arithmetic of the composite it replaces: keep = u < 1 - p as 0/1 in x's dtype, noise = keep /
    # (1 - p) (a Python float: computed in the compute dtype, then rounded to x's), out = x * noise
    keep = (u < (1.0 - p)).astype(compute)
    noise = np.true_divide(keep, 1.0 - p, dtype=compute).astype(d.numpy, copy=False)
    out = np.multiply(x.astype(compute, copy=False), noise.astype(compute, copy=False), dtype=compute)
    return out.astype(d.numpy, copy=False), noise


def _fused_dropout_backward(grads, result):
    return grads[0] * result[1], None


@op(
    meta=_fused_dropout_meta,
    reference=_fused_dropout_ref,
    backward=_fused_dropout_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="MulBackward0",  # PyTorch's CPU dropout is a multiplication by the scaled mask too
)
def _fused_dropout(input: Tensor, uniform: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """Dropout's arithmetic in one op, given the uniform draws ``uniform`` (float64, input's shape):
    ``noise = (uniform < 1 - p) / (1 - p)`` in the input's dtype and ``input * noise``; returns both (the
    backward multiplies by ``noise``). Backends fuse the passes; the draws stay with kiln's generator."""


def _dropout_impl(input, p, train, inplace, feature, alpha):
    _check_tensor(input, "dropout")
    if p == 0 or not train or _numel(input._shape) == 0:
        return input
    if p == 1:
        if feature and len(input._shape) < 2:
            raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
        zero = input.new_zeros(())
        return input.mul_(zero) if inplace else input * zero
    if not (alpha or feature or inplace):
        if not input._dtype.is_floating_point:
            _noise(input, p, feature)  # raises PyTorch's error
        from kiln._ops.creation import rand

        return _fused_dropout(input, rand(input._shape, dtype=dt.float64, device=input.device), p)[0]
    noise = _noise(input, p, feature)
    if not alpha:
        noise = noise / (1.0 - p)
        return input.mul_(noise) if inplace else input * noise
    a_coef = 1.7580993408473766
    a = 1.0 / math.sqrt((a_coef * a_coef * p + 1) * (1 - p))
    shift = (noise - 1) * (a_coef * a) + a_coef * a * p
    noise = noise * a
    out = input.mul_(noise) if inplace else input * noise
    return out.add_(shift) if inplace else out + shift


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` (identity when not
    ``training``); the mask comes from kiln's default generator."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, False, False)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Dropout that keeps a SELU network's mean and variance: dropped elements take SELU's negative
    saturation value, then an affine correction is applied."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, False, True)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Alpha dropout of whole channels (one draw per sample and channel)."""
    _check_p(p)
    return _dropout_impl(input, p, training, inplace, True, True)


_FEATURE_NOTE = (
    "Note that dropout{k}d exists to provide channel-wise dropout on inputs with {k} spatial dimension{s}, a "
    "channel dimension, and an optional batch dimension (i.e. {lo}D or {hi}D inputs)."
)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p`` (scaling the rest)."""
    _check_p(p)
    _check_tensor(input, "dropout1d")
    nd = input.dim()
    if nd not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {nd}D input. "
            + _FEATURE_NOTE.format(k=1, s="", lo=2, hi=3)
        )
    return _batched_feature_dropout(input, p, training, inplace, nd == 3)


def _batched_feature_dropout(input, p, training, inplace, batched):
    if batched:
        return _dropout_impl(input, p, training, inplace, True, False)
    out = _dropout_impl(input.unsqueeze(0), p, training, inplace, True, False)
    return input if inplace else out.squeeze(0)


def _deprecated_rank(k: int, nd: int) -> None:
    warnings.warn(
        f"dropout{k}d: Received a {nd}-D input to dropout{k}d, which is deprecated and will result in an error in a "
        "future release. To retain the behavior and silence this warning, please use dropout instead. "
        + _FEATURE_NOTE.format(k=k, s="s", lo=k + 1, hi=k + 2),
        UserWarning,
        stacklevel=3,
    )


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, H, W)`` or ``(C, H, W)`` input with probability ``p``."""
    _check_p(p)
    _check_tensor(input, "dropout2d")
    nd = input.dim()
    if nd not in (3, 4):
        _deprecated_rank(2, nd)
    if nd == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is "
            "desired - input is interpreted as shape (N, C, L), where C is the channel dim. This behavior will "
            "change in a future release to interpret the input as one without a batch dimension, i.e. shape "
            "(C, H, W). To maintain the 1D channel-wise dropout behavior, please switch to using dropout1d instead.",
            UserWarning,
            stacklevel=2,
        )
    return _dropout_impl(input, p, training, inplace, True, False)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input with probability ``p``."""
    _check_p(p)
    _check_tensor(input, "dropout3d")
    nd = input.dim()
    if nd not in (4, 5):
        _deprecated_rank(3, nd)
    return _batched_feature_dropout(input, p, training, inplace, nd == 5)
