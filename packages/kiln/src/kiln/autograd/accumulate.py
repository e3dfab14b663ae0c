"""Accumulating a gradient into a leaf's ``.grad``: PyTorch's gradient layout contract (a leaf's ``.grad``
has the leaf's strides when the leaf is non-overlapping and dense), the test that lets a gradient only the
engine holds become ``.grad`` without a copy, and the hooks that run after accumulation."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numpy as np

from kiln._memory_format import contiguous_format
from kiln._tensor import _CONTIGUOUS_STRIDES, _SAME, Tensor, _numel, contiguous_strides
from kiln.autograd.grad_mode import is_grad_enabled, no_grad
from kiln.autograd.graph import RemovableHandle, _edge, _run_tensor_hooks

# A leaf's first gradient becomes its ``.grad`` without a copy when the engine holds the only reference
# to it and nothing else can reach its memory (PyTorch's AccumulateGrad does the same). That is a
# reference count test, so it runs where CPython counts every reference: from 3.14 the interpreter may
# borrow references without counting them, and free-threaded builds count them per thread.
_STEAL = (
    sys.implementation.name == "cpython"
    and sys.version_info < (3, 14)
    and getattr(sys, "_is_gil_enabled", lambda: True)()
)


# elements: below this, a gradient whose memory is not laid out as a kernel's result is (:func:`_sole_owner`)
# is copied, which costs less than walking to its holders (:func:`_reachable`)
_STEAL_MIN = 4096

# PyTorch's gradient layout contract: a leaf's .grad has the leaf's strides when the leaf is non-overlapping
# and dense, else row-major ones. ``enforce_grad_layout_policy(False)`` lets a sole-owned gradient of another
# layout become .grad as it is; a copy is always made in the contract's layout.
_LAYOUT = threading.local()


def layout_enforced() -> bool:
    """Whether this thread enforces the gradient layout contract (``enforce_grad_layout_policy``)."""
    return getattr(_LAYOUT, "enforced", True)


def set_layout_enforced(enabled: bool) -> None:
    """Switch the gradient layout contract for this thread."""
    _LAYOUT.enforced = bool(enabled)


def _contract_strides(t: Tensor) -> tuple[int, ...]:
    """The strides the contract gives ``t``'s gradient: ``t``'s own if ``t`` is non-overlapping and dense."""
    stride = t._stride
    if stride == contiguous_strides(t._shape):  # the usual leaf: row-major, so dense
        return stride
    expected = 1
    for st, size in sorted((st, n) for n, st in zip(t._shape, stride) if n != 1):
        if st != expected:
            return contiguous_strides(t._shape)
        expected *= size
    return stride


def _obeys_layout(t: Tensor, g: Tensor, want: tuple[int, ...] | None = None) -> bool:
    """Whether ``g`` has the strides the contract gives ``t``'s gradient (``want``, if known) where they matter."""
    if want is None:
        want = _contract_strides(t)
    return g._stride == want or all(n == 1 or a == b for n, a, b in zip(g._shape, g._stride, want))


def _copy_in_layout(t: Tensor, d: Tensor) -> Tensor:
    """A copy of the gradient ``d`` laid out by the contract for the leaf ``t``: a row-major one by ``clone``
    (an expanded gradient, ``x.sum().backward()``'s, in a fifth of the time of an empty tensor and a copy)."""
    want = _contract_strides(t)
    if _obeys_layout(t, d, want):
        return d.clone()
    if want == contiguous_strides(t._shape):
        return d.clone(memory_format=contiguous_format)
    from kiln._ops.factories import empty_strided

    return empty_strided(t._shape, want, dtype=d._dtype, device=d._device).copy_(d)


_refs = sys.getrefcount


def _own_refs() -> int:
    holder = [object()]
    return _refs(holder[0]) - 1  # what _refs adds to the count of an object held once


_OWN_REFS = _own_refs()


def _reachable(g: Tensor) -> tuple[list, list[int]] | None:
    """The objects through which ``g``'s memory can be reached (``g``, the tensor it views, their
    storages and NumPy views, the array that owns the memory), with how many references each has from the
    others; None when the memory is not owned by a NumPy array, so that the holders cannot all be known."""
    objs: list = []
    held: list = []
    todo = [g]
    while todo:
        o = todo.pop()
        if any(o is p for p in objs):
            continue
        objs.append(o)
        if type(o) is Tensor:
            refs = (o._storage, o._np, o._base)
        elif type(o) is np.ndarray:
            refs = (o.base,)
        else:
            return None
        for r in refs:
            if r is not None:
                held.append(r)
                todo.append(r)
    return objs, [sum(h is o for h in held) for o in objs]


def _sole_owner(t: Tensor, grads: list) -> bool:
    """Whether ``grads[0]`` can become ``t.grad`` as it is: a contiguous gradient (the parameter's layout)
    that only the engine's buffer ``grads`` holds, and whose memory nothing else reaches.

    The memory is tested first for the layouts a kernel's result has, from the reference counts of the
    storage and the array alone (so that a small gradient is taken without a copy too): ``g`` is no view, and
    its storage owns its memory, or views the array that ``g._np`` holds and owns it (a result wrapped by
    ``from_array``). Any other layout, from :data:`_STEAL_MIN` elements, by :func:`_reachable`'s walk."""
    g = grads[0]
    if not (
        _STEAL and type(g) is Tensor and g._grad_fn is None and not g._hooks and g._offset == 0 and g._dtype is t._dtype
    ):
        return False
    stride = g._stride
    # the usual gradient, a row-major leaf's (the contract's layout): row-major too, known without a call
    if (stride != t._stride or stride != _CONTIGUOUS_STRIDES.get(g._shape)) and not (
        g.is_contiguous() and (_obeys_layout(t, g) or not layout_enforced())
    ):
        return False
    if _refs(g) - _OWN_REFS != 2:  # the buffer and the local g
        return False
    st = g._storage
    a = g._np
    if g._base is None and type(st) is np.ndarray:
        if a is None or a is st:  # holders of st: g._storage, the local st (and g._np, the local a)
            return st.base is None and _refs(st) - _OWN_REFS == (2 if a is None else 4)
        if type(a) is np.ndarray:
            if st.base is a:  # the storage views the array: st held by g._storage and the local; a by st.base too
                return a.base is None and _refs(st) - _OWN_REFS == 2 and _refs(a) - _OWN_REFS == 3
            if a.base is st:  # a NumPy view of the storage: held by g._np and the local a; st also by a.base
                return st.base is None and _refs(a) - _OWN_REFS == 2 and _refs(st) - _OWN_REFS == 3
    st = a = None  # (the walk counts every holder: these locals are not among those it expects)
    if _numel(g._shape) < _STEAL_MIN:
        return False
    found = _reachable(g)
    if found is None:
        return False
    objs, held = found
    for i in range(len(objs)):  # noqa: SIM110 - by index: an iterator would hold the current object once more
        # beyond the holders inside the closure: objs itself, and for g the buffer and the local g
        if _refs(objs[i]) - _OWN_REFS != held[i] + 1 + (2 if objs[i] is g else 0):
            return False
    return True


def _accumulate_into_leaf(
    t: Tensor, g: Tensor, create_graph: bool, run_hooks: bool = True, owned: bool = False
) -> None:
    """Add the gradient ``g`` into the leaf ``t``'s ``.grad`` (``owned``: nothing else holds ``g``, so it
    may become ``.grad`` without a copy)."""
    want = t._grad_dtype
    if want is not None and want is not _SAME and g._dtype is not want:  # a leaf's grad_dtype set to another
        g = g.to(want)  # before the hooks, which see the gradient as it will be kept
        owned = False
    if run_hooks and t._hooks:
        g = _run_tensor_hooks(t._hooks, g)
        owned = False
    if t._grad is None:
        if create_graph:  # a recorded copy, as PyTorch's: never memory another tensor (another leaf's .grad) holds
            t._grad = _copy_in_layout(t, g)
        elif owned:  # the memory is g's alone: no copy (and g itself, a plain tensor that is no view, as it is)
            t._grad = g if g.__class__ is Tensor and g._base is None and not g._requires_grad else g.detach()
        else:  # a copy, in the layout of PyTorch's gradient layout contract (of g without its history)
            t._grad = _copy_in_layout(t, g.detach() if g._requires_grad else g)
    elif create_graph or t._grad._requires_grad:
        t._grad = t._grad + g
    elif is_grad_enabled():
        with no_grad():
            t._grad.add_(g)
    else:  # the engine runs with gradients off already
        t._grad.add_(g)
    ref = t._accumulator
    if ref is not None and ref.post_hooks:
        for hook in list(ref.post_hooks):
            hook(t)


def register_post_accumulate_grad_hook(t: Tensor, hook: Callable) -> RemovableHandle:
    """``Tensor.register_post_accumulate_grad_hook``: ``hook(t)`` runs after a gradient is accumulated
    into the leaf ``t``'s ``.grad``."""
    if not t._requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if t.grad_fn is not None:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    _edge(t)  # makes the leaf's AccumulatorRef, which keeps the hooks
    ref = t._accumulator
    if ref.post_hooks is None:
        ref.post_hooks = []
    ref.post_hooks.append(hook)
    return RemovableHandle(ref.post_hooks, hook)
