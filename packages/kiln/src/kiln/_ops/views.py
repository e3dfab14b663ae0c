"""View ops: ``view``, ``permute``, ``expand``, ``squeeze``/``unsqueeze``, basic indexing, and the
composites built on them (``reshape``, ``transpose``, ``flatten``...).

A view is new metadata over the same storage and version counter; its kernel is the same on every
device (``device_generic``), because it never touches data.
"""

from __future__ import annotations

import numbers
import operator

import numpy as np

from kiln import _dispatch
from kiln import _dtype as dt
from kiln._dispatch import SparseArgument, op, runs_bare
from kiln._memory_format import check_memory_format, contiguous_format, preserve_format
from kiln._ops._meta import wrap_dim
from kiln._spec import Spec, StridedSpec
from kiln._state import away, modes_away, state
from kiln._tensor import Tensor, _make, _numel, contiguous_strides, storage_span

TOP_LEVEL = (
    "broadcast_to",
    "clone",
    "contiguous",
    "expand",
    "flatten",
    "narrow",
    "permute",
    "ravel",
    "reshape",
    "select",
    "squeeze",
    "swapaxes",
    "swapdims",
    "t",
    "transpose",
    "unsqueeze",
    "view",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

Shape = "tuple[int, ...]"


def make_view(base: Tensor, shape: tuple, stride: tuple, offset: int) -> Tensor:
    """A tensor aliasing ``base``'s storage with new geometry (shares the version counter)."""
    v = _make(base._storage, shape, stride, offset, base._dtype, base._device, base._vc)
    v._base = base if base._base is None else base._base
    v._view_vc = base._vc[0]  # the version at which v's history is current (see autograd.graph._edge)
    # 1: made under no_grad, 2: under inference_mode, of a base that requires grad (0: neither)
    v._nograd_view = (
        (2 if state.inference else 1) if v._base._requires_grad and away[0] and not state.grad_enabled else 0
    )
    v._inference = base._inference  # a view of an inference tensor is one, whatever the mode (PyTorch's rule)
    return v


def nograd_view_error(view: Tensor, base_written: bool) -> RuntimeError:
    """PyTorch's error for a view made under no_grad or inference_mode (``view._nograd_view``) of a base that
    requires grad, written in place with grad mode on (``base_written``: the base or another of its views)."""
    inference = view._nograd_view == 2
    mode, block = ("inference", "inference_mode") if inference else ("no_grad", "no_grad")
    what = "its base or another view of its base has been modified" if base_written else "is being modified"
    when = "in normal mode" if inference else "with grad mode enabled"
    return RuntimeError(
        f"A view was created in {mode} mode and {what} inplace {when}. Given that this use case is ambiguous and "
        "error-prone, it is forbidden. You can clarify your code by moving both the view and the inplace either "
        f"both inside the {block} block (if you don't want the inplace to be tracked) or both outside (if you want "
        "the inplace to be tracked)."
    )


def _view_kernel(spec, input, *args):
    shape, _dtype, _dev, stride, offset = spec
    return make_view(input, shape, stride, offset)


def _shape_arg(size, name: str = "size") -> tuple[int, ...]:
    """``size`` (an int, a 0-d integer tensor, or a sequence of ints: NumPy ints and 0-d integer tensors
    count, as anything with ``__index__``) as a tuple of ints, with PyTorch's TypeError for anything else
    (a float or a bool among the sizes: PyTorch refuses ``t.reshape(2.0, 4)``); ``name`` is the argument's
    name in the error."""
    if isinstance(size, tuple):  # the common case (a Size too), checked without building a new tuple
        for s in size:
            if s.__class__ is not int or not _INT64_MIN <= s < _INT64_END:
                break
        else:
            return size if size.__class__ is tuple else tuple(size)
    if (isinstance(size, (int, numbers.Integral)) and not isinstance(size, bool)) or (
        isinstance(size, Tensor) and not size._shape
    ):
        size = (size,)
    try:
        items = tuple(size)
    except TypeError:
        raise TypeError(f"argument '{name}' must be tuple of ints, not {type(size).__name__}") from None
    shape = []
    for i, s in enumerate(items):
        try:
            if isinstance(s, (bool, np.bool_)):
                raise TypeError
            shape.append(operator.index(s))
        except TypeError:
            raise TypeError(
                f"argument '{name}' must be tuple of ints, but found element of type {type(s).__name__} at pos {i}"
            ) from None
    shape = tuple(shape)
    if shape and (max(shape) >= _INT64_END or min(shape) < -_INT64_END):  # what a C++ int64 holds
        i = next(i for i, s in enumerate(shape) if not -_INT64_END <= s < _INT64_END)
        raise TypeError(
            f"argument '{name}' failed to unpack the object at pos {i + 1} with error \"Overflow when unpacking "
            'long long"'
        )
    return shape


_INT64_END = 2**63  # PyTorch parses sizes into C++ int64s
_INT64_MIN = -_INT64_END  # (a constant: negating the big int on every call costs an allocation)


def check_storage_size(shape: tuple, dtype, stride: tuple | None = None) -> None:
    """PyTorch's error for a tensor whose bytes would not fit in an int64 (before any allocation)."""
    end = _numel(shape) if stride is None else storage_span(shape, stride)
    if end * dtype.itemsize >= _INT64_END:
        where = f"sizes={list(shape)}" + ("" if stride is None else f" and strides={list(stride)}")
        raise RuntimeError(f"Storage size calculation overflowed with {where}")


def _varargs_shape(size: tuple, name: str = "size") -> tuple[int, ...]:
    """``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` all mean shape (2, 3) (``name``: the argument's name in
    :func:`_shape_arg`'s errors)."""
    if len(size) == 1:
        first = size[0]
        # a tuple (a Size too) is tested first: tested against numbers.Integral it ran the ABC's Python check
        if isinstance(first, tuple) or not isinstance(first, (int, numbers.Integral)):
            return _shape_arg(first, name)
    return _shape_arg(size, name)


def infer_size(shape: tuple, numel: int) -> tuple[int, ...]:
    """Resolve one ``-1`` in ``shape`` for ``numel`` elements, with PyTorch's errors."""
    infer = None
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            if infer is not None:
                raise RuntimeError("only one dimension can be inferred")
            infer = i
        elif s < 0:
            raise RuntimeError(f"invalid shape dimension {s} at index {i} of shape {list(shape)}")
        else:
            known *= s
    if infer is not None:
        if known == 0:
            raise RuntimeError(
                f"cannot reshape tensor of {numel} elements into shape {list(shape)} because the unspecified "
                "dimension size -1 can be any value and is ambiguous"
            )
        if numel % known == 0:
            shape = shape[:infer] + (numel // known,) + shape[infer + 1 :]
            return shape
    elif known == numel:
        return shape
    raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")


def view_strides(old_shape: tuple, old_stride: tuple, new_shape: tuple) -> tuple | None:
    """Strides that view ``old`` geometry as ``new_shape`` without copying, or None if impossible."""
    if old_stride == contiguous_strides(old_shape):  # the common case: row-major stays row-major
        return contiguous_strides(new_shape)
    numel = _numel(old_shape)
    if numel == 0 or numel == 1:
        return contiguous_strides(new_shape)
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_stride[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[tensor_d]
        if tensor_d == 0 or (old_shape[tensor_d - 1] != 1 and old_stride[tensor_d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base = old_stride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_stride)


# ---------------------------------------------------------------------------------------- view


def _view_geometry(input, size: tuple) -> tuple[tuple, tuple]:
    """The shape and strides of ``input.view(size)``, ``size`` a tuple of ints (one may be -1), with
    PyTorch's errors."""
    shape = infer_size(size, _numel(input._shape))
    stride = view_strides(input._shape, input._stride, shape)
    if stride is None:
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension spans across "
            "two contiguous subspaces). Use .reshape(...) instead."
        )
    return shape, stride


def _view_meta(input, size):
    shape, stride = _view_geometry(input, _shape_arg(size))
    return StridedSpec((shape, input._dtype, input._device, stride, input._offset))


@op(
    meta=_view_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, input_shape: grad.reshape(input_shape),
)
def view(input: Tensor, size: Shape) -> Tensor:
    """A view of ``input`` with a new shape (one ``-1`` is inferred); never copies."""


def _tensor_view(self, *shape):
    """View with a new shape: ``t.view(2, 3)``, ``t.view((2, -1))``; ``t.view(dtype)`` reinterprets the bytes."""
    if len(shape) != 1:  # t.view(2, 3): sizes as arguments (what _varargs_shape would find, without its call)
        if not shape:
            raise TypeError(
                "view() received an invalid combination of arguments - got (), but expected one of:\n"
                " * (kiln.dtype dtype)\n * (tuple of ints size)\n"
            )
        size = _shape_arg(shape)
    elif isinstance(shape[0], dt.dtype):
        from kiln._ops.copy import view_as_dtype

        return view_as_dtype(self, shape[0])
    else:
        size = _varargs_shape(shape)
    try:  # _bare_view's path, with the sizes parsed once and no spec built: a fifth of a small view's time
        if runs_bare(self) and _generic_kernel_serves(_VIEW, self):
            shape, stride = _view_geometry(self, size)
            return make_view(self, shape, stride, self._offset)
    except SparseArgument:
        pass
    return view(self, size)


def _bare_view(public, meta, input: Tensor, size) -> Tensor:
    """``public(input, size)`` for a view op (``view``, ``expand``, basic indexing); where the dispatcher
    would only run the op's meta function and its device-generic kernel (:func:`_runs_view_kernel`), those
    two alone: the dispatcher was a third of a small view's time."""
    try:
        if runs_bare(input) and _generic_kernel_serves(public.op, input):  # _runs_view_kernel, a frame less
            spec = meta(input, size)
            return make_view(input, spec[0], spec[3], spec[4])  # _view_kernel's view, a frame less
    except SparseArgument:  # a sparse tensor: the dispatcher hands it to its sparse implementation
        pass
    return public(input, size)


def recorded_view(public, input: Tensor, args: tuple, shape: tuple, stride: tuple, offset: int) -> Tensor:
    """``public(input, *args)`` for a view op whose result's geometry (``shape``, ``stride``, ``offset``) the
    caller knows to be valid: the view and, when autograd records, the op's node, as the dispatcher makes them,
    without the op's meta function (its argument checks) and the dispatcher, unless a dispatch mode is on
    this thread or a plugin kernel serves ``input``'s device. Autograd re-derives views this way after an
    in-place write (``s[i] = y`` spent a sixth of its time in the checks and dispatch of that view)."""
    opdef = public.op
    if (not modes_away[0] or not (state.pre_autograd_modes or state.post_autograd_modes)) and _generic_kernel_serves(
        opdef, input
    ):
        v = make_view(input, shape, stride, offset)
        if input.requires_grad and (not away[0] or state.grad_enabled):
            _dispatch._record(opdef, (input, *args), v)  # the dispatcher's own recording, as after a kernel
        return v
    return public(input, *args)


def _runs_view_kernel(public, input: Tensor) -> bool:
    """Whether the dispatcher would only run the meta function of view op ``public`` and its device-generic
    kernel on ``input``: :func:`kiln._dispatch.runs_bare`, and no plugin kernel registered for the device
    type."""
    return runs_bare(input) and _generic_kernel_serves(public.op, input)


def _generic_kernel_serves(opdef, input: Tensor) -> bool:
    """Whether a view op's device-generic kernel (its reference) serves ``input``'s device: no plugin kernel
    is registered for the device type."""
    return opdef.kernels.get(input._device.type, opdef.reference) is opdef.reference


_VIEW = view.op
Tensor.view = _tensor_view


def reshape(input: Tensor, shape) -> Tensor:
    """``input`` with a new shape: a view when the strides allow it, else a contiguous copy."""
    shape = infer_size(_shape_arg(shape, "shape"), _numel(input._shape))
    if view_strides(input._shape, input._stride, shape) is not None:
        return _bare_view(view, _view_meta, input, shape)
    return view(clone(input, memory_format=contiguous_format), shape)


def _tensor_reshape(self, *shape):
    """``t.reshape(2, 3)`` or ``t.reshape((2, -1))``: a view when possible, else a copy."""
    return reshape(self, _varargs_shape(shape, "shape"))


Tensor.reshape = _tensor_reshape


def _view_as(self, other):
    """A view of this tensor with ``other``'s shape."""
    return _bare_view(view, _view_meta, self, other._shape)


def _reshape_as(self, other):
    """This tensor reshaped to ``other``'s shape."""
    return reshape(self, other._shape)


Tensor.view_as = _view_as
Tensor.reshape_as = _reshape_as


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Collapse dims ``start_dim..end_dim`` into one (a view when possible)."""
    nd = input.dim()
    if nd == 0:
        return reshape(input, (1,))
    s, e = wrap_dim(start_dim, nd), wrap_dim(end_dim, nd)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if s == e:
        return input
    shape = input._shape[:s] + (_numel(input._shape[s : e + 1]),) + input._shape[e + 1 :]
    return reshape(input, shape)


Tensor.flatten = flatten


def ravel(input: Tensor) -> Tensor:
    """A flattened 1-D tensor (a view when possible)."""
    return reshape(input, (-1,))


Tensor.ravel = ravel

# ---------------------------------------------------------------------------------------- permute


def _permute_meta(input, dims):
    nd = len(input._shape)
    dims = tuple(wrap_dim(d, nd) for d in dims)
    if len(dims) != nd:
        raise RuntimeError(
            f"permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired "
            f"ordering of dimensions i.e. input.dim() = {nd} is not equal to len(dims) = {len(dims)}"
        )
    if len(set(dims)) != nd:
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return StridedSpec(
        (
            tuple(input._shape[d] for d in dims),
            input._dtype,
            input._device,
            tuple(input._stride[d] for d in dims),
            input._offset,
        )
    )


def _permute_backward(grad, dims):
    nd = len(dims)
    inv = [0] * nd
    for i, d in enumerate(dims):
        inv[wrap_dim(d, nd)] = i
    return permute(grad, tuple(inv))


@op(meta=_permute_meta, reference=_view_kernel, device_generic=True, tags=("view",), backward=_permute_backward)
def permute(input: Tensor, dims: Shape) -> Tensor:
    """A view with dimensions reordered by ``dims``."""


def _tensor_permute(self, *dims):
    """``t.permute(1, 0, 2)`` or ``t.permute((1, 0, 2))``: a view with dims reordered."""
    return permute(self, _varargs_shape(dims, "dims"))


Tensor.permute = _tensor_permute


def _transpose_meta(input, dim0, dim1):
    nd = len(input._shape)
    if nd == 0:
        wrap_dim(dim0, 0)
        wrap_dim(dim1, 0)
        return StridedSpec((input._shape, input._dtype, input._device, input._stride, input._offset))
    d0, d1 = wrap_dim(dim0, nd), wrap_dim(dim1, nd)
    shape, stride = list(input._shape), list(input._stride)
    shape[d0], shape[d1] = shape[d1], shape[d0]
    stride[d0], stride[d1] = stride[d1], stride[d0]
    return StridedSpec((tuple(shape), input._dtype, input._device, tuple(stride), input._offset))


@op(
    meta=_transpose_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, dim0, dim1: transpose(grad, dim0, dim1),
)
def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """A view with ``dim0`` and ``dim1`` swapped."""


swapdims = transpose


def swapaxes(input: Tensor, axis0: int, axis1: int) -> Tensor:
    """:func:`transpose` under NumPy's name and parameter names (``torch.swapaxes``)."""
    return transpose(input, axis0, axis1)


Tensor.transpose = Tensor.swapdims = transpose
Tensor.swapaxes = swapaxes


def _t_meta(input):
    if len(input._shape) > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {len(input._shape)}D")
    return _transpose_meta(input, 0, -1) if input._shape else _transpose_meta(input, 0, 0)


@op(
    meta=_t_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad: t(grad),
    methods=("t",),
)
def t(input: Tensor) -> Tensor:
    """Transpose of a tensor of at most 2 dims (a view)."""


Tensor.T = property(lambda self: permute(self, tuple(reversed(range(self.dim())))), doc="All dims reversed.")


def _mT(self):
    if self.dim() == 1:
        raise RuntimeError(
            f"tensor.mT is only supported on matrices or batches of matrices. Got {self.dim()}-D tensor."
        )
    return transpose(self, -2, -1) if self.dim() else transpose(self, 0, 0)  # 0-d: the identity, as PyTorch


Tensor.mT = property(_mT, doc="The last two dims transposed.")

# ---------------------------------------------------------------------------------------- expand


def _expand_meta(input, size):
    size = _shape_arg(size)
    nd = len(input._shape)
    if len(size) < nd:
        raise RuntimeError(
            f"expand({input.type()}{{{list(input._shape)}}}, size={list(size)}): the number of sizes provided "
            f"({len(size)}) must be greater or equal to the number of dimensions in the tensor ({nd})"
        )
    lead = len(size) - nd
    shape = []
    stride = []
    for i, s in enumerate(size):
        if i < lead:
            if s < 0:
                raise RuntimeError(
                    f"The expanded size of the tensor ({s}) isn't allowed in a leading, non-existing dimension {i}"
                )
            shape.append(s)
            stride.append(0)
            continue
        cur = input._shape[i - lead]
        if s == -1:
            s = cur
        elif s < 0:  # PyTorch's own check is an accident of its size arithmetic ("numel: ... overflow")
            raise RuntimeError(
                f"expand: the expanded size of the tensor ({s}) must be non-negative at dimension {i} (only -1 "
                f"keeps a dimension's size).  Target sizes: {list(size)}.  Tensor sizes: {list(input._shape)}"
            )
        if cur == s:
            shape.append(s)
            stride.append(input._stride[i - lead])
        elif cur == 1:
            shape.append(s)
            stride.append(0)
        else:
            raise RuntimeError(
                f"The expanded size of the tensor ({s}) must match the existing size ({cur}) at non-singleton "
                f"dimension {i}.  Target sizes: {list(size)}.  Tensor sizes: {list(input._shape)}"
            )
    if _numel(shape) >= _INT64_END:  # a view reads no memory, but its numel() must still be an int64
        raise RuntimeError(f"expand: the number of elements of the expanded shape {shape} overflows int64")
    return StridedSpec((tuple(shape), input._dtype, input._device, tuple(stride), input._offset))


@op(meta=_expand_meta, reference=_view_kernel, device_generic=True, tags=("view",), backward=lambda grad: grad)
def expand(input: Tensor, size: Shape) -> Tensor:
    """A view repeating size-1 dims to ``size`` (stride 0); ``-1`` keeps a dim."""


def _tensor_expand(self, *size):
    """``t.expand(3, -1)``: a view repeating size-1 dims (no copy)."""
    return _bare_view(expand, _expand_meta, self, _varargs_shape(size))


def _expand_as(self, other):
    """This tensor expanded to ``other``'s shape."""
    return _bare_view(expand, _expand_meta, self, other._shape)


Tensor.expand = _tensor_expand
Tensor.expand_as = _expand_as


def broadcast_to(input: Tensor, size) -> Tensor:
    """``input`` expanded to ``size`` (``torch.broadcast_to``)."""
    return expand(input, _shape_arg(size))


Tensor.broadcast_to = broadcast_to

# ---------------------------------------------------------------------------------------- squeeze


def _unsqueeze_meta(input, dim):
    nd = len(input._shape)
    d = wrap_dim(dim, nd + 1)
    st = input._stride[d] * input._shape[d] if d < nd else 1
    return StridedSpec(
        (
            input._shape[:d] + (1,) + input._shape[d:],
            input._dtype,
            input._device,
            input._stride[:d] + (st,) + input._stride[d:],
            input._offset,
        )
    )


@op(
    meta=_unsqueeze_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, dim: squeeze(grad, dim),
    methods=("unsqueeze",),
)
def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """A view with a size-1 dim inserted at ``dim``."""


def _squeeze_meta(input, dim=None):
    nd = len(input._shape)
    if dim is None:
        dims = {i for i, s in enumerate(input._shape) if s == 1}
    elif isinstance(dim, int):
        dims = {wrap_dim(dim, nd)} if nd else set()
    else:
        dims = {wrap_dim(d, nd) for d in dim} if nd else set()
    keep = [i for i in range(nd) if not (i in dims and input._shape[i] == 1)]
    return StridedSpec(
        (
            tuple(input._shape[i] for i in keep),
            input._dtype,
            input._device,
            tuple(input._stride[i] for i in keep),
            input._offset,
        )
    )


@op(
    meta=_squeeze_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, input_shape: grad.reshape(input_shape),
    methods=("squeeze",),
    grad_fn_name=lambda args: f"SqueezeBackward{0 if args[1] is None else (1 if isinstance(args[1], int) else 2)}",
)
def squeeze(input: Tensor, dim: int | tuple | None = None) -> Tensor:
    """A view without size-1 dims (all of them, or those in ``dim``)."""


# ---------------------------------------------------------------------------------------- indexing


def _normalize_key(key, ndim: int) -> tuple:
    if (key.__class__ is int or key.__class__ is slice) and ndim:  # x[i], x[a:b]: the common cases
        return (key,)
    if not isinstance(key, tuple):
        key = (key,)
    out = []
    for k in key:
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            k = int(k)
        elif not (k is None or k is Ellipsis or isinstance(k, slice)):
            raise IndexError(
                "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices "
                f"(got {type(k).__name__})"
            )
        out.append(k)
    consumed = sum(1 for k in out if k is not None and k is not Ellipsis)
    if ndim == 0 and consumed:
        raise IndexError(
            "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or `tensor.item<T>()` in C++ to "
            "convert a 0-dim tensor to a number"
        )
    if out.count(Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    if Ellipsis in out:
        i = out.index(Ellipsis)
        out[i : i + 1] = [slice(None)] * (ndim - consumed)
    return tuple(out)


def _index_node_name(args) -> str:
    """PyTorch applies an index one component at a time; the last non-trivial one names the node."""
    for k in reversed(args[1]):
        if k is None:
            return "UnsqueezeBackward0"
        if isinstance(k, int):
            return "SelectBackward0"
        if k != slice(None):
            return "SliceBackward0"
    return "SliceBackward0" if args[1] else "AliasBackward0"


def _index_meta(input, key):
    shape, stride, offset = [], [], input._offset
    dim = 0
    for k in key:
        if k is None:
            shape.append(1)
            stride.append(input._stride[dim] * input._shape[dim] if dim < len(input._shape) else 1)
        elif isinstance(k, int):
            size = input._shape[dim]
            if k < -size or k >= size:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size {size}")
            offset += (k + size if k < 0 else k) * input._stride[dim]
            dim += 1
        else:
            size = input._shape[dim]
            if k.step == 0:
                raise ValueError("slice step cannot be zero")
            if k.step is not None and k.step < 0:
                raise ValueError("step must be greater than zero")
            start, stop, step = k.indices(size)
            length = max(0, (stop - start + step - 1) // step)
            if length:
                offset += start * input._stride[dim]
            shape.append(length)
            stride.append(input._stride[dim] * step)
            dim += 1
    shape.extend(input._shape[dim:])
    stride.extend(input._stride[dim:])
    return StridedSpec((tuple(shape), input._dtype, input._device, tuple(stride), offset))


@op(
    meta=_index_meta,
    reference=_view_kernel,
    device_generic=True,
    tags=("view",),
    backward=lambda grad, input_shape, key: _index_backward(grad, input_shape, key),
    grad_fn_name=_index_node_name,
)
def _index_view(input: Tensor, key: tuple) -> Tensor:
    """Basic indexing (ints, slices, None) as a view; ``key`` is already normalised."""


def _index_backward_meta(grad, shape, key):
    return Spec((shape, grad._dtype, grad._device))


def _index_backward_kernel(spec, grad, shape, key):
    from kiln._ops.copy import copy_into
    from kiln._ops.creation import zeros

    out = zeros(shape, dtype=grad._dtype, device=grad._device)
    copy_into(call_view(out, key), grad)
    return out


def basic_index(input: Tensor, key: tuple) -> Tensor:
    """``input[key]`` for a normalised basic key (ints, slices, ``None``: :func:`_normalize_key`), a view."""
    return _bare_view(_index_view, _index_meta, input, key)


def call_view(t: Tensor, key: tuple) -> Tensor:
    """The basic-indexing view without autograd (kernels use it to write into fresh tensors)."""
    return make_view(t, *_geometry(_index_meta(t, key)))


def _geometry(spec) -> tuple:
    return spec.shape, spec.stride, spec.offset


@op(
    meta=_index_backward_meta,
    reference=_index_backward_kernel,
    device_generic=True,
    tags=("backward",),
    backward=lambda grad, key: _index_view(grad, key),
)
def _index_backward(grad: Tensor, shape: Shape, key: tuple) -> Tensor:
    """Zeros of ``shape`` with ``grad`` written at ``key`` (the gradient of basic indexing)."""


def select(input: Tensor, dim: int, index: int) -> Tensor:
    """The slice at ``index`` along ``dim`` (that dim removed), as a view."""
    d = wrap_dim(dim, input.dim())
    size = input._shape[d]
    if not -size <= index < size:
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {list(input._shape)} at dimension {d}"
        )
    return basic_index(input, (slice(None),) * d + (int(index),))


def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``length`` elements from ``start`` along ``dim``, as a view."""
    if input.dim() == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    d = wrap_dim(dim, input.dim())
    size = input._shape[d]
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    if start < 0:
        start += size
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return basic_index(input, (slice(None),) * d + (slice(start, start + length),))


Tensor.select = select
Tensor.narrow = narrow

# ---------------------------------------------------------------------------------------- copies


def _clone_meta(input, memory_format=preserve_format):
    check_memory_format("clone", memory_format)
    return Spec((input._shape, input._dtype, input._device))


def _clone_ref(spec, a, memory_format=preserve_format):
    # preserve_format (the default) keeps the input's stride order, as PyTorch does
    return np.array(a, order="C" if memory_format is contiguous_format else "K", copy=True)


@op(tags=("copy",), meta=_clone_meta, reference=_clone_ref, backward=lambda grad: grad, methods=("clone",))
def clone(input: Tensor, *, memory_format=preserve_format) -> Tensor:
    """A copy of ``input`` (same stride order unless ``memory_format=kiln.contiguous_format``), tracked by autograd."""


def contiguous(input: Tensor, memory_format=contiguous_format) -> Tensor:
    """``input`` itself when row-major contiguous, else a row-major copy."""
    return input if input.is_contiguous() else clone(input, memory_format=contiguous_format)


Tensor.contiguous = contiguous
