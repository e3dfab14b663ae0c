"""Sparse COO tensors (``torch.sparse_coo``): the layout objects, the tensor class and its constructor.

A sparse COO tensor is a :class:`kiln.Tensor` subclass that holds ``indices`` (int64, ``[sparse_dim, nnz]``),
``values`` (a dense tensor ``[nnz, *dense_sizes]`` that carries the autograd history) and its size. Every
sparse operation (``kiln._sparse_ops``) is written in differentiable kiln ops on the values (``index_add``,
``index_select``...), so gradients flow to the values, and from there to whatever made them, with no
autograd code of its own.

It has no strided storage: the dense attributes of ``Tensor`` (``_storage``, ``_shape``, ``_stride``...)
are left unset, and reading one raises :class:`kiln._dispatch.SparseArgument` (a ``NotImplementedError``).
An op's meta function reads them first, so a dense op given a sparse tensor never reaches a kernel: the
dispatcher catches the error and runs the op's sparse implementation (``matmul``, ``add``, ``mul``...) or
raises PyTorch's ``NotImplementedError`` naming the op. Dense tensors pay nothing for this.

Gradients: a sparse leaf (``requires_grad=True``) keeps its gradient on its values; ``.grad`` shows it as a
sparse tensor on the coalesced indices (for ``torch.sparse.mm``, ``to_dense``, ``sparse.sum``... the
gradient of the dense tensor masked by the sparsity pattern, as PyTorch's).
"""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._dispatch import SparseArgument
from kiln._memory_format import layout, sparse_coo, strided
from kiln._state import state
from kiln._tensor import Size, Tensor, _numel, _wrap_dim

__all__ = ["layout", "sparse_coo", "sparse_coo_tensor", "spmm", "strided"]


# The dense attributes a sparse tensor leaves unset (reading one raises SparseArgument); the others
# (_dtype, _device, _inference) it has, and grad_fn/_requires_grad are properties over its values.
_DENSE = frozenset(Tensor.__slots__) - {"_dtype", "_device", "_inference", "_grad_fn", "_requires_grad"}


def _no_storage(attr: str) -> SparseArgument:
    return SparseArgument(
        "this operation is not supported on sparse COO tensors (layout=kiln.sparse_coo): it needs strided "
        f"storage (Tensor.{attr}). Convert with .to_dense(), or use kiln.sparse's functions"
    )


class SparseTensor(Tensor):
    """A sparse COO tensor (``layout=kiln.sparse_coo``); made by :func:`kiln.sparse_coo_tensor` or
    :meth:`Tensor.to_sparse`."""

    __slots__ = ("_sp_indices", "_sp_values", "_sp_size", "_sp_coalesced")

    @property
    def is_sparse(self) -> bool:
        """True: a sparse COO tensor."""
        return True

    def __new__(cls, *args, **kwargs):
        raise TypeError("sparse tensors are made by kiln.sparse_coo_tensor() or Tensor.to_sparse()")

    def __getattr__(self, name: str):  # called only for attributes not found: the unset dense slots
        if name in _DENSE:
            raise _no_storage(name)
        raise AttributeError(f"'Tensor' object has no attribute '{name}'")

    def __setattr__(self, name: str, value) -> None:
        if name in _DENSE:  # a sparse tensor must never grow a dense storage that ops would then read
            raise _no_storage(name)
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ metadata
    @property
    def layout(self) -> layout:
        """``kiln.sparse_coo``."""
        return sparse_coo

    @property
    def shape(self) -> Size:
        """The tensor's shape as a :class:`kiln.Size`."""
        return Size(self._sp_size)

    def size(self, dim: int | None = None):
        """The shape (a :class:`kiln.Size`), or the length of dimension ``dim``."""
        if dim is None:
            return Size(self._sp_size)
        return self._sp_size[_wrap_dim(dim, len(self._sp_size))]

    def dim(self) -> int:
        """Number of dimensions (sparse and dense)."""
        return len(self._sp_size)

    ndimension = dim

    @property
    def ndim(self) -> int:
        """Number of dimensions (sparse and dense)."""
        return len(self._sp_size)

    def numel(self) -> int:
        """Number of elements of the dense tensor this one stands for."""
        return _numel(self._sp_size)

    nelement = numel

    def is_contiguous(self, memory_format=None) -> bool:
        """False: a sparse tensor has no strided layout (as PyTorch)."""
        return False

    @property
    def nbytes(self) -> int:
        """Not defined for sparse tensors (PyTorch's ``RuntimeError``)."""
        raise RuntimeError(
            "nbytes is not defined for sparse tensors.  If you want the size of the constituent tensors, add the "
            "nbytes of the indices and values.  If you want the size of the  equivalent dense tensor, multiply "
            "numel() by element_size()"
        )

    def __len__(self) -> int:
        if not self._sp_size:
            raise TypeError("len() of a 0-d tensor")
        return self._sp_size[0]

    def sparse_dim(self) -> int:
        """Number of sparse dimensions (rows of :meth:`indices`)."""
        return self._sp_indices._shape[0]

    def dense_dim(self) -> int:
        """Number of dense dimensions (the dims of each value)."""
        return len(self._sp_size) - self._sp_indices._shape[0]

    def _nnz(self) -> int:
        """Number of stored entries (duplicates included until :meth:`coalesce`)."""
        return self._sp_indices._shape[1]

    def is_coalesced(self) -> bool:
        """True when the indices are sorted and unique (after :meth:`coalesce`)."""
        return self._sp_coalesced

    def indices(self) -> Tensor:
        """The int64 ``[sparse_dim, nnz]`` indices (an alias) of a coalesced tensor."""
        if not self._sp_coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call .coalesce() first")
        return self._sp_indices.detach()

    def values(self) -> Tensor:
        """The ``[nnz, *dense_sizes]`` values (an alias, differentiable) of a coalesced tensor."""
        if not self._sp_coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call .coalesce() first")
        v = self._sp_values
        return v.view(v._shape)

    def _indices(self) -> Tensor:
        """The indices as stored (duplicates and order kept), an alias; no coalesced check."""
        return self._sp_indices.detach()

    def _values(self) -> Tensor:
        """The values as stored, an alias outside autograd (as PyTorch's); no coalesced check."""
        return self._sp_values.detach()

    def coalesce(self) -> Tensor:
        """This tensor with duplicate indices summed and the indices sorted (``self`` if already coalesced)."""
        from kiln._sparse_ops import coalesce

        return coalesce(self)

    def to_dense(self, dtype: dt.dtype | None = None, *, masked_grad: bool | None = None) -> Tensor:
        """The dense (strided) tensor: zeros where no entry is stored, duplicates summed. Differentiable.
        ``dtype`` is refused, as PyTorch refuses it for sparse tensors."""
        from kiln._sparse_ops import to_dense

        return to_dense(self, dtype)

    def to_sparse(self, sparse_dim: int | None = None, *, layout=None, blocksize=None, dense_dim=None) -> Tensor:
        """``self`` (already sparse COO); another ``sparse_dim`` is not supported, as in PyTorch."""
        _check_sparse_args(layout, blocksize)
        want = sparse_dim if sparse_dim is not None else None if dense_dim is None else self.dim() - dense_dim
        if want is not None and want != self.sparse_dim():
            raise RuntimeError(
                "to_sparse: conversion from Sparse to Sparse with sparse_dim argument !=self.sparse_dim() is not "
                "supported"
            )
        return self

    def to_sparse_coo(self) -> Tensor:
        """``self`` (already sparse COO)."""
        return self

    # ------------------------------------------------------------------ autograd state (that of the values)
    @property
    def _version(self) -> int:
        """The version counter of the values (in-place writes to them)."""
        return self._sp_values._vc[0]

    @property
    def grad_fn(self):
        """The autograd node that produced the values (None for a leaf)."""
        return self._sp_values.grad_fn

    @property
    def _grad_fn(self):
        return self._sp_values._grad_fn

    @property
    def _requires_grad(self) -> bool:
        return self._sp_values._requires_grad

    @property
    def requires_grad(self) -> bool:
        """Whether gradients are recorded for this tensor (for its values)."""
        return self._sp_values._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place on a leaf; returns ``self``."""
        self._sp_values.requires_grad_(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient accumulated by backward, as a coalesced sparse tensor on this tensor's (coalesced)
        indices: the gradient of the dense tensor at the stored positions (None until then)."""
        from kiln._sparse_ops import grad_of_values

        return grad_of_values(self)

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        from kiln._sparse_ops import set_grad_of_values

        set_grad_of_values(self, value)

    @grad.deleter
    def grad(self) -> None:
        self._sp_values.grad = None

    def retain_grad(self) -> None:
        """Not supported on sparse tensors: retain the gradient of :meth:`values` instead."""
        raise NotImplementedError("retain_grad() is not supported on kiln sparse tensors; use it on .values()")

    def register_hook(self, hook):
        """Not supported on sparse tensors: register the hook on :meth:`values` instead."""
        raise NotImplementedError("register_hook() is not supported on kiln sparse tensors; use it on .values()")

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
        """Not supported on sparse tensors: call it on a dense result (``kiln.sparse.sum(s)``, ``s.to_dense()``)."""
        raise NotImplementedError(
            "backward() of a sparse tensor is not supported by kiln; call it on a dense result "
            "(kiln.sparse.sum(s), s.to_dense())"
        )

    def detach(self) -> Tensor:
        """A sparse tensor sharing indices and values with this one, outside the autograd graph."""
        return _make_sparse(self._sp_indices, self._sp_values.detach(), self._sp_size, self._sp_coalesced)

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place, making it a leaf."""
        self._sp_values = self._sp_values.detach()
        return self

    @property
    def data(self) -> Tensor:
        """This tensor detached (sharing indices and values)."""
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, SparseTensor):
            raise RuntimeError("data set to a tensor of a different layout (a sparse tensor's data must be sparse)")
        values = value._sp_values.detach()
        if self._sp_values._requires_grad and self.grad_fn is None:
            values.requires_grad_(True)
        self._sp_indices, self._sp_values = value._sp_indices, values
        self._sp_size, self._sp_coalesced = value._sp_size, value._sp_coalesced
        self._dtype, self._device = value._dtype, value._device

    # ------------------------------------------------------------------ conversions
    def to(self, *args, **kwargs) -> Tensor:
        """Convert the values' dtype and/or move to a device (``to(dtype)``, ``to(device)``, ``to(other)``)."""
        from kiln._ops.copy import _parse_to, resolve_device

        dtype, device, copy = _parse_to(self, args, dict(kwargs))
        dev = self._device if device is None else resolve_device(device)
        dtype = self._dtype if dtype is None else dtype
        if dtype is self._dtype and dev is self._device and not copy:
            return self
        values = self._sp_values.to(dev, dtype, copy=copy)
        indices = self._sp_indices.to(dev, copy=copy)
        return _make_sparse(indices, values, self._sp_size, self._sp_coalesced)

    def type(self, dtype=None, non_blocking: bool = False, **kwargs):
        """The type name (``'kiln.sparse.FloatTensor'``), or this tensor converted to ``dtype``."""
        name = Tensor.type(self, dtype, non_blocking, **kwargs)
        return name.replace("kiln.", "kiln.sparse.", 1) if dtype is None else name

    def numpy(self, *, force: bool = False):
        """Not possible for a sparse tensor: PyTorch's ``TypeError``."""
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() first.")

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False) -> Tensor:
        """An all-zero sparse tensor (no entries) of ``size``, with this tensor's dtype and device by default."""
        from kiln._ops.creation import zeros

        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = tuple(size[0])
        dev = device if device is not None else self._device
        out = _make_sparse(
            zeros((len(size), 0), dtype=dt.int64, device=dev),
            zeros((0,), dtype=dtype or self._dtype, device=dev),
            tuple(int(s) for s in size),
            True,
        )
        return out.requires_grad_(True) if requires_grad else out

    new_empty = new_zeros

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False) -> Tensor:
        """Not supported for sparse tensors (PyTorch's ``NotImplementedError``)."""
        raise NotImplementedError("Could not run 'aten::fill_.Scalar' with arguments from the 'SparseCPU' backend.")

    def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
        """Not supported for sparse tensors (PyTorch's ``NotImplementedError``)."""
        raise NotImplementedError("Could not run 'aten::fill_.Scalar' with arguments from the 'SparseCPU' backend.")

    # ------------------------------------------------------------------ protocols
    def __repr__(self) -> str:
        from kiln._sparse_ops import format_sparse

        return format_sparse(self)

    def __format__(self, format_spec: str) -> str:
        if format_spec:
            raise TypeError("unsupported format string passed to Tensor.__format__")
        return repr(self)

    def __reduce_ex__(self, protocol):
        return (
            _rebuild,
            (self._sp_indices, self._sp_values.detach(), self._sp_size, self._sp_coalesced, self._requires_grad),
        )

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        if self.grad_fn is not None:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the moment."
            )
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            out = _make_sparse(self._sp_indices.clone(), self._sp_values.clone(), self._sp_size, self._sp_coalesced)
        out.requires_grad_(self._requires_grad)
        memo[id(self)] = out
        return out


def _rebuild(indices, values, size, coalesced, requires_grad) -> Tensor:
    out = _make_sparse(indices, values, tuple(size), coalesced)
    return out.requires_grad_(True) if requires_grad else out


def _make_sparse(indices: Tensor, values: Tensor, size: tuple, coalesced: bool) -> SparseTensor:
    """A sparse tensor from already checked parts (the values object becomes its own: pass a fresh one)."""
    t = object.__new__(SparseTensor)
    t._sp_indices = indices
    t._sp_values = values
    t._sp_size = size
    t._sp_coalesced = coalesced
    t._dtype = values._dtype
    t._device = values._device
    t._inference = state.inference
    return t


# ---------------------------------------------------------------------------------------- construction


def sparse_coo_tensor(
    indices,
    values,
    size=None,
    *,
    dtype: dt.dtype | None = None,
    device=None,
    requires_grad: bool = False,
    check_invariants: bool | None = None,
    is_coalesced: bool | None = None,
    pin_memory: bool = False,
) -> Tensor:
    """A sparse COO tensor (``torch.sparse_coo_tensor``): ``values[k]`` at position ``indices[:, k]``.

    ``indices`` is ``[sparse_dim, nnz]`` (converted to int64), ``values`` ``[nnz, *dense_sizes]`` (tensors,
    lists or arrays; kept as an alias when they already have the dtype and device); ``size`` defaults to the
    smallest that holds the indices. Duplicate indices are allowed (summed by :meth:`Tensor.coalesce` and
    every operation). When ``values`` requires a gradient the result is differentiable with respect to it;
    ``requires_grad=True`` makes the result a leaf whose ``.grad`` is sparse.

    Unlike PyTorch, kiln always checks that the indices are in range (a cheap min/max: an index out of
    range would alias another position), and checks ``is_coalesced=True`` unless ``check_invariants=False``.
    """
    from kiln._ops.copy import resolve_device
    from kiln._ops.creation import _unsupported, as_tensor

    _unsupported(pin_memory=pin_memory)
    if isinstance(indices, SparseTensor) or isinstance(values, SparseTensor):
        raise TypeError("sparse_coo_tensor(): indices and values must be dense tensors, not sparse ones")
    indices = as_tensor(indices).detach()
    values = values if isinstance(values, Tensor) else as_tensor(values, dtype=dtype)
    dev = values._device if device is None else resolve_device(device)
    if dtype is not None or dev is not values._device:
        values = values.to(dev, dtype if dtype is not None else values._dtype)
    if indices._dtype is not dt.int64 or indices._device is not dev:
        indices = indices.to(dev, dt.int64)
    if len(indices._shape) != 2:
        raise RuntimeError(f"indices must be sparse_dim x nnz, but got: {list(indices._shape)}")
    if not values._shape:
        values = values.reshape(1)
    sparse_dim, nnz = indices._shape
    if values._shape[0] != nnz:
        raise RuntimeError(
            "indices and values must have same nnz, but got nnz from indices: "
            f"{nnz}, nnz from values: {values._shape[0]}"
        )
    dense_shape = values._shape[1:]
    lo = indices.amin(1).tolist() if nnz else [0] * sparse_dim
    hi = indices.amax(1).tolist() if nnz else [-1] * sparse_dim
    if size is None:
        for d, m in enumerate(lo):
            if m < 0:
                raise RuntimeError(f"found negative index {m} for dim {d}")
        size = tuple(h + 1 for h in hi) + dense_shape
    else:
        size = _check_size(size)
        if len(size) != sparse_dim + len(dense_shape):
            raise RuntimeError(
                f"'len(size) == sparse_dim + dense_dim' is not satisfied: len(size) = {len(size)}, "
                f"sparse_dim = {sparse_dim}, dense_dim = {len(dense_shape)}"
            )
        if size[sparse_dim:] != dense_shape:
            raise RuntimeError(
                f"values has incorrect size, expected {[nnz, *size[sparse_dim:]]}, got {list(values._shape)}"
            )
        for d, (m, h) in enumerate(zip(lo, hi)):  # always: an index out of range would alias another position
            if m < 0:
                raise RuntimeError(f"found negative index {m} for dim {d}")
            if h >= size[d]:
                raise RuntimeError(
                    f"size is inconsistent with indices: for dim {d}, size is {size[d]} but found index {h}"
                )
    coalesced = nnz <= 1 if is_coalesced is None else bool(is_coalesced)
    if is_coalesced and check_invariants is not False and nnz > 1:
        from kiln._sparse_ops import linear_index

        lin = linear_index(indices, size[:sparse_dim])
        if not bool((lin[1:] > lin[:-1]).all()):
            raise RuntimeError("cannot set is_coalesced to true if indices correspond to uncoalesced COO tensor")
    if requires_grad and not values.requires_grad:
        values = values.detach().requires_grad_(True)
    else:  # an object of its own (requires_grad_ on the result must not reach the caller's tensor)
        values = values.view(values._shape) if values.requires_grad else values.detach()
    return _make_sparse(indices, values, size, coalesced)


def _check_size(size) -> tuple[int, ...]:
    if isinstance(size, Tensor) or not isinstance(size, (tuple, list)):
        raise TypeError(f"sparse_coo_tensor(): argument 'size' must be tuple of ints, not {type(size).__name__}")
    out = []
    for k, s in enumerate(size):
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError(
                f"sparse_coo_tensor(): argument 'size' failed to unpack the object at pos {k + 1} with error "
                f'"type must be tuple of ints,but got {type(s).__name__}"'
            )
        out.append(s.__index__())
    if any(s < 0 for s in out):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(out)}: {out}")
    return tuple(out)


def _check_sparse_args(layout_arg, blocksize) -> None:
    if blocksize is not None:
        raise RuntimeError("to_sparse: blocksize is only for blocked layouts; kiln supports layout=kiln.sparse_coo")
    if layout_arg is not None and layout_arg is not sparse_coo:
        if not isinstance(layout_arg, layout):
            raise TypeError(f"to_sparse(): argument 'layout' must be kiln.layout, not {type(layout_arg).__name__}")
        raise NotImplementedError(f"to_sparse: kiln supports layout=kiln.sparse_coo only, got {layout_arg!r}")


def spmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Product of a sparse COO matrix and a dense matrix (``torch.spmm``): :func:`kiln.sparse.mm`."""
    from kiln._sparse_ops import sparse_mm

    return sparse_mm(input, mat2)


# ---------------------------------------------------------------------------------------- dense tensors


def _dense_to_sparse(self, sparse_dim: int | None = None, *, layout=None, blocksize=None, dense_dim=None) -> Tensor:
    """This tensor as a sparse COO tensor holding its nonzero entries (``sparse_dim`` leading dims sparse,
    the rest dense; all of them by default). Differentiable."""
    from kiln._sparse_ops import dense_to_sparse

    _check_sparse_args(layout, blocksize)
    if dense_dim is not None:
        if sparse_dim is not None:
            raise TypeError("to_sparse(): give sparse_dim or dense_dim, not both")
        sparse_dim = self.dim() - dense_dim
    return dense_to_sparse(self, sparse_dim)


def _dense_to_sparse_coo(self) -> Tensor:
    """This tensor as a sparse COO tensor holding its nonzero entries (``to_sparse()``)."""
    return _dense_to_sparse(self)


def _dense_to_dense(self, dtype: dt.dtype | None = None, *, masked_grad: bool | None = None) -> Tensor:
    """``self`` (already dense), converted to ``dtype`` when given."""
    return self if dtype is None else self.to(dtype)


def _strided_only(name: str, returns: str, message: str, error: type[Exception] = RuntimeError):
    def method(self):
        raise error(message)

    method.__name__ = method.__qualname__ = name
    method.__annotations__ = {"return": returns}
    method.__doc__ = f"Sparse tensors only (``{name}``): a dense tensor raises PyTorch's ``{error.__name__}``."
    return method


def _dense_sparse_dim(self) -> int:
    """0 for a dense tensor (its dims are all dense)."""
    return 0


def _dense_dense_dim(self) -> int:
    """The number of dims for a dense tensor."""
    return self.dim()


def _dense_is_sparse(self) -> bool:
    """True for sparse COO tensors (``layout=kiln.sparse_coo``)."""
    return False


def _dense_layout(self) -> layout:
    """The memory layout: ``kiln.strided`` (``kiln.sparse_coo`` for sparse tensors)."""
    return strided


# The sparse API on every tensor, as PyTorch's Tensor has it: dense tensors answer or raise its errors.
Tensor.is_sparse = property(_dense_is_sparse)
Tensor.layout = property(_dense_layout)
Tensor.to_sparse = _dense_to_sparse
Tensor.to_sparse_coo = _dense_to_sparse_coo
Tensor.to_dense = _dense_to_dense
Tensor.sparse_dim = _dense_sparse_dim
Tensor.dense_dim = _dense_dense_dim
_LAYOUT_ERROR = "{} expected sparse coordinate tensor layout but got Strided"
Tensor.coalesce = _strided_only("coalesce", "Tensor", _LAYOUT_ERROR.format("coalesce"))
Tensor.is_coalesced = _strided_only("is_coalesced", "bool", _LAYOUT_ERROR.format("is_coalesced"))
Tensor.indices = _strided_only("indices", "Tensor", _LAYOUT_ERROR.format("indices"))
Tensor.values = _strided_only("values", "Tensor", "values expected sparse tensor layout but got Strided")
for _name, _returns in (("_indices", "Tensor"), ("_values", "Tensor"), ("_nnz", "int")):
    _message = f"Could not run 'aten::{_name}' with arguments from the 'CPU' backend."
    setattr(Tensor, _name, _strided_only(_name, _returns, _message, NotImplementedError))
del _name, _returns, _message
