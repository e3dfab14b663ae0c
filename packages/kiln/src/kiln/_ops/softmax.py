"""nn primitives: the softmax family (``softmax``, ``log_softmax``, ``softmin``; ``torch.nn.functional`` names).

Fused ops (each with a NumPy reference and a backward formula written in kiln ops, so higher-order
gradients work): ``_softmax`` / ``_log_softmax`` (``SoftmaxBackward0`` / ``LogSoftmaxBackward0``).
Their backward passes are fused ops too, as in PyTorch: ``_softmax_backward_data`` and
``_log_softmax_backward_data``; a backend accelerates a training step by giving each a kernel. Each
reference computes what the composite formula in kiln ops (``_softmax_backward``,
``_log_softmax_backward``) computes; their own backward (double backward) re-runs that composite under
autograd (:func:`_vjp_of_composite`, also used by the normalization backward), so gradients of any
order need no hand-written derivative. ``softmin`` is composed of ops as PyTorch composes it.

Also the small argument checks the other nn modules share (``_check_tensor``, ``_require_float``,
``_shape_list``).
"""

from __future__ import annotations

import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name, wrap_dim
from kiln._ops.elementwise import _compute_np, exp
from kiln._ops.reduction import sum as _sum
from kiln._spec import DimSpec
from kiln._state import state
from kiln._tensor import Tensor, _numel

__all__ = ["softmax", "log_softmax", "softmin"]

TOP_LEVEL = (
    "_tensor_log_softmax as log_softmax",
    "_tensor_softmax as softmax",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does); ``"x as y"`` where the top-level
function differs from the ``kiln.nn.functional`` one of the same name."""


_HALF = (dt.float16, dt.bfloat16)


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
        return DimSpec((input._shape, input._dtype, input._device, d))

    return meta


def _softmax_ref(log: bool):
    def ref(spec, a, dim):
        compute = _compute_np(spec.dtype)
        x = a.astype(compute, copy=False)
        if x.ndim == 0:
            x = x.reshape(1)
        axis = spec.dim if a.ndim else 0
        if x.size == 0:
            return np.empty(spec.shape, compute)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            # subtracting the max keeps exp in range; an all -inf row gives NaN, as in PyTorch
            z = x - np.max(x, axis=axis, keepdims=True)
            e = np.exp(z)
            s = np.sum(e, axis=axis, keepdims=True)
            r = z - np.log(s) if log else e / s
        return r.reshape(spec.shape)

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
            xs.append(t.view_as(t) if create and t.requires_grad else t.detach().requires_grad_(True))
        outs = formula(*xs) if targets else ()
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [(o, c) for o, c in zip(outs, cotangents) if o is not None and c is not None and o.requires_grad]
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
        return DimSpec((output._shape, dt.float32 if dtype in _HALF else dtype, output._device, d))

    return meta


def _softmax_bwd_ref(log: bool):
    def ref(spec, grad_output, output, dim):
        compute = _compute_np(spec.dtype)
        g = grad_output.astype(compute, copy=False)
        y = output.astype(compute, copy=False)
        axis = spec.dim
        if y.ndim == 0:
            g, y, axis = g.reshape(1), y.reshape(1), 0
        if log:
            r = g - np.exp(y) * np.sum(g, axis=axis, keepdims=True, dtype=compute)
        else:
            r = y * (g - np.sum(g * y, axis=axis, keepdims=True, dtype=compute))
        return r.reshape(spec.shape)

    return ref


def _softmax_bwd_backward(grad, grad_output, output, dim, needs_input_grad):
    return _vjp_of_composite(
        lambda g, y: _softmax_backward(g, dim, y), (grad_output, output), (grad,), needs_input_grad
    )


def _log_softmax_bwd_backward(grad, grad_output, output, dim, needs_input_grad):
    return _vjp_of_composite(
        lambda g, y: _log_softmax_backward(g, dim, y), (grad_output, output), (grad,), needs_input_grad
    )


def _softmax_backward_data_decomposed(grad_output, output, dim):
    """``_softmax_backward_data`` in kiln ops: the composite :func:`_softmax_backward`."""
    return _softmax_backward(grad_output, dim, output).to(_bwd_dtype(grad_output, output))


def _log_softmax_backward_data_decomposed(grad_output, output, dim):
    """``_log_softmax_backward_data`` in kiln ops: the composite :func:`_log_softmax_backward`."""
    return _log_softmax_backward(grad_output, dim, output).to(_bwd_dtype(grad_output, output))


def _bwd_dtype(grad_output, output):
    dtype = dt.promote_types(grad_output._dtype, output._dtype)
    return dt.float32 if dtype in _HALF else dtype


@op(
    decompose=_softmax_backward_data_decomposed,
    tags=("nn", "backward", "fused"),
    meta=_softmax_bwd_meta("_softmax_backward_data"),
    reference=_softmax_bwd_ref(False),
    backward=_softmax_bwd_backward,
    grad_fn_name="SoftmaxBackwardDataBackward0",
)
def _softmax_backward_data(grad_output: Tensor, output: Tensor, dim: int) -> Tensor:
    """Softmax's input gradient from its ``output`` ``y``: ``y * (grad_output - sum(grad_output * y))``
    along ``dim`` (half precision computed and returned in float32)."""


@op(
    decompose=_log_softmax_backward_data_decomposed,
    tags=("nn", "backward", "fused"),
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


def _softmax_decomposed(input, dim, *, log=False):
    """``_softmax`` in kiln ops: ``exp(x - max) / sum(exp(x - max))`` (half precision computed in float32)."""
    from kiln._ops.elementwise import log as _log
    from kiln._ops.reduction import amax

    d = wrap_dim(dim, len(input._shape))
    dtype = input._dtype
    if _numel(input._shape) == 0:
        return input.clone()
    x = input.to(dt.float32) if dtype in _HALF else input
    z = x - amax(x, d, True)
    e = exp(z)
    s = _sum(e, d, True)
    r = z - _log(s) if log else e / s
    return r.to(dtype)


def _log_softmax_decomposed(input, dim):
    """``_log_softmax`` in kiln ops: ``(x - max) - log(sum(exp(x - max)))``."""
    return _softmax_decomposed(input, dim, log=True)


@op(
    decompose=_softmax_decomposed,
    tags=("nn", "fused"),
    meta=_softmax_meta("softmax"),
    reference=_softmax_ref(False),
    backward=_softmax_grad,
    autocast="fp32_float16",
    grad_fn_name="SoftmaxBackward0",
)
def _softmax(input: Tensor, dim: int) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``, computed stably (the max is subtracted first)."""


@op(
    decompose=_log_softmax_decomposed,
    tags=("nn", "fused"),
    meta=_softmax_meta("log_softmax"),
    reference=_softmax_ref(True),
    backward=_log_softmax_grad,
    autocast="fp32_float16",
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


def _tensor_softmax(input, dim, dtype=None):
    """Softmax along ``dim`` (``torch.softmax`` / ``Tensor.softmax``)."""
    return _softmax(input if dtype is None else input.to(dtype), dim)


def _tensor_log_softmax(input, dim, dtype=None):
    """Log-softmax along ``dim`` (``torch.log_softmax`` / ``Tensor.log_softmax``)."""
    return _log_softmax(input if dtype is None else input.to(dtype), dim)


Tensor.softmax = _tensor_softmax
Tensor.log_softmax = _tensor_log_softmax
