"""``DistributedDataParallel`` (``torch.nn.parallel.DistributedDataParallel``): data parallelism across
processes, with gradients averaged in buckets while the backward pass runs.

How it works, as in PyTorch:

* At construction every rank checks that the model has the same parameters (count, shapes, dtypes) as
  every other rank (a clear error naming the parameter and the ranks otherwise), then the parameters and
  buffers of rank 0 are broadcast to all.
* The parameters that require grad are assigned to *buckets*: in reverse order of
  ``module.parameters()`` (roughly the order in which backward produces their gradients), a small first
  bucket (1 MiB, PyTorch's ``_DEFAULT_FIRST_BUCKET_BYTES``) then buckets of ``bucket_cap_mb`` (25 MiB).
  Each bucket is one flat contiguous tensor; a gradient is copied into its slice (divided by the world
  size on the way), or *is* that slice with ``gradient_as_bucket_view=True``.
* A hook on every parameter (``register_post_accumulate_grad_hook``) marks it ready; when every
  parameter of a bucket is ready, the bucket's ``all_reduce`` is launched asynchronously, so that it
  overlaps the rest of the backward pass. Buckets launch in order. When the backward pass ends
  (``Variable._execution_engine.queue_callback``) DDP waits for every bucket and writes the averages
  into ``.grad``. After the first iteration the buckets are rebuilt once in the order the gradients
  actually arrived (rank 0's order, broadcast).
* ``no_sync()`` skips the reduction (gradients accumulate locally; the next synchronized backward
  reduces the sum). ``find_unused_parameters=True`` walks the autograd graph from the outputs after
  forward and marks the parameters it cannot reach as ready; parameters reached but left without a
  gradient (outputs not used in the loss) are marked at the end of the backward pass. A parameter
  unused on every rank keeps its ``.grad`` untouched.
* ``register_comm_hook(state, hook)`` replaces the all-reduce of each bucket with
  ``hook(state, bucket) -> Future`` (:class:`GradBucket`); :func:`allreduce_hook` is the default one.

Not built: ``join()`` (uneven inputs) raises ``NotImplementedError``; ``static_graph=True`` is accepted
and handled like ``find_unused_parameters=True`` (the same results: parameters unused in the first
iteration are found again each iteration); ``mixed_precision``, ``device_mesh`` and
``delay_all_reduce_named_params`` are not supported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import kiln
from kiln import Tensor
from kiln.distributed import distributed_c10d as _c10d
from kiln.distributed._calls import _dtype_code, _dtype_name
from kiln.distributed._groups import _skip_consistency_check
from kiln.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from kiln.futures import Future
from kiln.nn.modules.module import Module

__all__ = ["DistributedDataParallel", "GradBucket", "allreduce_hook"]

#: The size of the first bucket when ``bucket_cap_mb`` is not given (PyTorch's ``dist._DEFAULT_FIRST_BUCKET_BYTES``).
_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
#: The default bucket size, in MiB.
_DEFAULT_BUCKET_CAP_MB = 25
_MB_TO_BYTES = 1024 * 1024
#: Parameters and buffers are broadcast in flat chunks of at most this many bytes.
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def _default_group():
    pg = _c10d.group.WORLD
    if pg is None:
        raise ValueError("Default process group has not been initialized, please make sure to call init_process_group.")
    return pg


# ------------------------------------------------------------------------------------------------
# Bucket assignment


def _compute_bucket_assignment_by_size(
    tensors: Sequence[Tensor],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] | None = None,
    tensor_indices: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Group ``tensors`` into buckets of one dtype and device each, as PyTorch's
    ``dist._compute_bucket_assignment_by_size``.

    Tensors are taken in the order given; a bucket closes once its size reaches its limit (so it may pass
    the limit by one tensor). Successive buckets of a dtype take successive limits of
    ``bucket_size_limits`` (the last one repeats). ``tensor_indices`` names each tensor (default: its
    position); without it the buckets are sorted by the smallest index they hold. Returns the buckets
    (lists of indices) and each bucket's size limit.
    """
    if not tensors:
        raise ValueError("compute_bucket_assignment_by_size: no tensors given")
    if not bucket_size_limits:
        raise ValueError("compute_bucket_assignment_by_size: no bucket size limits given")
    result: list[tuple[list[int], int]] = []
    open_buckets: dict[tuple, list] = {}  # key -> [indices, size, limit]
    limit_pos: dict[tuple, int] = {}
    for i, t in enumerate(tensors):
        index = i if tensor_indices is None else tensor_indices[i]
        if expect_sparse_gradient is not None and expect_sparse_gradient[index]:
            result.append(([index], 2**63 - 1))
            continue
        key = (t.dtype, str(t.device))
        bucket = open_buckets.setdefault(key, [[], 0, 0])
        bucket[0].append(index)
        bucket[1] += t.numel() * t.element_size()
        pos = limit_pos.setdefault(key, 0)
        bucket[2] = bucket_size_limits[pos]
        if bucket[1] >= bucket[2]:
            result.append((bucket[0], bucket[2]))
            open_buckets[key] = [[], 0, 0]
            limit_pos[key] = min(pos + 1, len(bucket_size_limits) - 1)
    for indices, _size, limit in open_buckets.values():
        if indices:
            result.append((indices, limit))
    if tensor_indices is None:
        result.sort(key=lambda b: min(b[0]))
    return [b[0] for b in result], [b[1] for b in result]


# ------------------------------------------------------------------------------------------------
# The bucket a communication hook sees


class GradBucket:
    """One bucket of gradients, as a communication hook sees it (``torch.distributed.GradBucket``).

    ``buffer()`` is the flat tensor of the bucket's gradients (already summed locally, not yet
    averaged); ``gradients()`` views it per parameter; ``parameters()`` lists the parameters, in the
    bucket's order; ``index()`` is the bucket's position and ``is_last()`` says whether it is the last
    bucket of the iteration (the first to be reduced is bucket 0).
    """

    def __init__(
        self, index: int, num_buckets: int, buffer: Tensor, views: list[Tensor], parameters: list[Tensor]
    ) -> None:
        self._index, self._num_buckets, self._buffer = index, num_buckets, buffer
        self._views, self._parameters = views, parameters

    def index(self) -> int:
        """The bucket's index (bucket 0 holds the gradients that arrive first)."""
        return self._index

    def buffer(self) -> Tensor:
        """The bucket's flat, contiguous tensor of gradients."""
        return self._buffer

    def gradients(self) -> list[Tensor]:
        """One tensor per parameter: views of :meth:`buffer` in the parameters' shapes."""
        return list(self._views)

    def parameters(self) -> list[Tensor]:
        """The parameters whose gradients the bucket holds, in the bucket's order."""
        return list(self._parameters)

    def is_last(self) -> bool:
        """Whether this is the last bucket to be reduced in the iteration."""
        return self._index == self._num_buckets - 1

    def set_buffer(self, buffer: Tensor) -> None:
        """Replace the tensor :meth:`buffer` returns (what PowerSGD-style hooks do)."""
        self._buffer = buffer

    def __repr__(self) -> str:
        return f"GradBucket(index={self._index}, parameters={len(self._parameters)}, numel={self._buffer.numel()})"


# ------------------------------------------------------------------------------------------------
# The reducer


@dataclasses.dataclass
class _Bucket:
    indices: list[int]  # parameter indices, in bucket order
    buffer: Tensor  # flat gradients
    views: list[Tensor]  # per parameter, views of buffer
    size_limit: int
    pending: int = 0
    work: Any = None  # the all-reduce's Work, or the comm hook's Future
    hooked: bool = False


def _dense_view(buffer: Tensor, p: Tensor, offset: int) -> Tensor:
    """The slice of ``buffer`` at ``offset`` shaped (and, when dense, strided) like ``p``."""
    n = p.numel()
    strides = p.stride()
    if not p.is_contiguous() and _non_overlapping_dense(p.shape, strides):
        return kiln.as_strided(buffer, tuple(p.shape), tuple(strides), buffer.storage_offset() + offset)
    return buffer[offset : offset + n].view(p.shape)


def _non_overlapping_dense(shape, strides) -> bool:
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(shape, strides, strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _is_alias(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage() is b.untyped_storage()


def _hook(reducer_ref: weakref.ref, index: int, _param: Tensor) -> None:
    reducer = reducer_ref()
    if reducer is not None:
        reducer._autograd_hook(index)


def _unfinished_error(
    static_graph: bool, find_unused_parameters: bool, rank: int, unmarked: list[int], names: list[str]
) -> RuntimeError:
    """PyTorch's error for a backward pass that left parameters without a reduction."""
    outputs_msg = "making sure all `forward` function outputs participate in calculating loss. "
    bug_msg = (
        "\nIf you already have done the above, then the distributed data parallel module wasn't able to locate the "
        "output tensors in the return value of your module's `forward` function. Please include the loss function "
        "and the structure of the return value of `forward` of your module when reporting this issue (e.g. list, "
        "dict, iterable)."
    )
    msg = (
        "Expected to have finished reduction in the prior iteration before starting a new one. This error "
        "indicates that your module has parameters that were not used in producing loss. "
    )
    if static_graph:
        msg = (
            "Expected to have finished reduction in the prior iteration before starting a new one. This error "
            "indicates that your training graph has changed in this iteration, e.g., one parameter is used in first "
            "iteration, but then got unused in the second iteration. this is not compatible with static_graph set "
            "to True."
        )
    elif not find_unused_parameters:
        msg += (
            "You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` "
            "to `kiln.nn.parallel.DistributedDataParallel`, and by \n" + outputs_msg + bug_msg
        )
    else:
        msg += (
            "Since `find_unused_parameters=True` is enabled, this likely  means that not all `forward` outputs "
            "participate in computing loss. You can fix this by " + outputs_msg + bug_msg
        )
    msg += f"\nParameter indices which did not receive grad for rank {rank}: " + " ".join(str(i) for i in unmarked)
    msg += f"\nParameters which did not receive grad for rank {rank}: " + ", ".join(names)
    return RuntimeError(msg)


class Reducer:
    """The gradient reducer behind :class:`DistributedDataParallel` (``torch.distributed.Reducer``):
    buckets, per-parameter hooks, asynchronous bucket all-reduces, and the end-of-backward finalization.

    ``params`` are the parameters to reduce (index = position); ``bucket_indices`` lists the buckets
    (parameter indices, in the order buckets are reduced)."""

    def __init__(
        self,
        params: list[Tensor],
        bucket_indices: list[list[int]],
        per_bucket_size_limits: list[int],
        process_group: Any,
        bucket_bytes_cap: int,
        first_bucket_bytes_cap: int,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        param_names: list[str] | None = None,
        rebuild_size_limits: list[int] | None = None,
    ) -> None:
        self._params = list(params)
        self._names = list(param_names) if param_names is not None else [f"params[{i}]" for i in range(len(params))]
        self._pg = process_group
        self._rank = process_group.rank()
        self._bucket_bytes_cap = bucket_bytes_cap
        self._first_bucket_bytes_cap = first_bucket_bytes_cap
        self._rebuild_size_limits = rebuild_size_limits
        self._static_graph = static_graph
        self._find_unused = find_unused_parameters or static_graph
        self._gradient_as_bucket_view = gradient_as_bucket_view
        self._comm_hook: Callable | None = None
        self._comm_hook_state: Any = None
        # per-iteration accounting
        self._expect_hooks = False
        self._require_finalize = False
        self._next_bucket = 0
        self._ready: set[int] = set()
        self._has_marked_unused = False
        self._unused: list[int] = []
        self._local_used = [0] * len(self._params)
        self._local_used_work: Any = None
        self._local_used_tensor: Tensor | None = None
        self._grad_ready_order: list[int] = []
        self._warned_no_unused = False
        # bucket rebuilding after the first iteration
        self._has_rebuilt = False
        self._rebuilt_params: list[int] = []
        self.num_iterations = 0
        self._buckets: list[_Bucket] = []
        self._locator: list[tuple[int, int]] = []
        self._initialize_buckets(bucket_indices, per_bucket_size_limits)
        ref = weakref.ref(self)
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, i)) for i, p in enumerate(self._params)
        ]

    def __del__(self) -> None:
        for h in getattr(self, "_handles", []):
            with contextlib.suppress(Exception):
                h.remove()

    # ---------------------------------------------------------------- buckets
    def _initialize_buckets(self, bucket_indices: list[list[int]], size_limits: list[int]) -> None:
        seen = sorted(i for b in bucket_indices for i in b)
        if seen != list(range(len(self._params))):
            raise RuntimeError("DDP reducer: every parameter must be in exactly one bucket")
        self._buckets = []
        self._locator = [(0, 0)] * len(self._params)
        for b, (indices, limit) in enumerate(zip(bucket_indices, size_limits, strict=True)):
            params = [self._params[i] for i in indices]
            dtypes = {p.dtype for p in params}
            devices = {str(p.device) for p in params}
            if len(dtypes) != 1 or len(devices) != 1:
                raise RuntimeError("DDP reducer: all parameters of a bucket must have one dtype and one device")
            total = sum(p.numel() for p in params)
            buffer = kiln.zeros(total, dtype=params[0].dtype, device=params[0].device)
            views, offset = [], 0
            for j, (i, p) in enumerate(zip(indices, params, strict=True)):
                view = _dense_view(buffer, p, offset)
                offset += p.numel()
                views.append(view)
                self._locator[i] = (b, j)
                if self._gradient_as_bucket_view and p.grad is not None and not _is_alias(p.grad, view):
                    with kiln.no_grad():
                        view.copy_(p.grad)
                    p.grad = view
            self._buckets.append(_Bucket(list(indices), buffer, views, limit, pending=len(indices)))

    def _bucket_indices(self) -> list[list[int]]:
        """The current buckets, as lists of parameter indices (``_get_bucket_indices``... for tests)."""
        return [list(b.indices) for b in self._buckets]

    def _should_rebuild(self) -> bool:
        return (self._static_graph or not self._find_unused) and not self._has_rebuilt

    def _rebuild_buckets(self) -> bool:
        """Before a forward pass: check that the previous reduction finished, and once (after the first
        synchronized iteration) rebuild the buckets in the order gradients arrived on rank 0."""
        self._ensure_prior_reduction_finished()
        if not self._should_rebuild() or not self._rebuilt_params:
            return False
        order = list(dict.fromkeys(self._rebuilt_params))
        self._rebuilt_params = []
        if sorted(order) != list(range(len(self._params))):
            return False
        t = kiln.tensor(order, dtype=kiln.int64)
        _c10d.broadcast(t, group=self._pg, group_src=0)
        order = [int(i) for i in t.tolist()]
        limits = self._rebuild_size_limits or [self._first_bucket_bytes_cap, self._bucket_bytes_cap]
        indices, sizes = _compute_bucket_assignment_by_size([self._params[i] for i in order], limits, None, order)
        self._initialize_buckets(indices, sizes)
        self._has_rebuilt = True
        return True

    # ---------------------------------------------------------------- iteration
    def _prepare_for_forward(self) -> None:
        self.num_iterations += 1

    def _prepare_for_backward(self, outputs: list[Tensor]) -> None:
        """After a synchronized forward pass: expect the hooks, and with ``find_unused_parameters`` find the
        parameters the outputs do not reach."""
        self._expect_hooks = True
        self._grad_ready_order = []
        self._next_bucket = 0
        for b in self._buckets:
            b.pending = len(b.indices)
            b.work = None
        self._has_marked_unused = False
        self._ready = set()
        if self._find_unused:
            self._unused = self._search_unused_parameters(outputs)

    def _search_unused_parameters(self, outputs: list[Tensor]) -> list[int]:
        seen_nodes: set[int] = set()
        reached: set[int] = set()
        queue = []
        for out in outputs:
            if out.grad_fn is not None:
                queue.append(out.grad_fn)
            elif out.requires_grad:
                reached.add(id(out))
        while queue:
            node = queue.pop()
            for nxt, _ in getattr(node, "next_functions", ()):
                if nxt is not None and id(nxt) not in seen_nodes:
                    seen_nodes.add(id(nxt))
                    queue.append(nxt)
                    var = getattr(nxt, "variable", None)
                    if var is not None:
                        reached.add(id(var))
        unused = [i for i, p in enumerate(self._params) if id(p) not in reached]
        if not unused and not self._warned_no_unused and not self._static_graph:
            self._warned_no_unused = True
            warnings.warn(
                "find_unused_parameters=True was specified in DDP constructor, but did not find any unused "
                "parameters in the forward pass. This flag results in an extra traversal of the autograd graph "
                "every iteration,  which can adversely affect performance. If your model indeed never has any "
                "unused parameters in the forward pass, consider turning this flag off. Note that this warning may "
                "be a false positive if your model has flow control causing later iterations to have unused "
                "parameters.",
                UserWarning,
                stacklevel=4,
            )
        return unused

    def _ensure_prior_reduction_finished(self) -> None:
        if not self._require_finalize:
            return
        unmarked = [i for i in range(len(self._params)) if i not in self._ready]
        raise _unfinished_error(
            self._static_graph, self._find_unused, self._rank, unmarked, [self._names[i] for i in unmarked]
        )

    def _autograd_hook(self, index: int) -> None:
        if self._find_unused and self._params[index].grad is not None:
            self._local_used[index] = 1  # also during no_sync: used once in the accumulation counts
        if not self._expect_hooks:
            return
        self._grad_ready_order.append(index)
        if not self._has_marked_unused:
            self._has_marked_unused = True
            if self._find_unused:
                # parameters reached from the outputs but left without a gradient (outputs outside the loss)
                kiln.autograd.Variable._execution_engine.queue_callback(self._mark_remaining_ready)
            for u in self._unused:
                self._mark_variable_ready(u)
        self._mark_variable_ready(index)

    def _mark_remaining_ready(self) -> None:
        if not self._expect_hooks:
            return
        for i in range(len(self._params)):
            if i not in self._ready:
                self._mark_variable_ready(i)

    def _mark_variable_ready(self, index: int) -> None:
        if index in self._ready:
            raise RuntimeError(
                "Expected to mark a variable ready only once. This error is caused by one of the following reasons: "
                "1) Use of a module parameter outside the `forward` function. Please make sure model parameters are "
                "not shared across multiple concurrent forward-backward passes. 2) Reused parameters in multiple "
                "reentrant backward passes. 3) Incorrect unused parameter detection: an unused parameter became part "
                "of the autograd graph later on. If all parameters in the model participate in the backward pass, "
                "you can disable unused parameter detection by passing the keyword argument "
                f"`find_unused_parameters=False` to `kiln.nn.parallel.DistributedDataParallel`.\nParameter at index "
                f"{index} ({self._names[index]}) has been marked as ready twice. This means that multiple autograd "
                "engine  hooks have fired for this particular parameter during this iteration."
            )
        self._ready.add(index)
        self._require_finalize = True
        if self._should_rebuild():
            self._rebuilt_params.append(index)
        b, j = self._locator[index]
        bucket = self._buckets[b]
        self._copy_grad_to_bucket(index, bucket.views[j])
        bucket.pending -= 1
        if bucket.pending == 0:
            self._mark_bucket_ready(b)
        if self._next_bucket == len(self._buckets):
            if self._find_unused:
                self._all_reduce_local_used_map()
            kiln.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    def _copy_grad_to_bucket(self, index: int, view: Tensor) -> None:
        p = self._params[index]
        grad = p.grad
        with kiln.no_grad():
            if grad is None:
                view.zero_()
                return
            if not _is_alias(grad, view):
                if self._comm_hook is None:
                    # divide while copying: one pass over the gradient
                    kiln.mul(grad.detach(), 1.0 / self._pg.size(), out=view)
                else:
                    view.copy_(grad.detach())
                if self._gradient_as_bucket_view:
                    p.grad = view
            elif self._comm_hook is None:
                view.div_(self._pg.size())

    def _mark_bucket_ready(self, b: int) -> None:
        if b > self._next_bucket:
            return  # buckets are reduced in order
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._next_bucket)
            self._next_bucket += 1

    def _launch(self, b: int) -> None:
        bucket = self._buckets[b]
        with _skip_consistency_check():
            if self._comm_hook is None:
                bucket.work = _c10d.all_reduce(bucket.buffer, group=self._pg, async_op=True)
                bucket.hooked = False
            else:
                grad_bucket = GradBucket(
                    b, len(self._buckets), bucket.buffer, list(bucket.views), [self._params[i] for i in bucket.indices]
                )
                fut = self._comm_hook(self._comm_hook_state, grad_bucket)
                if not isinstance(fut, Future) and not hasattr(fut, "wait"):
                    raise RuntimeError(
                        "A DDP communication hook must return a Future (e.g. work.get_future()), got "
                        f"{type(fut).__name__}"
                    )
                bucket.work = fut
                bucket.hooked = True

    def _all_reduce_local_used_map(self) -> None:
        self._local_used_tensor = kiln.tensor(self._local_used, dtype=kiln.int32)
        with _skip_consistency_check():
            self._local_used_work = _c10d.all_reduce(self._local_used_tensor, group=self._pg, async_op=True)

    def _finalize_backward(self) -> None:
        """The end of the backward pass: wait for every bucket and write the results into ``.grad``."""
        if not self._expect_hooks:
            return
        self._expect_hooks = False
        self._require_finalize = False
        global_used: list[int] | None = None
        try:
            for bucket in self._buckets:
                if bucket.hooked:
                    result = bucket.work.wait()
                    if isinstance(result, (list, tuple)):
                        result = result[0] if result else None
                    if result is None:
                        result = bucket.buffer
                    if not isinstance(result, Tensor):
                        raise RuntimeError(
                            "A DDP communication hook's future must complete with a tensor or a list of one "
                            f"tensor, got {type(result).__name__}"
                        )
                else:
                    bucket.work.wait()
                    result = bucket.buffer
                bucket.work = None
                if result is bucket.buffer:
                    views_out = bucket.views
                else:
                    flat = result.reshape(-1)
                    if flat.numel() != bucket.buffer.numel():
                        raise RuntimeError(
                            f"A DDP communication hook returned {flat.numel()} elements for a bucket of "
                            f"{bucket.buffer.numel()}"
                        )
                    views_out, offset = [], 0
                    for i in bucket.indices:
                        p = self._params[i]
                        views_out.append(flat[offset : offset + p.numel()].view(p.shape))
                        offset += p.numel()
                for j, i in enumerate(bucket.indices):
                    if self._find_unused and not self._local_used[i]:
                        if global_used is None:
                            self._local_used_work.wait()
                            global_used = [int(v) for v in self._local_used_tensor.tolist()]
                        if not global_used[i]:
                            continue  # unused on every rank: .grad stays as it is
                    self._copy_bucket_to_grad(i, bucket.views[j], views_out[j])
        finally:
            if self._find_unused:
                if global_used is None and self._local_used_work is not None:
                    self._local_used_work.wait()
                self._local_used = [0] * len(self._params)
                self._local_used_work = None

    def _copy_bucket_to_grad(self, index: int, view_in: Tensor, view_out: Tensor) -> None:
        p = self._params[index]
        with kiln.no_grad():
            if self._gradient_as_bucket_view:
                if view_out is not view_in:
                    view_in.copy_(view_out)
                if p.grad is None:
                    p.grad = view_in
                elif not _is_alias(p.grad, view_in):
                    raise RuntimeError(
                        "Detected at least one parameter gradient is not the expected DDP bucket view with "
                        "gradient_as_bucket_view=True. This may happen (for example) if multiple allreduce hooks "
                        "were registered onto the same parameter."
                    )
            elif p.grad is None:
                p.grad = view_out.clone() if p.is_contiguous() else _like(p, view_out)
            else:
                p.grad.copy_(view_out)

    # ---------------------------------------------------------------- hooks
    def _register_comm_hook(self, state: Any, hook: Callable) -> None:
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._comm_hook, self._comm_hook_state = hook, state


def _like(p: Tensor, value: Tensor) -> Tensor:
    out = kiln.empty_strided(tuple(p.shape), tuple(p.stride()), dtype=value.dtype, device=value.device)
    return out.copy_(value)


# ------------------------------------------------------------------------------------------------
# Helpers of the module


def _find_tensors(obj: Any) -> Iterator[Tensor]:
    """Every tensor in ``obj`` (tensors, lists, tuples, dict values and dataclass fields, nested)."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _find_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _find_tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _find_tensors(getattr(obj, f.name))


def _to_device(obj: Any, device) -> Any:
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _to_device(v, device)) for k, v in obj.items())
    return obj


def _broadcast_coalesced(process_group: Any, tensors: Sequence[Tensor], buffer_size: int, group_src: int = 0) -> None:
    """Broadcast ``tensors`` from ``group_src`` in flat chunks (consecutive tensors of one dtype and
    device, up to ``buffer_size`` bytes each), written back in place on the other ranks."""
    chunks: list[list[Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not chunks or (
            t.dtype != chunks[-1][0].dtype or t.device != chunks[-1][0].device or size + nbytes > buffer_size
        ):
            chunks.append([])
            size = 0
        chunks[-1].append(t)
        size += nbytes
    mine = process_group.rank() == group_src
    with kiln.no_grad():
        for chunk in chunks:
            flat = kiln.cat([t.detach().reshape(-1) for t in chunk])
            _c10d.broadcast(flat, group=process_group, group_src=group_src)
            if not mine:
                _copy_from_flat(flat, chunk)


def _copy_from_flat(flat: Tensor, tensors: Sequence[Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``tensors`` (the inverse of ``cat`` of their flattenings)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view(t.shape))
        offset += n


def _verify_model_across_processes(
    process_group: Any, reduced: list[tuple[str, Tensor]], named: list[tuple[str, Tensor]], kind: list[str]
) -> None:
    """Check that every rank has the same parameters and buffers (count, dtype and sizes) before any
    broadcast; raise on every rank, naming the tensor and the ranks, if not (PyTorch's
    ``_verify_param_shape_across_processes``)."""
    me, world = process_group.rank(), process_group.size()
    n_params = sum(1 for k in kind if k == "params")
    n_buffers = len(kind) - n_params
    meta: list[int] = []
    for _, t in named:
        meta += [t.dim(), _dtype_code(t.dtype), *t.shape]
    head = kiln.tensor([len(reduced), n_params, n_buffers, len(meta)], dtype=kiln.int64)
    heads = [kiln.zeros(4, dtype=kiln.int64) for _ in range(world)]
    _c10d.all_gather(heads, head, group=process_group)
    rows = [h.tolist() for h in heads]
    for r, row in enumerate(rows):
        if row[0] != len(reduced):
            raise RuntimeError(
                f"DDP expects same model across all ranks, but Rank {me} has {len(reduced)} params, while rank {r} "
                f"has inconsistent {row[0]} params."
            )
    for r, row in enumerate(rows):
        if row[1] != n_params:
            raise RuntimeError(
                f"DDP expects same model across all ranks, but Rank {me} has {n_params} parameters in all (with "
                f"the ones not requiring grad), while rank {r} has inconsistent {row[1]} parameters."
            )
        if row[2] != n_buffers:
            raise RuntimeError(
                f"DDP expects same model across all ranks, but Rank {me} has {n_buffers} buffers, while rank {r} "
                f"has inconsistent {row[2]} buffers."
            )
    longest = max(row[3] for row in rows)
    if longest == 0:
        return
    padded = kiln.full((longest,), -1, dtype=kiln.int64)
    if meta:
        padded[: len(meta)] = kiln.tensor(meta, dtype=kiln.int64)
    metas = [kiln.zeros(longest, dtype=kiln.int64) for _ in range(world)]
    _c10d.all_gather(metas, padded, group=process_group)
    for r, other in enumerate(m.tolist() for m in metas):
        pos = 0
        counters = {"params": 0, "buffers": 0}
        for (name, t), k in zip(named, kind, strict=True):
            idx = counters[k]
            counters[k] += 1
            ndim, code = other[pos], other[pos + 1]
            sizes = other[pos + 2 : pos + 2 + max(ndim, 0)]
            pos += 2 + max(ndim, 0)
            if code != _dtype_code(t.dtype):
                raise RuntimeError(
                    f"DDP expects same model across all ranks, but Rank {me} has {k}[{idx}] ({name!r}) of dtype "
                    f"{t.dtype}, while rank {r} has inconsistent dtype kiln.{_dtype_name(code)} for it."
                )
            if ndim != t.dim() or sizes != list(t.shape):
                raise RuntimeError(
                    f"DDP expects same model across all ranks, but Rank {me} has {k}[{idx}] ({name!r}) with sizes "
                    f"{list(t.shape)}, while rank {r} has inconsistent sizes {sizes} for it."
                )


# ------------------------------------------------------------------------------------------------
# The module


class DistributedDataParallel(Module):
    """Data parallelism across processes (``torch.nn.parallel.DistributedDataParallel``).

    Wrap a model in every process of a group; each process feeds its own share of the data, and after
    ``loss.backward()`` every process holds the same gradients: the average over all processes. Parameters
    and buffers start out as rank 0's. ``state_dict`` keys carry the ``module.`` prefix, as PyTorch's.

    Arguments as PyTorch's: ``device_ids`` (one device for a module on one accelerator device; ``None``
    for cpu modules), ``output_device``, ``dim``, ``broadcast_buffers`` (broadcast rank 0's buffers before
    each forward), ``init_sync`` (verify and broadcast at construction), ``process_group`` (default: the
    world), ``bucket_cap_mb`` (25), ``find_unused_parameters``, ``check_reduction`` (deprecated, ignored),
    ``gradient_as_bucket_view``, ``static_graph`` (handled as ``find_unused_parameters``),
    ``bucket_cap_mb_list`` (a size limit per bucket). ``join()``, ``mixed_precision``, ``device_mesh`` and
    ``delay_all_reduce_named_params`` are not supported.
    """

    def __init__(
        self,
        module: Module,
        device_ids: Sequence | None = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Any = None,
        param_to_hook_all_reduce: Any = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: list[float] | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("delay_all_reduce_named_params", delay_all_reduce_named_params),
            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
            ("mixed_precision", mixed_precision),
            ("device_mesh", device_mesh),
        ):
            if value is not None:
                raise NotImplementedError(f"kiln's DistributedDataParallel does not support {name}")
        if skip_all_reduce_unused_params:
            raise NotImplementedError("kiln's DistributedDataParallel does not support skip_all_reduce_unused_params")
        self.process_group = process_group if process_group is not None else _default_group()
        ignore = getattr(module, "_ddp_params_and_buffers_to_ignore", None)
        self.parameters_to_ignore = set(ignore) if ignore is not None else set()
        named_params = [(n, p) for n, p in module.named_parameters() if n not in self.parameters_to_ignore]
        self._module_parameters = [p for _, p in named_params]
        if not any(p.requires_grad for p in self._module_parameters):
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any parameter that requires a "
                "gradient."
            )
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        device_types = {p.device.type for p in self._module_parameters}
        if len(device_types) != 1:
            raise ValueError(
                "DistributedDataParallel's input module must be on the same type of devices, but input module "
                f"parameters locate in {device_types}."
            )
        self.device_type = next(iter(device_types))
        self.is_multi_device_module = len({str(p.device) for p in self._module_parameters}) > 1
        if not device_ids or self.device_type == "cpu" or self.is_multi_device_module:
            if device_ids or output_device is not None:
                devices = {p.device for p in self._module_parameters}
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work with "
                    "single-device/multiple-device GPU modules or CPU modules, but got device_ids "
                    f"{device_ids}, output_device {output_device}, and module parameters {devices}."
                )
            self.device_ids = None
            self.output_device = None
        else:
            self.device_ids = [self._device_of(d) for d in device_ids]
            self.output_device = self._device_of(output_device if output_device is not None else device_ids[0])
        if check_reduction:
            warnings.warn(
                "The `check_reduction` argument in `DistributedDataParallel` module is deprecated. Please avoid "
                "using it.",
                FutureWarning,
                stacklevel=2,
            )
        self.static_graph = False
        self.dim = dim
        self.module = module
        self.device = self._module_parameters[0].device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.broadcast_bucket_size = _BROADCAST_BUCKET_BYTES
        using_default = bucket_cap_mb is None
        cap_mb = _DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        per_bucket: list[int] = []
        if bucket_cap_mb_list:
            per_bucket = [int(c * _MB_TO_BYTES) for c in bucket_cap_mb_list]
            cap_mb = max(bucket_cap_mb_list)
            using_default = False
        self.bucket_bytes_cap = int(cap_mb * _MB_TO_BYTES)
        self._first_bucket_bytes_cap = _DEFAULT_FIRST_BUCKET_BYTES if using_default else self.bucket_bytes_cap
        self.bucket_bytes_cap_default = self._first_bucket_bytes_cap < self.bucket_bytes_cap

        named_buffers = [(n, b) for n, b in module.named_buffers() if n not in self.parameters_to_ignore]
        reduced = [(n, p) for n, p in named_params if p.requires_grad]
        if init_sync:
            sync_buffers = named_buffers if broadcast_buffers else []
            _verify_model_across_processes(
                self.process_group,
                reduced,
                named_params + sync_buffers,
                ["params"] * len(named_params) + ["buffers"] * len(sync_buffers),
            )
            _broadcast_coalesced(
                self.process_group,
                self._module_parameters + [b for _, b in sync_buffers],
                self.broadcast_bucket_size,
            )
        # buckets: reverse order of module.parameters(), a small first bucket then bucket_cap_mb each
        params = [p for _, p in reduced]
        if per_bucket:
            limits = per_bucket
        elif self._first_bucket_bytes_cap < self.bucket_bytes_cap:
            limits = [self._first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            limits = [self.bucket_bytes_cap]
        order = list(reversed(range(len(params))))
        bucket_indices, size_limits = _compute_bucket_assignment_by_size(
            [params[i] for i in order], limits, None, order
        )
        self.reducer = Reducer(
            params,
            bucket_indices,
            size_limits,
            self.process_group,
            self.bucket_bytes_cap,
            self._first_bucket_bytes_cap,
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
            param_names=[n for n, _ in reduced],
            rebuild_size_limits=per_bucket or None,
        )
        self._has_rebuilt_buckets = False
        if static_graph:
            self._set_static_graph()

    @staticmethod
    def _device_of(d: Any):
        if isinstance(d, int):
            acc = kiln.accelerator.current_accelerator()
            if acc is None:
                raise RuntimeError(f"device id {d} given, but no accelerator device is available")
            return kiln.device(acc.type, d)
        return kiln.device(d)

    # ---------------------------------------------------------------- forward
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the wrapped module; afterwards the next backward pass reduces the gradients."""
        inputs, kwargs = self._pre_forward(*inputs, **kwargs)
        output = self.module(*inputs, **kwargs)
        return self._post_forward(output)

    def _pre_forward(self, *inputs: Any, **kwargs: Any) -> tuple[tuple, dict]:
        grad_enabled = kiln.is_grad_enabled()
        if grad_enabled and self.require_backward_grad_sync:
            self.reducer._prepare_for_forward()
        if grad_enabled and self.reducer._rebuild_buckets():
            self._has_rebuilt_buckets = True
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self.device_ids:
            device = self.device_ids[0]
            return _to_device(inputs, device), _to_device(kwargs, device)
        return inputs, kwargs

    def _post_forward(self, output: Any) -> Any:
        if kiln.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            if self.reducer._find_unused:
                self.reducer._prepare_for_backward(list(_find_tensors(output)))
            else:
                self.reducer._prepare_for_backward([])
        else:
            self.require_forward_param_sync = False
        return output

    def _module_buffers(self) -> list[Tensor]:
        return [b for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    def will_sync_module_buffers(self) -> bool:
        """Whether the next forward pass broadcasts rank 0's buffers first."""
        return bool(self.require_forward_param_sync and self.broadcast_buffers and self._module_buffers())

    def _sync_buffers(self) -> None:
        with kiln.no_grad(), _skip_consistency_check():  # the buffers were verified across ranks at construction
            _broadcast_coalesced(self.process_group, self._module_buffers(), self.broadcast_bucket_size, 0)

    # ---------------------------------------------------------------- user API
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this block, backward passes accumulate gradients locally without reducing them; the first
        synchronized backward after it reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> Future`` instead of the built-in all-reduce
        (once, before training starts). The future's value (a tensor, or a list holding one) replaces the
        bucket's gradients; the hook does the averaging (see :func:`allreduce_hook`)."""
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        self.reducer._register_comm_hook(state, hook)

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True, throw_on_early_termination=False):
        """Uneven inputs across ranks (PyTorch's ``join``): not built in kiln."""
        raise NotImplementedError(
            "DistributedDataParallel.join() (uneven inputs across ranks) is not implemented in kiln: give every rank "
            "the same number of batches (e.g. DistributedSampler with drop_last=True)"
        )

    def _set_static_graph(self) -> None:
        """Declare the graph static (PyTorch's ``_set_static_graph``); kiln detects unused parameters each
        iteration instead, with the same results."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", UserWarning, stacklevel=2)
            return
        self.static_graph = True
        self.reducer._static_graph = True
        self.reducer._find_unused = True
        if self.find_unused_parameters:
            warnings.warn(
                "You passed find_unused_parameters=true to DistributedDataParallel, `_set_static_graph` will detect "
                "unused parameters automatically, so you do not need to set find_unused_parameters=true, just be sure "
                "these unused parameters will not change during training loop while calling `_set_static_graph`.",
                UserWarning,
                stacklevel=2,
            )

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module: Module, params_and_buffers_to_ignore: list[str]) -> None:
        """Leave the named parameters and buffers of ``module`` out of DDP (no broadcast, no reduction)."""
        module._ddp_params_and_buffers_to_ignore = list(params_and_buffers_to_ignore)

    def _get_bucket_indices(self) -> list[list[int]]:
        """The buckets, as lists of indices into the parameters DDP reduces (for inspection and tests)."""
        return self.reducer._bucket_indices()
