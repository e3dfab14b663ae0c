"""nn primitives: activation functions (``torch.nn.functional`` names) and their in-place aliases.

Each activation is one elementwise op (its own reference kernel, so a fast backend can override it)
whose backward is written in kiln ops, so higher-order gradients work. Gradients at the kinks follow
PyTorch's CPU kernels (e.g. ``hardtanh``/``relu6`` give 0 at both bounds, ``leaky_relu`` gives the
slope at 0). The public names follow ``torch.nn.functional`` (``inplace=`` writes into the input
through the core's in-place machinery). ``softsign`` and ``tanhshrink`` are compositions of ops, as in
PyTorch.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, common_device, scalar_type_name, wrap_dim
from kiln._ops.copy import inplace_variant
from kiln._ops.elementwise import _arg, _compute_np, exp, sigmoid, tanh, where
from kiln._ops.elementwise import abs as _abs
from kiln._ops.math_args import _FLOAT_MAX
from kiln._ops.special import erf, erf_np
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = [
    "gelu",
    "silu",
    "mish",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "relu6",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "softplus",
    "logsigmoid",
    "softsign",
    "tanhshrink",
    "softshrink",
    "hardshrink",
    "threshold",
    "prelu",
    "rrelu",
    "glu",
    "elu_",
    "selu_",
    "celu_",
    "leaky_relu_",
    "hardtanh_",
    "threshold_",
    "rrelu_",
]

TOP_LEVEL = (
    "celu",
    "celu_",
    "hardshrink",
    "prelu",
    "rrelu",
    "rrelu_",
    "selu",
    "selu_",
    "threshold",
    "threshold_",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_ONE_SIXTH = float(np.float32(1.0 / 6.0))  # PyTorch's hardsigmoid gradient uses the float constant


# ---------------------------------------------------------------------------------------- helpers


def _need_tensor(x, fname: str, name: str = "input", position: int = 1) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}(): argument '{name}' (position {position}) must be Tensor, not {type(x).__name__}")


def _float_meta(kernel: str, fname: str, check=None):
    """Meta of a floating-only elementwise activation: integer and bool inputs raise as PyTorch's kernel
    dispatch does (``"<kernel>" not implemented for 'Long'``); ``check(input, *params)`` validates params."""

    def meta(input, *params):
        _need_tensor(input, fname)
        d = input._dtype
        if not d.is_floating_point:
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(d)}'")
        if check is not None:
            check(input, *params)
        return Spec((input._shape, d, input._device))

    return meta


def _ref(np_fn):
    """A reference kernel ``np_fn(x, *params)`` computed in float32 for half types."""

    def ref(spec, a, *params):
        x = _arg(a, _compute_np(spec.dtype))
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return np_fn(x, *params)

    return ref


def _half_in_float32(fn):
    """A decomposition computed in float32 for half-precision inputs, as the reference kernels compute."""

    def decomposed(input, *args, **kwargs):
        d = input._dtype
        if d in (dt.float16, dt.bfloat16):
            return fn(input.to(dt.float32), *args, **kwargs).to(d)
        return fn(input, *args, **kwargs)

    decomposed.__name__ = decomposed.__qualname__ = fn.__name__
    decomposed.__doc__ = fn.__doc__
    return decomposed


_calling_inplace = threading.local()


def _node_name(base: str):
    """``grad_fn_name`` of an op whose in-place form PyTorch records as a different node
    (``EluBackward0`` out of place, ``EluBackward1`` in place)."""

    def name(args) -> str:
        return base + ("1" if getattr(_calling_inplace, "on", False) else "0")

    return name


def _inplace(fn, name: str):
    """The in-place form of op ``fn``; its backward reads ``input``, so autograd keeps a copy of it."""
    method = inplace_variant(fn, name, f"In-place :func:`{fn.op.name}`.", True)
    if isinstance(fn.op.grad_fn_name, str):
        return method

    def run(self, *args):
        _calling_inplace.on = True
        try:
            return method(self, *args)
        finally:
            _calling_inplace.on = False

    return run


# ---------------------------------------------------------------------------------------- gelu


def _gelu_check(input, approximate):
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")


def _gelu_np(x, approximate="none"):
    if approximate == "tanh":
        inner = _GELU_K * (x + _GELU_C * x * x * x)
        return 0.5 * x * (1.0 + np.tanh(inner))
    return (x.astype(np.float64) * 0.5 * (1.0 + erf_np(x.astype(np.float64) * _SQRT_HALF))).astype(x.dtype)


def _gelu_backward(grad, input, approximate):
    x = input
    if approximate == "tanh":
        t = tanh((x + x * x * x * _GELU_C) * _GELU_K)
        dinner = (x * x * (3.0 * _GELU_C) + 1.0) * _GELU_K
        return (grad * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * dinner),)
    cdf = (erf(x * _SQRT_HALF) + 1.0) * 0.5
    pdf = exp(x * x * -0.5) * _INV_SQRT_2PI
    return (grad * (cdf + x * pdf),)


@_half_in_float32
def _gelu_decomposed(input, *, approximate="none"):
    """:func:`gelu` in kiln ops."""
    x = input
    if approximate == "tanh":
        return x * 0.5 * (tanh((x + x * x * x * _GELU_C) * _GELU_K) + 1.0)
    return x * 0.5 * (erf(x * _SQRT_HALF) + 1.0)


@op(
    tags=("pointwise", "nn"),
    decompose=_gelu_decomposed,
    meta=_float_meta("GeluKernelImpl", "gelu", _gelu_check),
    reference=_ref(_gelu_np),
    backward=_gelu_backward,
)
def gelu(input: Tensor, *, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit ``x * Phi(x)``; ``approximate='tanh'`` uses the tanh approximation."""


# ---------------------------------------------------------------------------------------- silu, mish


def _silu_backward(grad, input):
    s = sigmoid(input)
    return (grad * s * (input * (1.0 - s) + 1.0),)


@_half_in_float32
def _silu_decomposed(input):
    """``silu`` in kiln ops."""
    return input / (exp(-input) + 1.0)


@op(
    tags=("pointwise", "nn"),
    decompose=_silu_decomposed,
    meta=_float_meta("silu_cpu", "silu"),
    reference=_ref(lambda x: x / (1.0 + np.exp(-x))),
    backward=_silu_backward,
    name="silu",
)
def _silu(input: Tensor) -> Tensor:
    """Sigmoid linear unit (swish) ``x * sigmoid(x)``."""


_silu_ = _inplace(_silu, "silu_")


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """Sigmoid linear unit (swish) ``x * sigmoid(x)`` elementwise (``torch.nn.functional.silu``)."""
    return _silu_(input) if inplace else _silu(input)


def _softplus_np(x, beta=1.0, threshold=20.0):
    z = x * beta
    return np.where(z > threshold, x, np.log1p(np.exp(z)) / beta)


def _mish_backward(grad, input):
    t = tanh(_softplus(input, 1.0, 20.0))
    s = sigmoid(input)
    return (grad * (t + input * s * (1.0 - t * t)),)


@_half_in_float32
def _mish_decomposed(input):
    """``mish`` in kiln ops."""
    from kiln._ops.unary_math import log1p

    return input * tanh(log1p(exp(input)))


@op(
    tags=("pointwise", "nn"),
    decompose=_mish_decomposed,
    meta=_float_meta("mish_cpu", "mish"),
    reference=_ref(lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    backward=_mish_backward,
    name="mish",
)
def _mish(input: Tensor) -> Tensor:
    """Mish ``x * tanh(softplus(x))``."""


_mish_ = _inplace(_mish, "mish_")


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """Mish ``x * tanh(softplus(x))`` elementwise (``torch.nn.functional.mish``)."""
    return _mish_(input) if inplace else _mish(input)


# ---------------------------------------------------------------------------------------- elu family


def _elu_np(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = np.expm1(x * input_scale) * (alpha * scale)
    return np.where(x > 0, x * scale, neg)


def _elu_backward(grad, input, alpha, scale, input_scale):
    neg = exp(input * input_scale) * (alpha * scale * input_scale)
    return (where(input <= 0, grad * neg, grad * scale),)  # (NaN: the positive side, as PyTorch)


@_half_in_float32
def _elu_decomposed(input, alpha=1.0, scale=1.0, input_scale=1.0):
    """``elu`` in kiln ops."""
    from kiln._ops.unary_math import expm1

    return where(input > 0, input * scale, expm1(input * input_scale) * (alpha * scale))


@op(
    tags=("pointwise", "nn"),
    decompose=_elu_decomposed,
    meta=_float_meta("elu_cpu", "elu"),
    reference=_ref(_elu_np),
    backward=_elu_backward,
    name="elu",
    grad_fn_name=_node_name("EluBackward"),
)
def _elu(input: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
    """``scale * x`` for ``x > 0``, else ``alpha * scale * (exp(input_scale * x) - 1)`` (``torch.elu``)."""


_elu_ = _inplace(_elu, "elu_")


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """Exponential linear unit: ``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    return _elu_(input, alpha) if inplace else _elu(input, alpha)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """Scaled ELU with the self-normalising constants ``alpha = 1.6733``, ``scale = 1.0507``."""
    if inplace:
        return _elu_(input, _SELU_ALPHA, _SELU_SCALE)
    return _elu(input, _SELU_ALPHA, _SELU_SCALE)


def _celu_check(input, alpha):
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")


def _celu_backward(grad, input, alpha):
    return (where(input <= 0, grad * exp(input * (1.0 / alpha)), grad),)  # (NaN: the positive side, as PyTorch)


@_half_in_float32
def _celu_decomposed(input, alpha=1.0):
    """``celu`` in kiln ops."""
    return _elu_decomposed(input, alpha, 1.0, 1.0 / alpha)


@op(
    tags=("pointwise", "nn"),
    decompose=_celu_decomposed,
    meta=_float_meta("elu_cpu", "celu", _celu_check),
    reference=_ref(lambda x, alpha=1.0: _elu_np(x, alpha, 1.0, 1.0 / alpha)),
    backward=_celu_backward,
    name="celu",
    grad_fn_name=_node_name("CeluBackward"),
)
def _celu(input: Tensor, alpha: float = 1.0) -> Tensor:
    """Continuously differentiable ELU ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""


_celu_ = _inplace(_celu, "celu_")


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """Continuously differentiable ELU: ``x`` for ``x > 0``, else ``alpha * (exp(x / alpha) - 1)``."""
    return _celu_(input, alpha) if inplace else _celu(input, alpha)


# ---------------------------------------------------------------------------------------- relu family


def _leaky_relu_decomposed(input, negative_slope=0.01):
    """``leaky_relu`` in kiln ops."""
    return where(input > 0, input, input * negative_slope)


@op(
    tags=("pointwise", "nn"),
    decompose=_leaky_relu_decomposed,
    meta=_float_meta("leaky_relu_cpu", "leaky_relu"),
    reference=_ref(lambda x, slope=0.01: np.where(x > 0, x, x * slope)),
    backward=lambda grad, input, negative_slope: (where(input > 0, grad, grad * negative_slope),),
    name="leaky_relu",
    grad_fn_name=_node_name("LeakyReluBackward"),
)
def _leaky_relu(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` for ``x > 0``, else ``negative_slope * x``."""


_leaky_relu_ = _inplace(_leaky_relu, "leaky_relu_")


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """Leaky ReLU: ``x`` for ``x > 0``, else ``negative_slope * x`` (gradient at 0: the slope)."""
    return _leaky_relu_(input, negative_slope) if inplace else _leaky_relu(input, negative_slope)


def _scalar_for(d: dt.dtype, v):
    """A Scalar argument as PyTorch's kernel sees it: truncated to an integer for integer dtypes."""
    return v if d.is_floating_point else int(v)


def _hardtanh_meta(input, min_val=-1.0, max_val=1.0):
    _need_tensor(input, "hardtanh")
    if input._dtype is dt.bool:
        raise RuntimeError("Bool inputs not supported for hardtanh")
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return Spec((input._shape, input._dtype, input._device))


def _hardtanh_ref(spec, a, min_val=-1.0, max_val=1.0):
    d = spec.dtype
    x = _arg(a, _compute_np(d))
    lo = np.asarray(_scalar_for(d, min_val)).astype(x.dtype)
    hi = np.asarray(_scalar_for(d, max_val)).astype(x.dtype)
    return np.minimum(np.maximum(x, lo), hi)  # NaN propagates


def _scalar_tensor(d: dt.dtype, value, device) -> Tensor:
    """A Scalar argument as the reference kernels see it, as a 0-d tensor in the compute dtype: truncated
    for integer dtypes, then converted (integers wrap: -1 is 255 in uint8)."""
    from kiln._ops.creation import tensor

    v = _scalar_for(d, value)
    t = tensor(v, dtype=dt.float64 if isinstance(v, float) else dt.int64, device=device)
    return t.to(dt.float32 if d in (dt.float16, dt.bfloat16) else d)


def _hardtanh_decomposed(input, min_val=-1.0, max_val=1.0):
    """``hardtanh`` in kiln ops: ``minimum(maximum(x, min_val), max_val)`` (NaN propagates)."""
    from kiln._ops.reduction import maximum, minimum

    d = input._dtype
    lo, hi = _scalar_tensor(d, min_val, input._device), _scalar_tensor(d, max_val, input._device)
    return minimum(maximum(input.to(lo._dtype), lo), hi).to(d)


@op(
    tags=("pointwise", "nn"),
    decompose=_hardtanh_decomposed,
    meta=_hardtanh_meta,
    reference=_hardtanh_ref,
    # 0 at and beyond the bounds; a NaN input passes the gradient, as in PyTorch
    backward=lambda grad, input, min_val, max_val: (where((input <= min_val) | (input >= max_val), 0.0, grad),),
    name="hardtanh",
)
def _hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """``input`` clamped to ``[min_val, max_val]``; the gradient is 0 at and beyond both bounds."""


_hardtanh_ = _inplace(_hardtanh, "hardtanh_")


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``input`` clamped to ``[min_val, max_val]`` (the gradient is 0 at both bounds, as in PyTorch)."""
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _hardtanh_(input, min_val, max_val) if inplace else _hardtanh(input, min_val, max_val)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """``min(max(x, 0), 6)``: ``hardtanh(input, 0, 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def _hardswish_backward(grad, input):
    mid = where(input < 3.0, grad * (input * (1.0 / 3.0) + 0.5), grad)
    return (where(input <= -3.0, 0.0, mid),)


@_half_in_float32
def _hardswish_decomposed(input):
    """``hardswish`` in kiln ops."""
    from kiln._ops.clamp import clamp

    return input * clamp(input + 3.0, 0.0, 6.0) / 6.0


@op(
    tags=("pointwise", "nn"),
    decompose=_hardswish_decomposed,
    meta=_float_meta("hardswish_cpu", "hardswish"),
    reference=_ref(lambda x: x * np.minimum(np.maximum(x + 3.0, 0.0), 6.0) / 6.0),
    backward=_hardswish_backward,
    name="hardswish",
)
def _hardswish(input: Tensor) -> Tensor:
    """Hard swish ``x * relu6(x + 3) / 6``."""


_hardswish_ = _inplace(_hardswish, "hardswish_")


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """Hard swish ``x * relu6(x + 3) / 6`` elementwise."""
    return _hardswish_(input) if inplace else _hardswish(input)


@_half_in_float32
def _hardsigmoid_decomposed(input):
    """``hardsigmoid`` in kiln ops."""
    from kiln._ops.clamp import clamp

    return clamp(input + 3.0, 0.0, 6.0) / 6.0


@op(
    tags=("pointwise", "nn"),
    decompose=_hardsigmoid_decomposed,
    meta=_float_meta("hardsigmoid_cpu", "hardsigmoid"),
    reference=_ref(lambda x: np.minimum(np.maximum(x + 3.0, 0.0), 6.0) / 6.0),
    backward=lambda grad, input: (where((input > -3.0) & (input < 3.0), grad * _ONE_SIXTH, 0.0),),
    name="hardsigmoid",
)
def _hardsigmoid(input: Tensor) -> Tensor:
    """Hard sigmoid ``relu6(x + 3) / 6``."""


_hardsigmoid_ = _inplace(_hardsigmoid, "hardsigmoid_")


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """Hard sigmoid ``relu6(x + 3) / 6`` elementwise."""
    return _hardsigmoid_(input) if inplace else _hardsigmoid(input)


# ---------------------------------------------------------------------------------------- softplus, logsigmoid


def _softplus_backward(grad, input, beta, threshold):
    z = input * beta
    return (where(z > threshold, grad, grad * sigmoid(z)),)


@_half_in_float32
def _softplus_decomposed(input, beta=1.0, threshold=20.0):
    """``softplus`` in kiln ops."""
    from kiln._ops.unary_math import log1p

    z = input * beta
    return where(z > threshold, input, log1p(exp(z)) / beta)


@op(
    autocast="fp32_float16",
    tags=("pointwise", "nn"),
    decompose=_softplus_decomposed,
    meta=_float_meta("softplus_cpu", "softplus"),
    reference=_ref(_softplus_np),
    backward=_softplus_backward,
    name="softplus",
)
def _softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x > threshold``."""


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """Softplus ``log(1 + exp(beta * x)) / beta``, reverting to ``x`` where ``beta * x > threshold``."""
    return _softplus(input, beta, threshold)


@_half_in_float32
def _log_sigmoid_decomposed(input):
    """``log_sigmoid`` in kiln ops."""
    from kiln._ops.clamp import clamp_max
    from kiln._ops.unary_math import log1p

    return clamp_max(input, 0.0) - log1p(exp(-_abs(input)))


@op(
    tags=("pointwise", "nn"),
    decompose=_log_sigmoid_decomposed,
    meta=_float_meta("log_sigmoid_cpu", "log_sigmoid"),
    reference=_ref(lambda x: np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))),
    backward=lambda grad, input: (grad * sigmoid(-input),),
    name="log_sigmoid",
    grad_fn_name="LogSigmoidBackward0",
)
def _log_sigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))``, computed stably."""


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))`` elementwise, stable for large ``|x|``."""
    return _log_sigmoid(input)


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)`` elementwise (a composition, as in PyTorch)."""
    return input / (_abs(input) + 1)


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)`` elementwise (a composition, as in PyTorch)."""
    return input - tanh(input)


# ---------------------------------------------------------------------------------------- shrink, threshold


def _softshrink_check(input, lambd):
    top = _FLOAT_MAX[input._dtype]
    if not 0 <= lambd <= top:
        raise RuntimeError(
            f"lambda must be in range [0, {top:g}] for input dtype {scalar_type_name(input._dtype)}, but found {lambd:g}"
        )


def _softshrink_decomposed(input, lambd=0.5):
    """``softshrink`` in kiln ops."""
    return where(input > lambd, input - lambd, where(input < -lambd, input + lambd, input * 0.0))


@op(
    tags=("pointwise", "nn"),
    decompose=_softshrink_decomposed,
    meta=_float_meta("softshrink_check", "softshrink", _softshrink_check),
    reference=_ref(lambda x, lambd=0.5: np.where(x > lambd, x - lambd, np.where(x < -lambd, x + lambd, 0.0 * x))),
    backward=lambda grad, input, lambd: (where((input >= -lambd) & (input <= lambd), 0.0, grad),),
    name="softshrink",
)
def _softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """Soft shrinkage: ``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""
    return _softshrink(input, lambd)


def _hardshrink_decomposed(input, lambd=0.5):
    """``hardshrink`` in kiln ops."""
    return where((input >= -lambd) & (input <= lambd), 0.0, input)


@op(
    tags=("pointwise", "nn"),
    decompose=_hardshrink_decomposed,
    meta=_float_meta("hardshrink_cpu", "hardshrink"),
    reference=_ref(lambda x, lambd=0.5: np.where((x >= -lambd) & (x <= lambd), np.zeros((), x.dtype), x)),
    backward=lambda grad, input, lambd: (where((input >= -lambd) & (input <= lambd), 0.0, grad),),
    name="hardshrink",
    methods=("hardshrink",),
)
def _hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """Hard shrinkage: ``x`` where ``|x| > lambd``, else 0."""
    return _hardshrink(input, lambd)


def _threshold_meta(input, threshold, value):
    _need_tensor(input, "threshold")
    if input._dtype is dt.bool:
        raise NotImplementedError("\"threshold_cpu\" not implemented for 'Bool'")
    return Spec((input._shape, input._dtype, input._device))


def _threshold_ref(spec, a, threshold, value):
    d = spec.dtype
    x = _arg(a, _compute_np(d))
    th = np.asarray(_scalar_for(d, threshold)).astype(x.dtype)
    val = np.asarray(_scalar_for(d, value)).astype(x.dtype)
    return np.where(x <= th, val, x)


def _threshold_decomposed(input, threshold, value):
    """``threshold`` in kiln ops: ``where(x <= threshold, value, x)``."""
    d = input._dtype
    th, val = _scalar_tensor(d, threshold, input._device), _scalar_tensor(d, value, input._device)
    x = input.to(th._dtype)
    return where(x <= th, val, x).to(d)


@op(
    tags=("pointwise", "nn"),
    decompose=_threshold_decomposed,
    meta=_threshold_meta,
    reference=_threshold_ref,
    backward=lambda grad, input, threshold: (where(input <= threshold, 0.0, grad),),
    name="threshold",
    grad_fn_name=_node_name("ThresholdBackward"),
)
def _threshold(input: Tensor, threshold: float, value: float) -> Tensor:
    """``value`` where ``x <= threshold``, else ``x`` (``torch.threshold``)."""


_threshold_ = _inplace(_threshold, "threshold_")


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``value`` where ``input <= threshold``, else ``input``."""
    return _threshold_(input, threshold, value) if inplace else _threshold(input, threshold, value)


# ---------------------------------------------------------------------------------------- prelu


def _prelu_meta(input, weight):
    _need_tensor(input, "prelu")
    _need_tensor(weight, "prelu", "weight", 2)
    if weight.dim() > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.dim()}")
    n = weight.numel()
    if n != 1:
        if input.dim() == 0:
            raise RuntimeError("Not allow zero-dim input tensor.")
        channels = input._shape[1] if input.dim() >= 2 else 1
        if n != channels:
            raise RuntimeError(
                "Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                f"{n} and channel size = {channels}."
            )
    d = input._dtype
    if d is not weight._dtype:
        raise RuntimeError(
            f"prelu: Type promoting not supported. Got {scalar_type_name(d)} and {scalar_type_name(weight._dtype)}"
        )
    if not d.is_floating_point:
        raise NotImplementedError(f"\"prelu_cpu\" not implemented for '{scalar_type_name(d)}'")
    return Spec((input._shape, d, common_device("prelu", input, weight)))


def _channel_shape(ndim: int, n: int) -> tuple:
    """The shape ``weight`` takes to broadcast along dim 1 of an ``ndim``-d input."""
    if n == 1 or ndim < 2:
        return ()
    return (n,) + (1,) * (ndim - 2)


def _prelu_ref(spec, a, w):
    compute = _compute_np(spec.dtype)
    x = _arg(a, compute)
    w = _arg(w, compute).reshape(_channel_shape(x.ndim, w.size))
    return np.where(x > 0, x, x * w)


def _prelu_backward(grad, input, weight, needs_input_grad):
    w = weight.reshape(_channel_shape(input.dim(), weight.numel()))
    g_in = where(input > 0, grad, grad * w) if needs_input_grad[0] else None
    g_w = None
    if needs_input_grad[1]:
        per = where(input > 0, 0.0, grad * input)
        if weight.numel() == 1 or input.dim() < 2:
            g_w = per.sum().reshape(weight.shape)
        else:
            dims = [i for i in range(input.dim()) if i != 1]
            g_w = per.sum(dims) if dims else per
    return (g_in, g_w)


def _prelu_decomposed(input, weight):
    """``prelu`` in kiln ops: ``x`` where positive, else ``x`` times the weight of its channel (dim 1)."""
    w = weight.reshape(_channel_shape(input.dim(), weight.numel()))
    return where(input > 0, input, input * w)


@op(
    autocast="lower",
    tags=("pointwise", "nn"),
    decompose=_prelu_decomposed,
    meta=_prelu_meta,
    reference=_prelu_ref,
    backward=_prelu_backward,
    grad_fn_name="PreluKernelBackward0",
    methods=("prelu",),
)
def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """Parametric ReLU: ``x`` for ``x > 0``, else ``weight * x``, with one weight per channel (dim 1)
    or a single shared one."""


# ---------------------------------------------------------------------------------------- rrelu


def _rrelu_meta(input, noise, lower, upper, training):
    _need_tensor(input, "rrelu_with_noise")
    d = input._dtype
    bad = not d.is_floating_point or (training and d is dt.float16)
    if bad:
        kernel = "rrelu_with_noise_out_cpu" if training else "leaky_relu_cpu"
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(d)}'")
    if lower > upper:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    if training:
        _need_tensor(noise, "rrelu_with_noise", "noise", 2)
        broadcast_pair(input._shape, noise._shape)
    return Spec((input._shape, d, input._device))


def _rrelu_ref(spec, a, noise, lower, upper, training):
    x = _arg(a, _compute_np(spec.dtype))
    slope = _arg(noise, x.dtype) if training else (lower + upper) / 2.0
    return np.where(x > 0, x, x * slope)


def _rrelu_backward(grad, input, noise, lower, upper, training):
    slope = noise if training else (lower + upper) / 2.0
    return (where(input > 0, grad, grad * slope), None)


@op(
    tags=("pointwise", "nn", "random"),
    meta=_rrelu_meta,
    reference=_rrelu_ref,
    backward=_rrelu_backward,
    grad_fn_name=_node_name("RreluWithNoiseBackward"),
)
def rrelu_with_noise(
    input: Tensor, noise: Tensor | None, lower: float = 1.0 / 8.0, upper: float = 1.0 / 3.0, training: bool = False
) -> Tensor:
    """Leaky ReLU with the slopes ``noise`` (training) or ``(lower + upper) / 2`` (eval) for ``x <= 0``."""


_rrelu_with_noise_ = _inplace(rrelu_with_noise, "rrelu_with_noise_")


def rrelu(
    input: Tensor,
    lower: float = 1.0 / 8.0,
    upper: float = 1.0 / 3.0,
    training: bool = False,
    inplace: bool = False,
    *,
    generator=None,
) -> Tensor:
    """Randomized leaky ReLU: in training each ``x <= 0`` gets a slope drawn uniformly from
    ``[lower, upper]`` (from ``generator``, kiln's default one when None); in eval the slope is
    ``(lower + upper) / 2``."""
    noise = None
    if training:
        _rrelu_meta(input, input, lower, upper, True)  # dtype and bounds errors before drawing
        from kiln._ops.random_ops import rand

        d = input._dtype if input._dtype is dt.float64 else dt.float32
        noise = rand(input._shape, generator=generator, dtype=d, device=input._device)
        noise = (noise * (upper - lower) + lower).to(input._dtype)
    if inplace:
        return _rrelu_with_noise_(input, noise, lower, upper, training)
    return rrelu_with_noise(input, noise, lower, upper, training)


# ---------------------------------------------------------------------------------------- glu


def _glu_meta(input, dim=-1):
    _need_tensor(input, "glu")
    if input.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    d = wrap_dim(dim, input.dim())
    n = input._shape[d]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"glu_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    shape = input._shape[:d] + (n // 2,) + input._shape[d + 1 :]
    return Spec((shape, input._dtype, input._device))


def _glu_ref(spec, a, dim=-1):
    x = _arg(a, _compute_np(spec.dtype))
    d = dim % x.ndim
    h = x.shape[d] // 2
    first = np.take(x, np.arange(h), axis=d)
    second = np.take(x, np.arange(h, 2 * h), axis=d)
    with np.errstate(over="ignore"):
        return first / (1.0 + np.exp(-second))


def _glu_backward(grad, input, dim):
    from kiln._ops.shape import cat

    d = wrap_dim(dim, input.dim())
    h = input.shape[d] // 2
    a, b = input.narrow(d, 0, h), input.narrow(d, h, h)
    s = sigmoid(b)
    ga = grad * s
    return (cat([ga, ga * a * (1.0 - s)], d),)


@_half_in_float32
def _glu_decomposed(input, dim=-1):
    """``glu`` in kiln ops: the first half of ``input`` along ``dim`` times the sigmoid of the second."""
    d = wrap_dim(dim, input.dim())
    h = input._shape[d] // 2
    return input.narrow(d, 0, h) / (exp(-input.narrow(d, h, h)) + 1.0)


@op(tags=("nn",), decompose=_glu_decomposed, meta=_glu_meta, reference=_glu_ref, backward=_glu_backward)
def glu(input: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: ``a * sigmoid(b)`` where ``a, b`` are the halves of ``input`` along ``dim``."""


# ---------------------------------------------------------------------------------------- in-place aliases


def elu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    """In-place :func:`elu`."""
    return elu(input, alpha, True)


def selu_(input: Tensor) -> Tensor:
    """In-place :func:`selu`."""
    return selu(input, True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    """In-place :func:`celu`."""
    return celu(input, alpha, True)


def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """In-place :func:`leaky_relu`."""
    return leaky_relu(input, negative_slope, True)


def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """In-place :func:`hardtanh`."""
    return hardtanh(input, min_val, max_val, True)


def threshold_(input: Tensor, threshold: float, value: float) -> Tensor:
    """In-place :func:`threshold`."""
    return _threshold_(input, threshold, value)


def rrelu_(input: Tensor, lower: float = 1.0 / 8.0, upper: float = 1.0 / 3.0, training: bool = False) -> Tensor:
    """In-place :func:`rrelu`."""
    return rrelu(input, lower, upper, training, True)
