"""The kiln ``Tensor``: strided metadata over an opaque, device-owned storage.

A tensor is ``(storage, shape, stride, storage_offset, dtype, device)`` plus autograd state. Storage is
whatever the device plugin allocates (a 1-D NumPy array for ``"cpu"``). Views share storage and the
version counter with their base; nothing here copies data. Math lives in ``kiln._ops``, which attaches
methods and operators to this class when each op is defined.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, device
from kiln._lazy import first_call
from kiln._memory_format import check_memory_format, contiguous_format, preserve_format, strided
from kiln._state import inference_away, post_modes, state

__all__ = ["Tensor"]

_CONTIGUOUS_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}
# Called with every new subclass of Tensor (kiln.multiprocessing registers its pickling reducer).
SUBCLASS_HOOKS: list = []


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) for ``shape``; memoised because shapes repeat."""
    s = _CONTIGUOUS_STRIDES.get(shape)
    if s is None:
        acc = 1
        out = []
        for n in reversed(shape):
            out.append(acc)
            acc *= max(n, 1)
        s = tuple(reversed(out))
        if len(_CONTIGUOUS_STRIDES) < 65536:
            _CONTIGUOUS_STRIDES[shape] = s
    return s


def storage_span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """How many storage elements a geometry spans, from its first element to its last (0 if empty)."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


_SAME = object()  # a tensor's grad_dtype when not set: the tensor's own dtype


def stale_view_requires_grad(t: Tensor) -> bool:
    """Whether ``t``, a view that needs no gradient, needs one now that its base, written in place since,
    requires grad (PyTorch's views ask their base). Called where autograd records, it sets the flag and the
    history is re-derived right after (:func:`kiln.autograd.graph._edge`); the ``requires_grad`` property
    and the writes' tests ask the same question without changing the view."""
    if t._view_vc != t._vc[0] and t._base._requires_grad:
        t._requires_grad = True
        return True
    return False


def _check_grad(t: Tensor, g) -> None:
    """PyTorch's checks of an assignment ``t.grad = g``: a tensor of ``t``'s grad_dtype, device and size
    (an optimizer would otherwise broadcast a wrong-shaped gradient into the parameter)."""
    from kiln._ops._meta import scalar_type_name

    if not isinstance(g, Tensor):
        raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(g).__name__}")
    want = t._dtype if t._grad_dtype is _SAME else t._grad_dtype
    if want is not None and g._dtype is not want:
        raise RuntimeError(
            f"attempting to assign a gradient with dtype '{dt.CPP_TYPE_NAMES[g._dtype]}' to a tensor with grad_dtype "
            f"'{scalar_type_name(want)}'. The gradient must match the tensor's grad_dtype (defaults to the tensor's "
            "dtype). You can set the tensor's grad_dtype attribute with a specific dtype, or None to allow any "
            "dtype. Set grad_dtype with caution. Diverging the dtypes of a tensor and its gradient may break "
            "downstream systems that assume they match."
        )
    if g._device.type != t._device.type:
        raise RuntimeError(
            f"attempting to assign a gradient with device type '{g._device.type}' to a tensor with device type "
            f"'{t._device.type}'. Please ensure that the gradient and the tensor are on the same device"
        )
    if g._device != t._device:
        raise RuntimeError(
            f"attempting to assign a gradient located on device with index '{g._device.index}' to a tensor located "
            f"on device with index '{t._device.index}'. Please ensure that the gradient and the tensor are on the "
            "same device"
        )
    if g._shape != t._shape:
        raise RuntimeError(
            f"attempting to assign a gradient of size '{list(g._shape)}' to a tensor of size '{list(t._shape)}'. "
            "Please ensure that the gradient and the tensor are the same size"
        )


_numel = math.prod  # the number of elements of a shape (a tuple of ints; 1 for ``()``), without a Python frame


class Tensor:
    """A multi-dimensional array with autograd, the counterpart of ``torch.Tensor``.

    Create tensors with :func:`kiln.tensor`, :func:`kiln.zeros`, :func:`kiln.from_numpy` and friends.
    ``kiln.Tensor(data)`` (PyTorch's legacy constructor) builds a tensor of the default float dtype.
    """

    __slots__ = {
        "_storage": "device buffer holding the elements",
        "_shape": "sizes",
        "_stride": "strides in elements",
        "_offset": "storage offset in elements",
        "_dtype": "element type",
        "_device": "device of the storage",
        "_np": "cached NumPy view (CPU)",
        "_vc": "version counter cell shared by views",
        "_base": "the tensor this one is an autograd view of",
        "_view_vc": "version at which a view's history was recorded",
        "_nograd_view": "a view made under no_grad (1) or inference_mode (2) of a base that requires grad (else 0)",
        "_requires_grad": "whether autograd records operations on it",
        "_grad": "the gradient accumulated by backward (the ``grad`` property)",
        "_grad_dtype": "the dtype a gradient must have: _SAME (the tensor's), a dtype, or None (any)",
        "_grad_fn": "the autograd node that produced this tensor, as last recorded (the ``grad_fn`` property)",
        "_output_nr": "which output of grad_fn this is",
        "_accumulator": "a leaf's weak reference to its AccumulateGrad node (kiln.autograd.graph.AccumulatorRef)",
        "_hooks": "gradient hooks of a leaf",
        "_retains_grad": "whether a non-leaf keeps .grad",
        "_inference": "made under inference_mode",
        "__weakref__": None,
        "__dict__": None,
    }

    def __new__(cls, *args, **kwargs):
        from kiln._ops.creation import _legacy_tensor_new

        return _legacy_tensor_new(cls, *args, **kwargs)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for hook in SUBCLASS_HOOKS:
            hook(cls)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> Size:
        """The tensor's shape as a :class:`kiln.Size`."""
        return Size(self._shape)

    def size(self, dim: int | None = None):
        """The shape (a :class:`kiln.Size`), or the length of dimension ``dim``."""
        if dim is None:
            return Size(self._shape)
        return self._shape[_wrap_dim(dim, len(self._shape))]

    def stride(self, dim: int | None = None):
        """Strides in elements, or the stride of dimension ``dim``."""
        if dim is None:
            return self._stride
        return self._stride[_wrap_dim(dim, len(self._shape))]

    def dim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    ndimension = dim

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    def numel(self) -> int:
        """Number of elements."""
        return _numel(self._shape)

    nelement = numel

    @property
    def dtype(self) -> dt.dtype:
        """Element type."""
        return self._dtype

    @property
    def device(self) -> device:
        """The device holding the storage."""
        return self._device

    @property
    def is_cuda(self) -> bool:
        """True when the tensor lives on a ``cuda`` device."""
        return self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        """True when the tensor lives on the CPU."""
        return self._device is CPU

    # PyTorch's other device-type tests (``t.is_mps``, ``t.is_xpu``, ...): a plugin may register any of
    # these device types, so each compares the tensor's device type.
    is_xpu = property(lambda self: self._device.type == "xpu", doc="True when the tensor lives on an ``xpu`` device.")
    is_mps = property(lambda self: self._device.type == "mps", doc="True when the tensor lives on an ``mps`` device.")
    is_ipu = property(lambda self: self._device.type == "ipu", doc="True when the tensor lives on an ``ipu`` device.")
    is_xla = property(lambda self: self._device.type == "xla", doc="True when the tensor lives on an ``xla`` device.")
    is_mtia = property(
        lambda self: self._device.type == "mtia", doc="True when the tensor lives on an ``mtia`` device."
    )
    is_maia = property(lambda self: self._device.type == "maia", doc="True when the tensor lives on a ``maia`` device.")
    is_meta = property(lambda self: self._device.type == "meta", doc="True when the tensor lives on a ``meta`` device.")
    is_vulkan = property(lambda self: False, doc="False: kiln has no Vulkan device.")
    is_mkldnn = property(lambda self: False, doc="False: kiln has no oneDNN (MKL-DNN) layout.")
    is_quantized = property(lambda self: False, doc="False: kiln has no quantized dtypes.")
    is_nested = property(lambda self: False, doc="False: kiln has no nested (jagged) tensors.")

    @property
    def grad_fn(self):
        """The autograd node that produced this tensor (None for leaves). A view whose base was written in
        place since its history was recorded takes its history from the base's new one first, as an
        ``AsStridedBackward0`` view of it (PyTorch's rule, applied when it is read, as PyTorch does); a view
        that needed no gradient needs one from then on if its base does."""
        if (
            self._base is not None
            and self._view_vc != self._vc[0]
            and (self._requires_grad or stale_view_requires_grad(self))
        ):
            _refresh_view(self)
        return self._grad_fn

    @property
    def is_leaf(self) -> bool:
        """True for tensors not produced by a recorded operation (``grad_fn is None``)."""
        return self.grad_fn is None

    def is_floating_point(self) -> bool:
        """True when the dtype is a floating point type."""
        return self._dtype.is_floating_point

    def is_complex(self) -> bool:
        """Always False (kiln has no complex dtypes)."""
        return False

    def element_size(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes spanned by the tensor's elements (``numel() * element_size()``)."""
        return _numel(self._shape) * self._dtype.itemsize

    def storage_offset(self) -> int:
        """Offset of the first element in the storage, in elements."""
        return self._offset

    def is_contiguous(self, memory_format=contiguous_format) -> bool:
        """True when the elements are laid out row-major without gaps."""
        if memory_format is not contiguous_format:  # (the usual call checks nothing: no call)
            check_memory_format("is_contiguous", memory_format)
        if self._stride == _CONTIGUOUS_STRIDES.get(self._shape) or 0 in self._shape:  # (row-major strides cached)
            return True
        expected = 1
        for n, s in zip(reversed(self._shape), reversed(self._stride)):
            if n != 1 and s != expected:  # (a size-1 dim's stride is free)
                return False
            expected *= n
        return True

    def untyped_storage(self):
        """The device buffer holding this tensor's elements (a 1-D NumPy array on ``"cpu"``)."""
        return self._storage

    def data_ptr(self) -> int:
        """Address of the first element."""
        from kiln._plugins import device_type

        return device_type(self._device).data_ptr(self._storage) + self._offset * self._dtype.itemsize

    def share_memory_(self) -> Tensor:
        """Move the storage to shared memory, in place, with every tensor viewing it; returns ``self``.

        A no-op when it is shared already. CPU tensors only (``RuntimeError`` otherwise). Shared tensors
        cross processes of :mod:`kiln.multiprocessing` without a copy.
        """
        from kiln._shared_memory import share_memory_

        share_memory_(self)
        return self

    def is_shared(self) -> bool:
        """True when the storage lives in shared memory (see :meth:`share_memory_`)."""
        from kiln._shared_memory import is_shared

        return is_shared(self)

    @property
    def _version(self) -> int:
        """How many in-place writes this tensor's storage has seen (shared by all its views)."""
        return self._vc[0]

    def is_inference(self) -> bool:
        """True for tensors created under :func:`kiln.inference_mode`."""
        return self._inference

    # ------------------------------------------------------------------ autograd state
    @property
    def requires_grad(self) -> bool:
        """Whether gradients are recorded for this tensor (a view's too once its base, written in place,
        requires grad: :func:`stale_view_requires_grad`, which an op using the view calls)."""
        return self._requires_grad or (
            self._base is not None and self._view_vc != self._vc[0] and self._base._requires_grad
        )

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` in place on a leaf tensor; returns ``self``."""
        if self.grad_fn is not None:
            if requires_grad:
                return self
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a computed "
                "variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
            )
        if requires_grad and not self._dtype.is_floating_point:
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        if requires_grad and self._inference and not (inference_away[0] and state.inference):
            raise RuntimeError("Setting requires_grad=True on inference tensor outside InferenceMode is not allowed.")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient accumulated by backward (None until then)."""
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            _check_grad(self, value)
        for mode in post_modes():  # a tracer learns the gradient the call found
            mode.before_grad_set(self)
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        for mode in post_modes():
            mode.before_grad_set(self)
        self._grad = None

    @property
    def grad_dtype(self):
        """The dtype ``.grad`` must have: the tensor's own unless set (on a leaf) to another dtype, or to
        None to allow any."""
        if self.grad_fn is not None:
            raise RuntimeError("grad_dtype can only be accessed on leaf tensors.")
        return self._dtype if self._grad_dtype is _SAME else self._grad_dtype

    @grad_dtype.setter
    def grad_dtype(self, value) -> None:
        from kiln._ops._meta import scalar_type_name

        if self.grad_fn is not None:
            raise RuntimeError("grad_dtype can only be set on leaf tensors.")
        if value is not None and not isinstance(value, dt.dtype):
            raise RuntimeError(f"grad_dtype must be a kiln.dtype or None, but got {type(value).__name__}")
        g = self._grad
        if value is not None and g is not None and g._dtype is not value:
            raise RuntimeError(
                f"Cannot set grad_dtype to '{scalar_type_name(value)}' because there is already a gradient with "
                f"dtype '{dt.CPP_TYPE_NAMES[g._dtype]}'. Please clear the gradient (.grad = None) before changing "
                "grad_dtype, or ensure the new grad_dtype matches the existing gradient's dtype."
            )
        self._grad_dtype = value

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self._retains_grad = True
        from kiln.autograd.graph import _register_retain_grad

        _register_retain_grad(self)

    @property
    def retains_grad(self) -> bool:
        """True when a non-leaf tensor keeps its ``.grad`` (see :meth:`retain_grad`)."""
        return self._retains_grad

    def register_hook(self, hook):
        """Register ``hook(grad) -> Tensor | None`` run when this tensor's gradient is computed.

        Returns a handle whose ``remove()`` unregisters the hook.
        """
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        from kiln.autograd.graph import _register_tensor_hook

        return _register_tensor_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Register ``hook(tensor)``, run after a gradient has been accumulated into this leaf's ``.grad``
        (optimizers that step inside backward use it). Returns a handle whose ``remove()`` unregisters it."""
        from kiln.autograd.accumulate import register_post_accumulate_grad_hook

        return register_post_accumulate_grad_hook(self, hook)

    @property
    def output_nr(self) -> int:
        """Which output of its ``grad_fn`` this tensor is (0 for leaves and single-output ops)."""
        return self._output_nr if self.grad_fn is not None else 0

    def const_data_ptr(self) -> int:
        """The address of the first element, for reading (:meth:`data_ptr`)."""
        return self.data_ptr()

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
        """Compute the gradient of this tensor w.r.t. graph leaves (see :func:`kiln.autograd.backward`)."""
        _backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def detach(self) -> Tensor:
        """A new tensor sharing storage with this one, outside the autograd graph."""
        return Tensor._make_subclass(Tensor, self)

    def detach_(self) -> Tensor:
        """Detach this tensor from the graph in place, making it a leaf."""
        if self._base is not None and self._base._requires_grad:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        """The tensor's values as a detached tensor sharing storage."""
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise TypeError("data must be a Tensor")
        self._storage = value._storage
        self._shape = value._shape
        self._stride = value._stride
        self._offset = value._offset
        self._dtype = value._dtype
        self._device = value._device
        self._np = value._np

    # ------------------------------------------------------------------ host interop
    def _numpy(self) -> np.ndarray:
        """A NumPy view of a CPU tensor's elements (no copy). Internal: kernels use it."""
        a = self._np
        if a is None:
            if self._device is not CPU:
                raise TypeError(
                    f"can't convert {self._device.type} device type tensor to numpy. Use Tensor.cpu() to "
                    "copy the tensor to host memory first."
                )
            st = self._storage
            if 0 in self._shape:  # nothing to alias; the offset may point past the end of the storage
                a = np.empty(self._shape, st.dtype)
            else:
                isz = self._dtype.itemsize
                # (a list, not a generator: no resumed frame per dim)
                a = np.ndarray(self._shape, st.dtype, st, self._offset * isz, tuple([s * isz for s in self._stride]))
            self._np = a
        return a

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The tensor's values as a NumPy array sharing memory (CPU tensors without grad)."""
        for mode in post_modes():  # a tracer must know the values left the graph
            mode.host_read(self, "numpy")
        if force:
            return self.detach().cpu().resolve_conj()._numpy().copy()
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self._numpy()

    def resolve_conj(self) -> Tensor:
        """Returns ``self`` (kiln has no complex dtypes, hence no lazy conjugation)."""
        return self

    def resolve_neg(self) -> Tensor:
        """Returns ``self`` (kiln has no lazy negation)."""
        return self

    def __array__(self, dtype=None, copy=None):
        a = self.cpu().numpy()
        if dtype is not None and a.dtype != dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def tolist(self):
        """The values as (nested) Python lists of Python numbers."""
        return self._host_values().tolist()

    def _host_values(self) -> np.ndarray:
        """The values as a NumPy array on the host (half precision widened to float32), for reading into
        Python: ``tolist``, ``item``, and through them ``bool()``, ``int()``, ``float()``, ``index()``. A
        tracer hears of the read (``host_read``). A CPU tensor's own view: no detached tensor is built."""
        for mode in post_modes():
            mode.host_read(self, "tolist")
        a = (self if self._device is CPU else self.detach().cpu())._numpy()
        if self._dtype is dt.bfloat16 or self._dtype is dt.float16:
            a = a.astype(np.float32)
        return a

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if _numel(self._shape) != 1:
            raise RuntimeError(f"a Tensor with {_numel(self._shape)} elements cannot be converted to Scalar")
        a = self._host_values()
        return (a if not self._shape else a.reshape(())).tolist()

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))  # as PyTorch iterates: the slices made at once

    def __bool__(self) -> bool:
        n = _numel(self._shape)
        if n != 1:
            raise RuntimeError(
                f"Boolean value of Tensor with {'no values' if n == 0 else 'more than one value'} is ambiguous"
            )
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._dtype.is_floating_point or _numel(self._shape) != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __hash__(self) -> int:
        return id(self)

    def __dlpack__(self, stream=None, **kwargs):
        from kiln._interop import tensor_dlpack

        return tensor_dlpack(self, stream, **kwargs)

    def __dlpack_device__(self):
        from kiln._interop import tensor_dlpack_device

        return tensor_dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface of a ``cuda`` tensor (CuPy, Numba and PyTorch read GPU memory through it,
        without a copy); ``AttributeError`` for tensors elsewhere, as PyTorch's."""
        from kiln._interop import tensor_cuda_array_interface

        return tensor_cuda_array_interface(self)

    def __repr__(self) -> str:
        from kiln._format import format_tensor

        return format_tensor(self)

    def __reduce_ex__(self, protocol):
        from kiln._interop import reduce_tensor

        return reduce_tensor(self)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        if self.grad_fn is not None:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the moment."
            )
        from kiln._ops.views import clone
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            out = clone(self)
        out._requires_grad = self._requires_grad
        memo[id(self)] = out
        return out

    __array_priority__ = 1000

    # ------------------------------------------------------------------ device and dtype moves
    def to(self, *args, **kwargs) -> Tensor:
        """Convert dtype and/or move device: ``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``."""
        return _tensor_to(self, *args, **kwargs)

    def cpu(self) -> Tensor:
        """This tensor on the CPU (``self`` when it already is)."""
        return self if self._device is CPU else self.to(CPU)

    def _to_type(self, type_name: str, device, non_blocking: bool, memory_format) -> Tensor:
        check_memory_format(type_name, memory_format)
        if device is None:
            device = type_name
        elif isinstance(device, int):
            device = f"{type_name}:{device}"
        return self.to(device, non_blocking=non_blocking)

    def xpu(self, device=None, non_blocking: bool = False, memory_format=preserve_format) -> Tensor:
        """This tensor on an ``xpu`` device (a plugin must register that device type)."""
        return self._to_type("xpu", device, non_blocking, memory_format)

    def mtia(self, device=None, non_blocking: bool = False, memory_format=preserve_format) -> Tensor:
        """This tensor on an ``mtia`` device (a plugin must register that device type)."""
        return self._to_type("mtia", device, non_blocking, memory_format)

    def ipu(self, device=None, non_blocking: bool = False, memory_format=preserve_format) -> Tensor:
        """This tensor on an ``ipu`` device (a plugin must register that device type)."""
        return self._to_type("ipu", device, non_blocking, memory_format)

    def cuda(self, device=None, non_blocking: bool = False, memory_format=preserve_format) -> Tensor:
        """This tensor on a ``cuda`` device."""
        return self._to_type("cuda", device, non_blocking, memory_format)

    def __format__(self, format_spec: str) -> str:
        """``format(t, spec)``: a 0-d tensor formats its Python number (``f"{loss:.2f}"``); other tensors
        accept only the empty spec (their ``str``), as PyTorch's."""
        if not self._shape:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def _new(self, factory: str, args: tuple, dtype, device, requires_grad, layout, pin_memory) -> Tensor:
        from kiln._ops import creation

        creation._unsupported(layout=layout, pin_memory=pin_memory)
        dtype, device = dtype or self._dtype, device or self._device
        return getattr(creation, factory)(*args, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False, layout=strided, pin_memory=False):
        """A new tensor from ``data`` with this tensor's dtype and device by default."""
        return self._new("tensor", (data,), dtype, device, requires_grad, layout, pin_memory)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False, layout=strided, pin_memory=False):
        """Zeros of ``size`` with this tensor's dtype and device by default."""
        return self._new("zeros", size, dtype, device, requires_grad, layout, pin_memory)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False, layout=strided, pin_memory=False):
        """Ones of ``size`` with this tensor's dtype and device by default."""
        return self._new("ones", size, dtype, device, requires_grad, layout, pin_memory)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False, layout=strided, pin_memory=False):
        """Uninitialised tensor of ``size`` with this tensor's dtype and device by default."""
        return self._new("empty", size, dtype, device, requires_grad, layout, pin_memory)

    def new_full(
        self, size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=strided, pin_memory=False
    ):
        """``fill_value`` everywhere, with this tensor's dtype and device by default."""
        return self._new("full", (size, fill_value), dtype, device, requires_grad, layout, pin_memory)


def _conversion(name: str, target: dt.dtype):
    def convert(self, memory_format=preserve_format) -> Tensor:
        check_memory_format(name, memory_format)
        return self.to(target)

    convert.__name__ = convert.__qualname__ = name
    convert.__doc__ = f"This tensor converted to {target.name} (``self`` if it already is)."
    return convert


# PyTorch's dtype shorthands: t.float(), t.long(), ...
for _name, _target in (
    ("float", dt.float32),
    ("double", dt.float64),
    ("half", dt.float16),
    ("bfloat16", dt.bfloat16),
    ("long", dt.int64),
    ("int", dt.int32),
    ("short", dt.int16),
    ("char", dt.int8),
    ("byte", dt.uint8),
    ("bool", dt.bool),
):
    setattr(Tensor, _name, _conversion(_name, _target))


class Size(tuple):
    """A tensor shape: a tuple of ints (``torch.Size``)."""

    __slots__ = ()

    def numel(self) -> int:
        """Product of the sizes."""
        return _numel(self)

    def __repr__(self) -> str:
        return f"kiln.Size({list(self)})"

    def __getitem__(self, item):
        r = tuple.__getitem__(self, item)
        return Size(r) if isinstance(item, slice) else r


_new_tensor = object.__new__
_tensor_to = first_call(globals(), "kiln._ops.copy", "tensor_to", "_tensor_to")
_backward = first_call(globals(), "kiln.autograd", "backward", "_backward")
_refresh_view = first_call(globals(), "kiln.autograd.graph", "_refresh_view_history", "_refresh_view")


def _make(storage, shape, stride, offset, dtype, device, version=None, cls=Tensor) -> Tensor:
    """Build a tensor from its parts. ``version`` is the counter cell to share (views) or None."""
    t = _new_tensor(cls)
    t._storage = storage
    t._shape = shape
    t._stride = stride
    t._offset = offset
    t._dtype = dtype
    t._device = device
    t._np = None
    t._vc = [0] if version is None else version
    t._base = None
    t._view_vc = 0
    t._nograd_view = 0
    t._requires_grad = False
    t._grad = None
    t._grad_dtype = _SAME
    t._grad_fn = None
    t._output_nr = 0
    t._accumulator = None
    t._hooks = None
    t._retains_grad = False
    t._inference = state.inference if inference_away[0] else False
    return t


def from_array(a: np.ndarray, dtype: dt.dtype) -> Tensor:
    """Wrap a NumPy result as a new CPU tensor that owns it.

    A dense array keeps its layout (a transposed result stays transposed, as PyTorch's kernels keep the
    stride order of their inputs); anything else is copied to row-major first.
    """
    if a.__class__ is not np.ndarray:
        a = np.asarray(a)
    if a.dtype is not dtype._np:  # (NumPy's builtin dtypes are singletons: a ufunc's result passes at once)
        np_dtype = dtype._np if dtype._np is not None else dtype.numpy
        if a.dtype != np_dtype:
            a = a.astype(np_dtype, order="K")
    if a.flags.c_contiguous:
        shape = a.shape
        stride = _CONTIGUOUS_STRIDES.get(shape)  # contiguous_strides(shape), without its call where known
        if stride is None:
            stride = contiguous_strides(shape)
        # a 1-D array is its own storage; ravel() views any other, at a third of reshape(-1)'s cost
        t = _make(a if len(shape) == 1 else a.ravel(), shape, stride, 0, dtype, CPU)
    else:
        stride = _dense_strides(a)
        if stride is None:
            a = np.ascontiguousarray(a)
            stride = contiguous_strides(a.shape)
        t = _make(a.ravel(order="K"), a.shape, stride, 0, dtype, CPU)
    t._np = a
    return t


def _dense_strides(a: np.ndarray) -> tuple[int, ...] | None:
    """Element strides of an array whose elements fill a block of memory without gaps or overlap
    (positive strides, starting at its first element), else None."""
    isz = a.itemsize
    expected = isz
    for i in sorted(range(a.ndim), key=lambda d: a.strides[d]):
        if a.shape[i] == 1:
            continue
        if a.strides[i] != expected:
            return None
        expected *= a.shape[i]
    return tuple(s // isz if n != 1 else 1 for s, n in zip(a.strides, a.shape))


def _wrap_dim(dim: int, ndim: int) -> int:
    """Normalise a possibly negative dim, with PyTorch's IndexError wording."""
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if dim < lo or dim > hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
    if ndim == 0:
        return 0
    return dim + ndim if dim < 0 else dim
