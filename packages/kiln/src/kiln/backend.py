"""``kiln.backend``: the public SDK for backend and device plugin authors.

Everything a plugin needs to implement kernels for kiln's ops is here, under stable names; a plugin
imports nothing from ``kiln._*`` (a test holds every package outside the core, the example device plugin
included, to that). The guide "Writing a device plugin" walks through it; the architecture page explains
the design. In short:

* **The op record.** :func:`op` / :func:`ops` give the :class:`OpDef` of every op: its signature, meta
  function, backward formula, reference kernel, tags (:data:`TAGS`), in-place variant, autocast policy
  and decomposition. Nothing else lists ops. Autocast's policies and their meanings are
  :data:`AUTOCAST_POLICIES`; the few functions written in ops that carry a policy of their own, as
  PyTorch's ops of those names do, are :func:`composites` (a feature package marks its own with
  :func:`composite`, as kiln-nn's ``linear``).
* **The kernel contract.** A kernel is called as ``kernel(spec, *args)``: ``spec`` is a :class:`Spec`
  (``shape``, ``dtype``, ``device`` and per-family named extras such as :attr:`ReductionSpec.dims`) that
  the op's meta function computed after validating the arguments; ``args`` are the op's arguments,
  tensors still tensors. It returns a new tensor (a tuple for ops with several outputs) matching the
  spec; kiln checks that on the first call per (op, device type, dtype), and on every call under
  :func:`check_kernel_outputs`.
* **Registration.** A plugin's ``kiln_register_kernels(register)`` hook calls
  ``register(op_name, device_type, kernel, dtypes=None)``.
* **Reuse.** :func:`reference_kernel` is kiln's NumPy kernel for an op (a plugin may serve the cases it
  does not accelerate with it); :func:`host_view` and :func:`from_array` move between CPU tensors and
  NumPy arrays without copies; :func:`compute_dtype` is the dtype a half-precision result is computed in;
  :func:`atomic_write` replaces a file whole or not at all (``kiln.save``'s, for a plugin that writes files).
* **Threads.** A backend with its own thread team starts with :func:`default_num_threads` (the one rule
  for the core and every backend) and validates ``set_num_threads`` through :func:`check_num_threads`.
* **Compilers.** A :class:`DispatchMode` at the ``"post_autograd"`` level sees every op that runs (the
  backward pass's and every write included) and, through :meth:`DispatchMode.host_read`, every value read
  into Python; :func:`call_kernel` then runs one op's kernel alone, with the spec recorded at trace time
  (kiln-compile's executor). :class:`ExportedProgram` is what ``kiln.export`` makes: a graph of ops and its
  weights that :func:`load_program` reads and runs with the core alone (:func:`encode_argument` writes an op's
  arguments in its JSON form). ``torch._dynamo``'s marks on a tensor's dims (:func:`mark_dynamic`,
  :func:`maybe_mark_dynamic`, :func:`mark_static`) are the core's, for a compiler's ``kiln._dynamo`` to
  serve; the compiler fills :data:`mark_trace_hooks` with what a mark does while it traces.
* **Decompositions.** An op with a decomposition (:func:`decomposition`) runs on any device that lacks
  its kernel, as the composite of other ops, before the opt-in CPU fallback.
* **The primitive set.** :func:`primitives` names the ops a new device must implement: every op with no
  decomposition whose kernel does not come with the device contract (views, copies and creation are
  ``device_generic``). A device with kernels for exactly those runs every op, each other one through
  its decomposition on the device (ops tagged ``"fused"`` are among them: a device may skip them). The
  list is derived from the op records, never written by hand:
  ``python -c "import kiln.backend as kb; print(kb.primitives())"``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import _state
from kiln._atomic_write import atomic_write
from kiln._dispatch import (
    AUTOCAST_POLICIES,
    COMPOSITES,
    OPS,
    TAGS,
    Composite,
    DispatchMode,
    OpDef,
    call_kernel,
    check_kernel_outputs,
    composite,
    kernel_outputs_checked_always,
)
from kiln._dtype import ALL_DTYPES, compute_numpy
from kiln._generated import generated_module
from kiln._marks import mark_dynamic, mark_static, maybe_mark_dynamic
from kiln._marks import trace_hooks as mark_trace_hooks
from kiln._ops.copy import _check_inplace_allowed
from kiln._ops.normalization import _channel_layout, _group_layout, _layer_layout
from kiln._ops.spatial_args import _adaptive_bounds, _window_positions
from kiln._program import ExportedProgram, encode_argument, load_program, save_program
from kiln._spec import (
    SPEC_TYPES,
    ComputeSpec,
    ConvSpec,
    DimSpec,
    FoldSpec,
    IndexSpec,
    NormLayout,
    NormSpec,
    PoolSpec,
    ReductionSpec,
    Spec,
    StridedSpec,
    WindowSpec,
)
from kiln._tensor import Tensor, contiguous_strides
from kiln._tensor import from_array as _from_array
from kiln._threads import check_num_threads, default_num_threads

__all__ = [
    "ALL_DTYPES",
    "AUTOCAST_POLICIES",
    "Composite",
    "ComputeSpec",
    "ExportedProgram",
    "ConvSpec",
    "DimSpec",
    "DispatchMode",
    "FoldSpec",
    "IndexSpec",
    "NormLayout",
    "NormSpec",
    "OpDef",
    "PoolSpec",
    "ReductionSpec",
    "SPEC_TYPES",
    "Spec",
    "StridedSpec",
    "TAGS",
    "WindowSpec",
    "adaptive_pool_bounds",
    "atomic_write",
    "batch_norm_layout",
    "call_kernel",
    "check_kernel_outputs",
    "check_num_threads",
    "composite",
    "composites",
    "compute_dtype",
    "contiguous_strides",
    "decomposition",
    "decompositions",
    "encode_argument",
    "default_num_threads",
    "from_array",
    "generated_module",
    "group_norm_layout",
    "host_view",
    "kernel_outputs_checked_always",
    "recording",
    "layer_norm_layout",
    "mark_dynamic",
    "mark_static",
    "mark_trace_hooks",
    "maybe_mark_dynamic",
    "load_program",
    "mark_written",
    "op",
    "ops",
    "pool_window_positions",
    "primitives",
    "reference_kernel",
    "save_program",
    "tensor_from_storage",
]


def op(name: str) -> OpDef:
    """The record of op ``name`` (raises ``KeyError`` naming the closest ops when there is none)."""
    opdef = OPS.get(name)
    if opdef is None:
        import difflib

        close = difflib.get_close_matches(name, OPS, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"kiln has no op named {name!r}{hint}")
    return opdef


def composites() -> dict[str, Composite]:
    """Every function written in kiln ops that carries an autocast policy of its own (``mse_loss``,
    ``trace``...), by name: with the op records' policies, all that autocast reads."""
    return dict(COMPOSITES)


def ops(tag: str | None = None) -> dict[str, OpDef]:
    """Every op by name (a new dict), or only those tagged ``tag`` (a key of :data:`TAGS`)."""
    if tag is None:
        return dict(OPS)
    if tag not in TAGS:
        raise ValueError(f"unknown op tag {tag!r}; the tags are {sorted(TAGS)}")
    return {name: o for name, o in OPS.items() if tag in o.tags}


def reference_kernel(
    name: str | OpDef,
    *,
    fast: Callable | None = None,
    min_numel: Callable[[], int] | None = None,
    inplace: bool = False,
) -> Callable | None:
    """kiln's NumPy kernel for an op on device ``"cpu"``, with the kernel calling convention
    (``kernel(spec, *args)``, CPU tensors in, a CPU tensor out).

    With ``inplace=True``: the reference's in-place kernel of the op's in-place variant
    (``kernel(spec, self, *args)``, see :func:`kiln.hookspecs.kiln_register_kernels`), or None where it has
    none; a plugin that registers the op's kernel for ``"cpu"`` registers this, or its own that falls back
    on it, for the in-place variant to write in place.

    With ``fast``: a kernel that calls ``fast(spec, *args)`` first and runs the reference when it returns
    None (a plugin's kernel for the cases it takes). With ``min_numel`` too, ``fast`` is called only when the
    (first) output has at least ``min_numel()`` elements: a plugin whose loops pay off only on large inputs
    registers that (kiln-cpu's elementwise kernels), and a small call goes to NumPy with no call of the
    plugin's in between, which would cost a tenth of a small op's time."""
    from kiln._reference import inplace_reference, wrap_reference

    opdef = name if isinstance(name, OpDef) else op(name)
    if opdef.reference is None:
        raise ValueError(f"op {opdef.name!r} has no reference kernel")
    if inplace:
        if fast is not None or min_numel is not None:
            raise TypeError("reference_kernel: fast and min_numel are for the out-of-place kernel")
        return inplace_reference(opdef) if opdef.bind is not None else None
    if min_numel is not None and fast is None:
        raise TypeError("reference_kernel: min_numel is the size from which fast runs; give fast too")
    return wrap_reference(opdef, fast, min_numel)


def decomposition(name: str | OpDef) -> Callable | None:
    """The op written in other kiln ops (same signature as the op), or None when it has none."""
    opdef = name if isinstance(name, OpDef) else op(name)
    return opdef.decompose


def decompositions() -> dict[str, Callable]:
    """Every op that has a decomposition, by name."""
    return {name: o.decompose for name, o in OPS.items() if o.decompose is not None}


def primitives() -> list[str]:
    """The primitive set, sorted: the ops a device must implement so that every other op runs on it through
    its decomposition (ops with no decomposition that are not ``device_generic``). Ops a plugin defines
    count once the plugin is loaded (that plugin registers their kernels itself)."""
    return sorted(name for name, o in OPS.items() if o.decompose is None and not o.device_generic)


def recording() -> bool:
    """Whether a post-autograd dispatch mode (kiln-compile's tracer, a profiler) is active on this thread.
    Code that writes tensors behind the dispatcher's back (a fused optimizer update) must then run ops,
    which the mode sees."""
    return bool(_state.post_modes())


def host_view(tensor: Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's elements: same memory, shape and strides, no copy.

    Writing to it writes to the tensor (bypassing autograd's version counter: kernels write only
    to tensors they created). Raises ``TypeError`` for tensors on other devices.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"host_view() expects a kiln.Tensor, got {type(tensor).__name__}")
    return tensor._numpy()


def mark_written(tensor: Tensor) -> Tensor:
    """Count a write into ``tensor`` made behind the dispatcher's back: a compiled program's kernel that
    stored its result into an existing tensor through :func:`host_view`, where eager code would have called
    ``copy_``. Autograd then sees the write as it sees ``copy_``'s (a tensor saved for backward before it
    raises PyTorch's "modified by an inplace operation" error). Returns ``tensor``."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"mark_written() expects a kiln.Tensor, got {type(tensor).__name__}")
    _check_inplace_allowed(tensor)  # as copy_ refuses: an inference tensor outside inference mode, say
    tensor._vc[0] += 1
    return tensor


def tensor_from_storage(storage, shape, stride, offset: int, dtype, device) -> Tensor:
    """A tensor over a device plugin's own ``storage`` (``len(storage)`` elements of ``dtype``), with the
    given shape, element strides and storage offset — how a plugin wraps memory it did not allocate through
    kiln (a CUDA array another library owns, say). The view must stay inside the storage."""
    from kiln._device import as_device
    from kiln._tensor import Size, _make

    shape, stride = tuple(int(n) for n in shape), tuple(int(s) for s in stride)
    if len(shape) != len(stride):
        raise ValueError(f"tensor_from_storage: {len(shape)} sizes but {len(stride)} strides")
    if any(n < 0 for n in shape) or any(s < 0 for s in stride) or offset < 0:
        raise ValueError("tensor_from_storage: sizes, strides and offset must be non-negative")
    end = offset + (sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if all(shape) else 0)
    if end > len(storage):
        raise ValueError(f"tensor_from_storage: the view needs {end} elements, the storage holds {len(storage)}")
    return _make(storage, Size(shape), stride, int(offset), dtype, as_device(device))


def from_array(array: np.ndarray, dtype=None) -> Tensor:
    """A new CPU tensor owning ``array`` (no copy when it is dense and already of ``dtype``'s NumPy type).

    ``dtype`` defaults to the kiln dtype of the array's NumPy dtype; a dense array keeps its stride
    order, anything else is copied to row-major first.
    """
    if dtype is None:
        from kiln._dtype import from_numpy_dtype

        dtype = from_numpy_dtype(np.asarray(array).dtype)
    return _from_array(array, dtype)


def compute_dtype(dtype) -> np.dtype:
    """The NumPy dtype a kernel computes a ``dtype`` result in: float32 for float16 and bfloat16 (as
    PyTorch's CPU kernels do), the dtype itself otherwise."""
    return compute_numpy(dtype)


def adaptive_pool_bounds(size: int, output_size: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive pooling windows over a dim of ``size``: arrays of the ``output_size`` window
    starts and (exclusive) ends, ``floor(i*size/out)`` to ``ceil((i+1)*size/out)``."""
    return _adaptive_bounds(size, output_size)


def pool_window_positions(
    output_size: int, kernel_size: int, stride: int, padding: int, dilation: int, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """The input positions of every tap of every pooling window over one dim: an int array of shape
    ``(output_size, kernel_size)`` and a bool mask of the taps that fall inside the input."""
    return _window_positions(output_size, kernel_size, stride, padding, dilation, size)


def batch_norm_layout(shape: tuple) -> NormLayout:
    """The :class:`NormLayout` of batch (and instance) norm over an input of ``shape``: statistics per
    channel (dim 1)."""
    return _channel_layout(tuple(shape))


def layer_norm_layout(shape: tuple, normalized_shape: tuple) -> NormLayout:
    """The :class:`NormLayout` of layer norm: statistics over the trailing ``normalized_shape`` dims."""
    return _layer_layout(tuple(shape), tuple(normalized_shape))


def group_norm_layout(shape: tuple, groups: int) -> NormLayout:
    """The :class:`NormLayout` of group norm: statistics per sample and group of channels."""
    return _group_layout(tuple(shape), groups)
