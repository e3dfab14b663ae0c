"""Reductions: ``sum``, ``mean``, ``max``/``min`` (all three forms), ``amax``/``amin``,
``argmax``/``argmin``, ``any``/``all``, and ``sum_to_size`` (the broadcast-gradient reducer).
"""

from __future__ import annotations

import builtins
from collections import namedtuple

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import check_out_args, op, write_out
from kiln._ops._meta import reduce_dims, scalar_type_name, wrap_dim
from kiln._ops.comparison import eq, gt, lt
from kiln._ops.elementwise import _compute_np, binary_meta, binary_reference, where
from kiln._ops.views import _bare_view, _expand_meta, _varargs_shape, expand, recorded_view
from kiln._spec import DimSpec, ReductionSpec
from kiln._tensor import Tensor, _numel

TOP_LEVEL = (
    "all",
    "amax",
    "amin",
    "any",
    "argmax",
    "argmin",
    "equal",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "return_types",
    "sum",
    "sum_to_size",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

Dims = "int | tuple[int, ...] | None"


def _reduced_shape(shape: tuple, dims: tuple, keepdim: bool) -> tuple:
    if len(dims) == len(shape) and not keepdim:  # dims are unique: all of them
        return ()
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def expand_reduced(grad: Tensor, shape: tuple, dims: tuple, keepdim: bool) -> Tensor:
    """Broadcast a reduction's gradient back to the input ``shape`` (a view, no copy)."""
    if not keepdim and shape and len(dims) < len(shape):  # a full reduction expands from 0-d directly
        for d in dims:
            grad = grad.unsqueeze(d)
    if grad.__class__ is Tensor:
        if not grad._shape:  # a full reduction's: every stride 0, a geometry valid for any shape (no meta to run)
            return recorded_view(expand, grad, (shape,), shape, (0,) * len(shape), grad._offset)
        return _bare_view(expand, _expand_meta, grad, shape)  # Tensor.expand without its argument parsing
    return grad.expand(shape)


def _check_input(input, name):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")


def _np_axes(a: np.ndarray, dims: tuple):
    return dims if a.ndim else None


# ---------------------------------------------------------------------------------------- sum / mean


def _reduction_node_name(args) -> str:
    """PyTorch names the all-elements overload ``...Backward0`` and the ``dim`` overload ``...Backward1``."""
    return "0" if args[1] is None else "1"


def _sum_meta(input, dim=None, keepdim=False, dtype=None):
    _check_input(input, "sum")
    dims = reduce_dims(dim, len(input._shape))
    if dtype is None:
        dtype = input._dtype if input._dtype.is_floating_point else dt.int64
    return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), dtype, input._device, dims))


def _sum_ref(spec, a, dim=None, keepdim=False, dtype=None):
    compute = _compute_np(spec.dtype)
    # np.add.reduce is what np.sum runs on an array, without np.sum's Python layer
    return np.add.reduce(a, axis=_np_axes(a, spec.dims), dtype=compute, keepdims=keepdim)


def _sum_backward(grad, input_shape, dim, keepdim):
    return expand_reduced(grad, input_shape, reduce_dims(dim, len(input_shape)), keepdim)


@op(
    tags=("reduction",),
    meta=_sum_meta,
    reference=_sum_ref,
    backward=_sum_backward,
    autocast="fp32_float16",
    methods=("sum",),
    grad_fn_name=lambda args: "SumBackward" + _reduction_node_name(args),
)
def sum(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: dt.dtype | None = None) -> Tensor:  # noqa: A001
    """Sum of all elements, or over ``dim`` (an int or tuple); integers sum to int64."""


def _mean_meta(input, dim=None, keepdim=False, dtype=None):
    _check_input(input, "mean")
    d = dtype or input._dtype
    if not d.is_floating_point:
        raise RuntimeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
            f"Got: {scalar_type_name(d)}"
        )
    dims = reduce_dims(dim, len(input._shape))
    return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), d, input._device, dims))


def _mean_ref(spec, a, dim=None, keepdim=False, dtype=None):
    compute = _compute_np(spec.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        if a.size == 0:
            return np.full(spec.shape, np.nan, compute)
        return np.mean(a, axis=_np_axes(a, spec.dims), keepdims=keepdim, dtype=compute)


def _mean_backward(grad, input_shape, dim, keepdim):
    dims = reduce_dims(dim, len(input_shape))
    count = 1
    for d in dims:
        count *= input_shape[d] if input_shape else 1
    return expand_reduced(grad, input_shape, dims, keepdim) / builtins.max(count, 1)


def _mean_decomposed(input, dim=None, keepdim=False, *, dtype=None):
    """``mean`` in kiln ops: the sum (in float32 for half precision) over the element count."""
    d = dtype or input._dtype
    compute = dt.float32 if d in (dt.float16, dt.bfloat16) else d
    count = 1
    for i in reduce_dims(dim, len(input._shape)):
        count *= input._shape[i] if input._shape else 1
    return (sum(input, dim, keepdim, dtype=compute) / count).to(d)


@op(
    decompose=_mean_decomposed,
    tags=("reduction",),
    meta=_mean_meta,
    reference=_mean_ref,
    backward=_mean_backward,
    methods=("mean",),
    grad_fn_name=lambda args: "MeanBackward" + _reduction_node_name(args),
)
def mean(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: dt.dtype | None = None) -> Tensor:
    """Mean of all elements, or over ``dim``; floating point inputs only."""


# ---------------------------------------------------------------------------------------- amax / amin


def _extreme_meta(name):
    def meta(input, dim=(), keepdim=False):
        _check_input(input, name)
        if dim == () and _numel(input._shape) == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction "
                "dim with the 'dim' argument."
            )
        dims = reduce_dims(None if dim == () else dim, len(input._shape))
        for d in dims:
            if input._shape and input._shape[d] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), input._dtype, input._device, dims))

    return meta


def _extreme_ref(np_fn):
    def ref(spec, a, dim=(), keepdim=False):
        compute = _compute_np(spec.dtype)
        return np_fn(a.astype(compute, copy=False), axis=_np_axes(a, spec.dims), keepdims=keepdim)

    return ref


def _extreme_backward(grad, input, dim, keepdim, result):
    dims = reduce_dims(None if dim == () else dim, len(input._shape))
    mask = eq(input, expand_reduced(result, input._shape, dims, keepdim))
    count = sum(mask, dims, True) if input._shape else 1
    return where(mask, expand_reduced(grad, input._shape, dims, keepdim) / count, 0.0)


def _all_extreme_backward(grad, input, result):
    """``max(input)``/``min(input)``: shared evenly by the elements equal to the result, or by the NaNs
    when the result is NaN (PyTorch's rule; ``amax`` gives NaNs no gradient)."""
    from kiln._ops.elementwise import isnan

    mask = eq(input, result) | (isnan(input) & isnan(result))
    return where(mask, grad / sum(mask), 0.0)


@op(
    tags=("reduction",),
    meta=_extreme_meta("amax"),
    reference=_extreme_ref(np.max),
    backward=_extreme_backward,
    methods=("amax",),
)
def amax(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """Maximum over ``dim`` (all dims by default); the gradient is shared evenly between ties."""


@op(
    tags=("reduction",),
    meta=_extreme_meta("amin"),
    reference=_extreme_ref(np.min),
    backward=_extreme_backward,
    methods=("amin",),
)
def amin(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """Minimum over ``dim`` (all dims by default); the gradient is shared evenly between ties."""


# ---------------------------------------------------------------------------------------- max/min with dim


def _dim_extreme_meta(name):
    def meta(input, dim, keepdim=False):
        _check_input(input, name)
        d = wrap_dim(dim, len(input._shape))
        if input._shape and input._shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        shape = _reduced_shape(input._shape, (d,), keepdim)
        return (DimSpec((shape, input._dtype, input._device, d)), DimSpec((shape, dt.int64, input._device, d)))

    return meta


def _dim_extreme_ref(arg_fn):
    def ref(spec, a, dim, keepdim=False):
        d = spec[0].dim
        if a.ndim == 0:
            return a.copy(), np.zeros((), np.int64)
        idx = arg_fn(a, axis=d, keepdims=True)
        values = np.take_along_axis(a, idx, axis=d)
        if not keepdim:
            idx = np.squeeze(idx, axis=d)
            values = np.squeeze(values, axis=d)
        return values, idx

    return ref


def _nan_aware(arg_fn):
    # PyTorch propagates NaN: a NaN is the max (and the min) wherever one occurs.
    def fn(a, axis, keepdims):
        if a.dtype.kind == "f":
            nan = np.isnan(a)
            if nan.any():
                first_nan = np.argmax(nan, axis=axis, keepdims=keepdims)
                plain = arg_fn(np.where(nan, 0, a), axis=axis, keepdims=keepdims)
                return np.where(np.any(nan, axis=axis, keepdims=keepdims), first_nan, plain)
        return arg_fn(a, axis=axis, keepdims=keepdims)

    return fn


_argmax_np = _nan_aware(np.argmax)
_argmin_np = _nan_aware(np.argmin)


def _dim_extreme_backward(grads, input_shape, input_device, dim, keepdim, result):
    from kiln._ops.creation import arange

    grad = grads[0]
    nd = len(input_shape)
    if nd == 0:
        return grad
    d = wrap_dim(dim, nd)
    indices = result[1]
    if not keepdim:
        grad = grad.unsqueeze(d)
        indices = indices.unsqueeze(d)
    positions = arange(input_shape[d], device=input_device).reshape((-1,) + (1,) * (nd - 1 - d))
    return where(eq(positions, indices), grad, 0.0)


def _dim_extreme_decomposed(arg_op):
    def decomposed(input, dim, keepdim=False):
        """``_max_dim``/``_min_dim`` in kiln ops: the ``argmax``/``argmin`` indices (the first NaN wins, as
        in PyTorch) and the values gathered at them."""
        from kiln._ops.creation import zeros
        from kiln._ops.gather_scatter import gather

        if not input._shape:
            return input, zeros((), dtype=dt.int64, device=input._device)
        d = wrap_dim(dim, len(input._shape))
        idx = arg_op(input.to(dt.uint8) if input._dtype is dt.bool else input, d, True)
        values = gather(input, d, idx)
        return (values, idx) if keepdim else (values.squeeze(d), idx.squeeze(d))

    return decomposed


_max_dim_decomposed = _dim_extreme_decomposed(lambda *a: argmax(*a))
_min_dim_decomposed = _dim_extreme_decomposed(lambda *a: argmin(*a))


@op(
    decompose=_max_dim_decomposed,
    tags=("reduction",),
    meta=_dim_extreme_meta("max"),
    reference=_dim_extreme_ref(_argmax_np),
    backward=_dim_extreme_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="MaxBackward0",
)
def _max_dim(input: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """Maximum values and their indices along ``dim``."""


@op(
    decompose=_min_dim_decomposed,
    tags=("reduction",),
    meta=_dim_extreme_meta("min"),
    reference=_dim_extreme_ref(_argmin_np),
    backward=_dim_extreme_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="MinBackward0",
)
def _min_dim(input: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """Minimum values and their indices along ``dim``."""


def _return_type(name: str, fields: tuple[str, ...] = ("values", "indices")):
    """A named tuple printed as PyTorch prints ``torch.return_types.<name>``."""
    base = namedtuple(name, fields)

    def __repr__(self) -> str:
        body = ",\n".join(f"{f}={getattr(self, f)!r}" for f in fields)
        return f"kiln.return_types.{name}(\n{body})"

    doc = f"``({', '.join(fields)})`` of ``{name}``."
    cls = type(name, (base,), {"__slots__": (), "__repr__": __repr__, "__doc__": doc})
    cls.__module__ = "kiln.return_types"
    return cls


class return_types:  # noqa: N801 - mirrors torch.return_types
    """Named tuples returned by reductions with indices (``values``, ``indices``)."""

    max = _return_type("max")
    min = _return_type("min")


def _binary_extreme_backward(loses):
    """Backward of maximum (``loses`` = ``lt``) or minimum (``gt``), PyTorch's rule: ties share the
    gradient, and a side not strictly beaten keeps it (so a NaN, unordered, gets it on both sides)."""

    def backward(grad, input, other, needs_input_grad):
        shared = where(eq(input, other), grad / 2, grad)
        return (
            where(loses(input, other), 0.0, shared) if needs_input_grad[0] else None,
            where(loses(other, input), 0.0, shared) if needs_input_grad[1] else None,
        )

    return backward


def _binary_extreme_meta(name):
    base = binary_meta(name)

    def meta(input, other):
        if not isinstance(other, Tensor):
            raise TypeError(f"{name}(): argument 'other' (position 2) must be Tensor, not {type(other).__name__}")
        return base(input, other)

    return meta


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_binary_extreme_meta("maximum"),
    reference=binary_reference(np.maximum),
    backward=_binary_extreme_backward(lt),
    methods=("maximum",),
)
def maximum(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise maximum of two tensors (NaN propagates), broadcasting."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_binary_extreme_meta("minimum"),
    reference=binary_reference(np.minimum),
    backward=_binary_extreme_backward(gt),
    methods=("minimum",),
)
def minimum(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise minimum of two tensors (NaN propagates), broadcasting."""


def _extreme(name, all_op, dim_op, binary_op, tuple_type):
    def compute(input, dim, keepdim, other):
        if other is not None:
            return binary_op(input, other)
        if isinstance(dim, Tensor):
            return binary_op(input, dim)
        if dim is None:
            if keepdim:
                raise TypeError(f"{name}() received an invalid combination of arguments - got keepdim without dim")
            return all_op(input)
        return tuple_type(*dim_op(input, dim, keepdim))

    def fn(input, dim=None, keepdim=False, *, other=None, out=None):
        if out is None:
            return compute(input, dim, keepdim, other)
        check_out_args(name, (input, dim, other))
        return write_out(name, compute(input, dim, keepdim, other), out)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _max_all_decomposed(input, dim=(), keepdim=False):
    """``_max_all`` in kiln ops: ``amax`` (the same reduction under another autograd node)."""
    return amax(input, dim, keepdim)


def _min_all_decomposed(input, dim=(), keepdim=False):
    """``_min_all`` in kiln ops: ``amin``."""
    return amin(input, dim, keepdim)


@op(
    decompose=_max_all_decomposed,
    tags=("reduction",),
    meta=_extreme_meta("max"),
    reference=_extreme_ref(np.max),
    backward=_all_extreme_backward,
    grad_fn_name="MaxBackward1",
)
def _max_all(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """Maximum of all elements (``max(input)``; ``amax`` under PyTorch's node name for it)."""


@op(
    decompose=_min_all_decomposed,
    tags=("reduction",),
    meta=_extreme_meta("min"),
    reference=_extreme_ref(np.min),
    backward=_all_extreme_backward,
    grad_fn_name="MinBackward1",
)
def _min_all(input: Tensor, dim: Dims = (), keepdim: bool = False) -> Tensor:
    """Minimum of all elements (``min(input)``)."""


max = _extreme("max", _max_all, _max_dim, maximum, return_types.max)  # noqa: A001
max.__doc__ = """Maximum: ``max(input)`` of all elements, ``max(input, dim, keepdim=False)`` as (values, indices),
or ``max(input, other)`` elementwise (like :func:`maximum`)."""
min = _extreme("min", _min_all, _min_dim, minimum, return_types.min)  # noqa: A001
min.__doc__ = """Minimum: ``min(input)`` of all elements, ``min(input, dim, keepdim=False)`` as (values, indices),
or ``min(input, other)`` elementwise (like :func:`minimum`)."""
Tensor.max = max
Tensor.min = min


def _arg_meta(name):
    def meta(input, dim=None, keepdim=False):
        _check_input(input, name)
        if input._dtype is dt.bool:
            raise RuntimeError(f"{name}(): does not support bool input")
        if dim is None:
            if _numel(input._shape) == 0:
                raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
            return DimSpec(((1,) * len(input._shape) if keepdim else (), dt.int64, input._device, None))
        d = wrap_dim(dim, len(input._shape))
        if input._shape and input._shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        return DimSpec((_reduced_shape(input._shape, (d,), keepdim), dt.int64, input._device, d))

    return meta


def _arg_ref(arg_np):
    def ref(spec, a, dim=None, keepdim=False):
        if spec.dim is None:
            r = arg_np(a.reshape(-1), axis=0, keepdims=False)
            return np.reshape(r, spec.shape)
        if a.ndim == 0:
            return np.zeros((), np.int64)
        return arg_np(a, axis=spec.dim, keepdims=keepdim)

    return ref


@op(tags=("reduction",), meta=_arg_meta("argmax"), reference=_arg_ref(_argmax_np), methods=("argmax",))
def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (of the flattened tensor when ``dim`` is None)."""


@op(tags=("reduction",), meta=_arg_meta("argmin"), reference=_arg_ref(_argmin_np), methods=("argmin",))
def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (of the flattened tensor when ``dim`` is None)."""


# ---------------------------------------------------------------------------------------- any / all


def _bool_reduce_meta(input, dim=None, keepdim=False):
    _check_input(input, "any")
    dims = reduce_dims(dim, len(input._shape))
    # PyTorch keeps uint8 for uint8 inputs (a legacy of masks), bool otherwise
    out = dt.uint8 if input._dtype is dt.uint8 else dt.bool
    return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), out, input._device, dims))


def _any_decomposed(input, dim=None, keepdim=False):
    """``any`` in kiln ops: whether the count of nonzero elements is positive (uint8 for uint8 inputs)."""
    _, out, _, dims = _bool_reduce_meta(input, dim, keepdim)
    return gt(sum(_ne_zero(input), dims, keepdim), 0).to(out)


def _ne_zero(input):
    from kiln._ops.comparison import ne

    return ne(input, 0)


@op(
    decompose=_any_decomposed,
    tags=("reduction",),
    meta=_bool_reduce_meta,
    reference=lambda spec, a, dim=None, keepdim=False: np.any(a, axis=_np_axes(a, spec.dims), keepdims=keepdim),
    methods=("any",),
)
def any(input: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True if any element (over ``dim``) is nonzero."""


def _all_decomposed(input, dim=None, keepdim=False):
    """``all`` in kiln ops: whether the count of zero elements is zero (uint8 for uint8 inputs)."""
    _, out, _, dims = _bool_reduce_meta(input, dim, keepdim)
    return eq(sum(eq(input, 0), dims, keepdim), 0).to(out)


@op(
    decompose=_all_decomposed,
    tags=("reduction",),
    meta=_bool_reduce_meta,
    reference=lambda spec, a, dim=None, keepdim=False: np.all(a, axis=_np_axes(a, spec.dims), keepdims=keepdim),
    methods=("all",),
)
def all(input: Tensor, dim: Dims = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True if every element (over ``dim``) is nonzero."""


# ---------------------------------------------------------------------------------------- sum_to_size


def sum_to_size(input: Tensor, *size) -> Tensor:
    """Sum ``input`` down to ``size``, which it must be expandable from (undoes broadcasting)."""
    return sum_to(input, _varargs_shape(size))


def sum_to(input: Tensor, shape: tuple, view: bool = True) -> Tensor:
    """:func:`sum_to_size` to the tuple ``shape``. As PyTorch's, the result of a sum over leading dims is a
    view of the kept-dims sum; with ``view=False`` (autograd's reduction of a broadcast gradient) such a sum
    drops them itself, so that the gradient is no view and a leaf's ``.grad`` takes it without a copy."""
    if not shape:  # PyTorch's sum of every element: a new tensor, even of a 0-d input
        return sum(input)
    if shape == input._shape:
        return input
    lead = len(input._shape) - len(shape)
    ok = lead >= 0 and builtins.all(s == 1 or s == input._shape[lead + i] for i, s in enumerate(shape))
    if not ok:
        raise RuntimeError(f"size {{{list(shape)}}} is not expandable to size {{{list(input._shape)}}}.")
    inner = tuple(lead + i for i, s in enumerate(shape) if s == 1 and input._shape[lead + i] != 1)
    if not view and lead and not inner:
        return sum(input, tuple(range(lead)))
    dims = tuple(range(lead)) + inner
    r = sum(input, dims, True) if dims else input
    return r if r._shape == shape else r.view(shape)


Tensor.sum_to_size = sum_to_size


# ---------------------------------------------------------------------------------------- equal


def equal(input: Tensor, other: Tensor) -> bool:
    """``True`` if ``input`` and ``other`` have the same size and elements (a Python bool, as
    ``torch.equal``): the elements are compared as ``eq`` compares them, after type promotion, so
    ``equal(tensor([1, 2]), tensor([1.0, 2.0]))`` is ``True`` and NaN never equals NaN."""
    for pos, (name, x) in enumerate((("input", input), ("other", other)), 1):
        if not isinstance(x, Tensor):
            raise TypeError(f"equal(): argument '{name}' (position {pos}) must be Tensor, not {type(x).__name__}")
    if input._shape != other._shape:
        return False
    return builtins.bool(all(eq(input.detach(), other.detach())).item())


Tensor.equal = equal
