"""The op registry and dispatcher (architecture page, "Ops and the dispatcher").

An op is defined once with :func:`op`: a signature-and-docstring function (its body is never run,
like a pluggy hookspec) plus

* ``meta(*args) -> spec``: validates arguments (every user error is raised here, before any kernel
  runs) and returns the output spec ``(shape, dtype, device)``, or a tuple of specs for ops with
  several outputs;
* ``backward``: the autograd formula, written in kiln ops so higher-order gradients work (see
  :mod:`kiln.autograd.graph` for its calling convention);
* ``reference``: the NumPy kernel for device ``"cpu"``, called as ``reference(spec, *args)`` with CPU
  tensors replaced by NumPy views; it returns arrays, which are wrapped as tensors of the spec's dtype;
* ``autocast``: the policy kiln-amp reads (a key of :data:`AUTOCAST_POLICIES`, or ``None``).

Calling an op: ``meta`` → kernel looked up in ``op.kernels[device_type]`` (a plain dict, filled by
:mod:`kiln._plugins` on first use of a device type) → output check → autograd recording. Dispatch
modes (autocast, tracing, profiling) sit around that path on a thread-local stack and cost one truth
test when unused.

Output check: a kernel's result must match the spec its op's meta function computed — a
:class:`~kiln.Tensor` (a tuple of ``num_outputs`` tensors for ops with several outputs) of the spec's
shape and dtype on the spec's device — or the call raises ``RuntimeError`` naming the op, the device
and the plugin that registered the kernel. The first call per (op, device type, output dtype) is
checked; the kernel then goes into a per-op cache keyed by output dtype and device type, which later
calls consult instead of ``op.kernels`` (one dict lookup more, no check; emptied whenever the kernel
table changes). Under ``KILN_CHECK_KERNELS=1`` (read at import; the conformance kit switches it on
through :func:`check_kernel_outputs`) every call is checked.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from kiln._device import out_of_memory
from kiln._lazy import first_call
from kiln._modes import DispatchMode, call_with_modes
from kiln._public import LANE_PREFIX, make_public
from kiln._spec import Spec
from kiln._state import away, modes_away, state
from kiln._tensor import Tensor, stale_view_requires_grad

__all__ = [
    "AUTOCAST_POLICIES",
    "Composite",
    "COMPOSITES",
    "OpDef",
    "composite",
    "op",
    "OPS",
    "TAGS",
    "call",
    "DispatchMode",
    "check_kernel_outputs",
    "kernel_outputs_checked_always",
]

OPS: dict[str, OpDef] = {}
"""Every defined op by name (the registry the plugin manager fills kernels for)."""

AUTOCAST_POLICIES: dict[str, str] = {
    "lower": "runs in the autocast dtype (matrix products, convolutions)",
    "fp32": "runs in float32 (losses, linear algebra, ops that lose accuracy in 16 bits)",
    "fp32_float16": "runs in float32 when the autocast dtype is float16, whose range is narrow (exp, log, pow, "
    "softmax, sums, norms); as given under bfloat16, whose range is float32's",
    "banned_float16": "an error when the autocast dtype is float16 (an unsafe op with a safe alternative); "
    "float32 otherwise",
    "promote": "runs in the widest floating dtype among its floating inputs (cat, stack, addcmul)",
}
"""The autocast policies an op record (or a :func:`composite`) may carry, each with its meaning. Only
floating tensors other than float64 on the autocast region's device type are cast; in-place ops are never
cast (kiln-amp's autocast applies them)."""

_AUTOCAST_POLICIES = (None, *AUTOCAST_POLICIES)

TAGS: dict[str, str] = {
    "pointwise": "each output element depends only on the input elements at the same (broadcast) position",
    "reduction": "reduces some dims of its input (the spec carries the normalised dims)",
    "scan": "a cumulative op along one dim (cumsum, cumprod, logcumsumexp, cummax, cummin)",
    "view": "returns a view sharing its input's storage; needs only metadata, so it runs on every device",
    "creation": "makes a new tensor from sizes, values or another tensor's metadata",
    "random": "draws from a random generator (results depend on the generator's state)",
    "fused": "a fused kernel for what its decomposition computes with several ops (a device may skip it)",
    "backward": "computes a gradient: it appears in backward formulas, not in user code",
    "inplace": "writes into its first argument (copy_, index_put_ ...)",
    "shape": "moves, selects or repeats elements without arithmetic (cat, stack, flip, roll, pad ...)",
    "copy": "copies elements into new storage (clone, dtype and device conversion)",
    "index": "reads or writes through a tensor of indices or a mask (gather, scatter, index ops, sort, bincount)",
    "dynamic_shape": "the output's shape depends on the input's values (nonzero, masked_select, unique)",
    "linalg": "a matrix product or linear-algebra routine",
    "nn": "a neural-network primitive (convolution, pooling, normalization, loss, activation)",
    "nondeterministic": "its result may differ between runs on the same input (e.g. unique's order on some devices)",
}
"""The op tags, each with its meaning: what code generators, autocast and test kits select ops by."""

# the operators whose in-place form is ``__i<name>__`` (``a += b``)
_INPLACE_OPERATORS = frozenset(
    ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift", "matmul"]
)


class SparseArgument(NotImplementedError):
    """Raised when code reads a dense attribute (``_shape``, ``_storage``...) of a sparse COO tensor, which has
    none (``kiln._sparse``). :func:`call` catches it from an op's meta function and runs the op's sparse
    implementation, or raises PyTorch's ``NotImplementedError`` naming the op; elsewhere it says which
    attribute was missing."""


class OpDef:
    """One op: signature, meta function, autograd formula, autocast policy and per-device kernels."""

    __slots__ = (
        "name",
        "signature",
        "meta",
        "backward",
        "reference",
        "autocast",
        "kernels",
        "inplace_kernels",
        "bind",
        "tensor_params",
        "param_names",
        "num_outputs",
        "differentiable_outputs",
        "public",
        "grad_fn_name",
        "tags",
        "methods",
        "inplace",
        "device_generic",
        "decompose",
        "_backward_needs",
        "_checked",
        "__weakref__",
    )

    def __init__(
        self,
        name,
        signature,
        meta,
        backward,
        reference,
        autocast,
        num_outputs,
        differentiable_outputs,
        grad_fn_name,
        *,
        tags=(),
        methods=(),
        inplace=False,
        device_generic=False,
        decompose=None,
    ):
        if autocast not in _AUTOCAST_POLICIES:
            raise ValueError(f"op {name}: autocast must be one of {_AUTOCAST_POLICIES}, got {autocast!r}")
        if not tags:
            raise ValueError(f"op {name}: give it at least one tag (kiln.backend.TAGS: {', '.join(TAGS)})")
        unknown = set(tags) - TAGS.keys()
        if unknown:
            raise ValueError(f"op {name}: unknown tags {sorted(unknown)}; the tags are {sorted(TAGS)}")
        self.tags = frozenset(tags)
        self.methods = tuple(methods)
        self.inplace = bool(inplace)
        # a device-generic reference needs only metadata and the device contract, so it serves every device
        # type, and it takes tensors, not arrays
        self.device_generic = bool(device_generic)
        self.decompose = decompose
        self.name = name
        self.signature = signature
        self.meta = meta
        self.backward = backward
        self.reference = reference
        self.autocast = autocast
        self.kernels: dict[str, Callable] = {}
        # device type -> the in-place variant's kernel (kiln._plugins._inplace_select), where a backend registered one
        self.inplace_kernels: dict[str, Callable] = {}
        # the op's arguments as one tuple, defaults filled in (kiln._public.make_binder): set for the ops that
        # have an in-place variant (kiln._ops.copy.inplace_variant), which calls in-place kernels through it
        self.bind = None
        self.num_outputs = num_outputs
        self.differentiable_outputs = differentiable_outputs
        self.param_names = tuple(signature.parameters)
        # Parameters that may carry tensors: annotated with "Tensor" (a list of tensors: "Sequence[Tensor]").
        self.tensor_params = tuple(
            i
            for i, p in enumerate(signature.parameters.values())
            if p.annotation is not p.empty
            and "Tensor" in (p.annotation if isinstance(p.annotation, str) else repr(p.annotation))
        )
        self.public = None
        # the autograd node's class name: a string, a function of the call's args, or PyTorch's default
        self.grad_fn_name = (
            grad_fn_name or "".join(p[:1].upper() + p[1:] for p in name.strip("_").split("_")) + "Backward0"
        )
        self._backward_needs = None
        # output dtype -> device type -> the kernel of ``kernels`` whose output passed the check there (see
        # call_kernel); emptied by kiln._plugins whenever the kernel table changes, so new kernels are checked
        self._checked: dict[Any, dict[str, Callable]] = {}
        if backward is not None:
            from kiln.autograd.graph import backward_needs

            self._backward_needs = backward_needs(self, backward)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "meta":  # the public function calls the meta function it was made with: give it this one
            public = getattr(self, "public", None)
            if public is not None:
                public.__globals__["_meta"] = value

    def __repr__(self) -> str:
        return f"<kiln op {self.name}{self.signature}>"

    @property
    def inplace_saves_self(self) -> bool:
        """Whether the in-place variant must keep a copy of ``self``'s old value for autograd: its backward
        formula reads the op's first argument, which the in-place write destroys (read off the formula's
        parameter names; ``exp_`` reads ``result`` and saves nothing extra, ``mul_`` reads ``input``)."""
        needs = self._backward_needs
        return needs is not None and self.param_names[0] in needs.arg_names

    @property
    def inplace_methods(self) -> tuple[str, ...]:
        """The ``Tensor`` methods of the in-place variant, derived from ``methods``: ``add`` -> ``add_``,
        ``__add__`` -> ``__iadd__`` (reflected and comparison operators have no in-place form)."""
        if not self.inplace:
            return ()
        names = [f"{self.name}_"]
        for m in self.methods:
            if m.startswith("__"):
                base = m.strip("_")
                if base in _INPLACE_OPERATORS:
                    names.append(f"__i{base}__")
            elif m != self.name:
                names.append(f"{m}_")
        return tuple(names)

    def __call__(self, *args):
        return call(self, args)


# ops without PyTorch's ``out=`` keyword: views and in-place ops write nowhere else, backward pieces are
# internal, and random ops draw into their own result
_NO_OUT_TAGS = frozenset({"view", "inplace", "backward"})


def _takes_out(opdef: OpDef) -> bool:
    """Whether the op's public function takes ``out=`` (every op that computes new tensors, as in PyTorch)."""
    return "out" not in opdef.signature.parameters and not (_NO_OUT_TAGS & set(opdef.tags))


def call_out(opdef: OpDef, args: tuple, out: Any) -> Any:
    """``op(..., out=t)``: compute the result, then write it into ``out`` (:func:`write_out`)."""
    check_out_args(opdef.name, args)
    return write_out(opdef.name, call(opdef, args), out)


def check_out_args(name: str, args: tuple) -> None:
    """PyTorch's rule for ``out=``: no autograd through it, so no argument may require grad (in grad mode)."""
    from kiln.autograd.grad_mode import is_grad_enabled

    if is_grad_enabled() and any(_requires_grad(a) for a in args):
        raise RuntimeError(
            f"{name}(): functions with out=... arguments don't support automatic differentiation, but one of the "
            "arguments requires grad."
        )


def write_out(name: str, result: Any, out: Any) -> Any:
    """Write ``result`` (a tensor or a tuple of them) into ``out`` (a tensor, or a tuple of one per
    output) as PyTorch does: the result's dtype must cast to ``out``'s, the devices must match, and an
    ``out`` of another shape is resized (with PyTorch's deprecation warning unless it was empty).
    Returns ``out``. Functions written in Python that take ``out=`` call this (after
    :func:`check_out_args`); ops get it from :func:`call_out`."""
    from kiln._ops._meta import can_cast, scalar_type_name
    from kiln.autograd.grad_mode import is_grad_enabled, no_grad

    results = result if isinstance(result, tuple) else (result,)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if (
        (len(results) == 1) == isinstance(out, (tuple, list))
        or len(outs) != len(results)
        or not all(isinstance(o, Tensor) for o in outs)
    ):
        want = "Tensor" if len(results) == 1 else f"tuple of {len(results)} Tensors"
        got = type(out).__name__ if not isinstance(out, (tuple, list)) else f"{type(out).__name__} of {len(outs)}"
        raise TypeError(f"{name}(): argument 'out' must be {want}, not {got}")
    for r, o in zip(results, outs, strict=True):
        if o._device != r._device:
            raise RuntimeError(f"Expected out tensor to have device {r._device}, but got {o._device} instead")
        if not can_cast(r._dtype, o._dtype):
            raise RuntimeError(
                f"result type {scalar_type_name(r._dtype)} can't be cast to the desired output type "
                f"{scalar_type_name(o._dtype)}"
            )
        if o.requires_grad and is_grad_enabled():
            raise RuntimeError(
                f"{name}(): functions with out=... arguments don't support automatic differentiation, but one "
                "of the arguments requires grad."
            )
    for r, o in zip(results, outs, strict=True):
        with no_grad():
            if tuple(o._shape) != tuple(r._shape):
                if o.numel():
                    import warnings

                    warnings.warn(
                        f"An output with one or more elements was resized since it had shape {list(o._shape)}, "
                        f"which does not match the required output shape {list(r._shape)}. This behavior is "
                        "deprecated, and in a future PyTorch release outputs will not be resized unless they have "
                        "zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                        "elements with t.resize_(0).",
                        UserWarning,
                        stacklevel=3,
                    )
                o.data = r.to(o._dtype) if r._dtype != o._dtype else r.clone()
            else:
                o.copy_(r)
    if isinstance(result, tuple) and hasattr(result, "_fields"):  # max(dim=...) -> return_types.max(out...)
        return type(result)(*outs)
    return out


def with_out(fn: Callable | None = None, *, position: int | None = None) -> Callable:
    """Give a public function written in Python (not an op) PyTorch's ``out=`` keyword, with the same
    rules as ops have it (:func:`call_out`). ``position``: where PyTorch's signature has ``out`` as an
    ordinary parameter (``torch.norm(input, p, dim, keepdim, out, dtype)``) rather than keyword-only."""
    if fn is None:
        return functools.partial(with_out, position=position)
    sig = inspect.signature(fn)
    name = fn.__name__

    @functools.wraps(fn)
    def run(*args, out=None, **kwargs):
        if position is not None and len(args) > position:
            if out is not None:
                raise TypeError(f"{name}() got multiple values for argument 'out'")
            out, args = args[position], args[:position] + args[position + 1 :]
        if out is None:
            return fn(*args, **kwargs)
        check_out_args(name, args + tuple(kwargs.values()))
        return write_out(name, fn(*args, **kwargs), out)

    params = list(sig.parameters.values())
    if position is None:
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        params.insert(at, inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None))
    else:
        params.insert(position, inspect.Parameter("out", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
    run.__signature__ = sig.replace(parameters=params)
    return run


def _requires_grad(a: Any) -> bool:
    if isinstance(a, Tensor):
        return a.requires_grad
    if isinstance(a, (tuple, list)):
        return any(_requires_grad(x) for x in a)
    return False


def op(
    *,
    meta: Callable,
    reference: Callable | None = None,
    backward: Callable | None = None,
    autocast: str | None = None,
    num_outputs: int = 1,
    differentiable_outputs: tuple[int, ...] | None = None,
    name: str | None = None,
    doc: str | None = None,
    methods: tuple[str, ...] = (),
    grad_fn_name: str | Callable[[tuple], str] | None = None,
    tags: tuple[str, ...] = (),
    inplace: bool = False,
    device_generic: bool = False,
    decompose: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Define an op from a signature-and-docstring function; returns the public callable.

    The op record holds every fact about the op; nothing else lists ops (see the architecture page):

    * ``methods`` names the ``Tensor`` methods (and operators) bound to the op, e.g. ``("add", "__add__")``.
      Parameters annotated with ``Tensor`` are the op's tensor inputs; autograd records edges for them.
    * ``name`` and ``doc`` override the function's own (for op families defined in a loop).
    * ``grad_fn_name`` names the autograd node (PyTorch's name, e.g. ``"MmBackward0"``; a function of
      the call's arguments when the name depends on the overload). An op with no ``backward`` that names
      its node with a function (the comparisons) has PyTorch's zero formula in place: ``eq_`` records that
      node, which gives zeros, where the op would record none (``kiln._ops.copy.inplace_variant``).
    * ``tags``: what kind of op it is (keys of :data:`TAGS`; at least one).
    * ``inplace``: the op has an in-place variant (``add_``, and ``__iadd__`` for operators); whether
      that variant saves ``self`` for autograd is derived from ``backward`` (:attr:`OpDef.inplace_saves_self`).
    * ``device_generic``: ``reference`` needs only tensor metadata and the device contract (views,
      copies, creation), so it serves every device type; it takes the tensors, not NumPy views.
    * ``decompose``: the op written in other kiln ops, with the op's own signature. A device with no
      kernel for the op runs it (before the opt-in CPU fallback); compilers lower through it.
    """

    def decorate(doc_fn: Callable) -> Callable:
        op_name = name or doc_fn.__name__
        if op_name in OPS:
            raise ValueError(f"op {op_name!r} is already defined")
        sig = inspect.signature(doc_fn)
        clash = [name for name in sig.parameters if name.startswith(LANE_PREFIX)]
        if clash:  # the public function's own locals
            raise ValueError(f"op {op_name!r}: parameter names {clash} are taken by the generated public function")
        if doc is not None:
            doc_fn.__doc__ = doc
        if not doc_fn.__doc__:
            raise ValueError(f"op {op_name!r} needs a docstring")
        diff = differentiable_outputs if differentiable_outputs is not None else tuple(range(num_outputs))
        opdef = OpDef(
            op_name,
            sig,
            meta,
            backward,
            reference,
            autocast,
            num_outputs,
            diff,
            grad_fn_name,
            tags=tags,
            methods=methods,
            inplace=inplace,
            device_generic=device_generic,
            decompose=decompose,
        )
        OPS[op_name] = opdef
        from kiln import _plugins

        _plugins.op_defined(opdef)
        public = make_public(opdef, doc_fn, sys.modules[__name__])
        opdef.public = public
        for m in methods:
            _bind_method(m, public)
        return public

    return decorate


def _bind_method(method_name: str, fn: Callable) -> None:
    """Attach an op to ``Tensor`` (``self`` is the op's first argument)."""
    setattr(Tensor, method_name, fn)


# ---------------------------------------------------------------------------------------- calling


def call(opdef: OpDef, args: tuple):
    """Run an op: modes in front of autograd, then meta, kernel (behind the modes after autograd) and
    autograd recording.

    The modes in front of autograd re-enter here with their own stack level emptied (see
    :func:`kiln._modes.call_with_modes`), so one function serves both: the hot path pays no second call.
    """
    moded = away[0]  # any thread away from the default state: only then is the thread-local state read
    modes = modes_away[0]  # (counted in away too: its dispatch modes are read only when some thread has one)
    if modes:
        pre = state.pre_autograd_modes
        if pre:
            return call_with_modes(pre, opdef, args, call)
    try:  # free unless raised (Python 3.11's zero-cost exceptions)
        spec = opdef.meta(*args)
    except SparseArgument:
        # a sparse COO tensor among the arguments: its dense attributes raise this (kiln/_sparse.py), so no
        # dense kernel ever sees it; the sparse implementation of the op runs, or a NotImplementedError
        from kiln._sparse_ops import dispatch_sparse

        return dispatch_sparse(opdef, args)
    if modes and state.post_autograd_modes:
        out = call_with_modes(
            state.post_autograd_modes,
            opdef,
            args,
            lambda o, a: call_kernel(o, a, spec if (o is opdef and a is args) else None),
        )
    else:
        out = call_kernel(opdef, args, spec)
    if opdef._backward_needs is not None and (not moded or state.grad_enabled):
        for i in opdef.tensor_params:
            a = args[i]
            if isinstance(a, Tensor):
                if a._requires_grad or (a._base is not None and a._view_vc != a._vc[0] and stale_view_requires_grad(a)):
                    break
            elif isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) and t.requires_grad for t in a):
                break
        else:
            return out
        _record(opdef, args, out)
    return out


def runs_bare(input: Tensor) -> bool:
    """Whether :func:`call` would run only an op's meta function and kernel on ``input`` (its one tensor
    argument): no dispatch mode on this thread, and no history to record (``input`` needs no gradient, or
    grad mode is off). A view method may then call those two itself (``Tensor.view``, ``Tensor.expand``)."""
    if away[0]:
        s = state
        if modes_away[0] and (s.pre_autograd_modes or s.post_autograd_modes):
            return False
        if not s.grad_enabled:
            return True
    return not (
        input._requires_grad
        or (input._base is not None and input._view_vc != input._vc[0] and stale_view_requires_grad(input))
    )


_record = first_call(globals(), "kiln.autograd.graph", "record", "_record")  # the autograd module imports this one


def call_kernel(opdef: OpDef, args: tuple, spec=None):
    """Look up and run the kernel alone (no autograd, no modes); ``spec`` is recomputed if not given.

    The kernel's output is checked against ``spec`` on the first call per (op, device type, output
    dtype), and on every call under :func:`check_kernel_outputs` (``KILN_CHECK_KERNELS=1``).
    """
    if spec is None:
        spec = opdef.meta(*args)
    first = spec if opdef.num_outputs == 1 else spec[0]
    # The hot path: a kernel already checked for this output dtype and device type, found with one more
    # dict lookup than ``kernels[device_type]`` alone (no tuple key to build, no check to run).
    try:
        by_type = opdef._checked.get(first[1])
        kernel = None if by_type is None else by_type.get(first[2].type)
        if kernel is None:
            return _call_and_check(opdef, args, spec, first)
        # positional calls for the usual arities: kernel(spec, *args) builds a list, then a tuple (~150 ns)
        n = len(args)
        if n == 2:
            return kernel(spec, args[0], args[1])
        if n == 3:
            return kernel(spec, args[0], args[1], args[2])
        if n == 1:
            return kernel(spec, args[0])
        return kernel(spec, *args)
    except MemoryError as exc:  # PyTorch's allocator error is a RuntimeError
        raise out_of_memory(exc) from None


def call_below_autograd(opdef: OpDef, args: tuple):
    """Run an op's kernel through the post-autograd modes but not autograd: the core's own writes (``copy_``,
    the in-place variants, ``.grad`` accumulation) call it so that a tracer sees every write."""
    if modes_away[0]:
        post = state.post_autograd_modes
        if post:
            return call_with_modes(post, opdef, args, call_kernel)
    return call_kernel(opdef, args)


def _call_and_check(opdef: OpDef, args: tuple, spec, first: tuple):
    """Run the kernel of ``kernels[device_type]`` (resolving it on first use) and check its output; unless
    every call is checked, remember it in ``opdef._checked`` so that later calls skip both."""
    dev = first[2]
    kernel = opdef.kernels.get(dev.type)
    if kernel is None:
        from kiln._plugins import resolve_kernel

        kernel = resolve_kernel(opdef, dev)
    _check_spec(opdef, spec)
    out = kernel(spec, *args)
    _check_output(opdef, spec, out, dev.type, first[1])
    from kiln._plugins import _lock

    # Under the plugin manager's lock, and only if the table still holds this kernel: a plugin registered
    # by another thread meanwhile must not have its new kernel hidden behind this one. A kernel narrowed
    # by dtype (several registrations for one device type) is remembered as the one it picked for this
    # output dtype, so that later calls skip the by-dtype layer too.
    with _lock:
        if not _check_always and opdef.kernels.get(dev.type) is kernel:
            pick = getattr(kernel, "kiln_pick", None)
            picked = pick(first[1]) if pick is not None else None
            opdef._checked.setdefault(first[1], {})[dev.type] = picked if picked is not None else kernel
    return out


# ---------------------------------------------------------------------------------------- output checks

_check_always = os.environ.get("KILN_CHECK_KERNELS") == "1"


def check_kernel_outputs(always: bool) -> None:
    """Check every kernel call's output against its op's spec (``always=True``), or only the first
    call per (op, device type, output dtype) (``always=False``, the default).

    ``KILN_CHECK_KERNELS=1`` in the environment sets ``always`` at ``import kiln``; the conformance kit
    (``pytest --kiln-device=NAME``) switches it on, so a kernel that is right on its first call and wrong
    later is caught with a message naming it. It costs a few microseconds per op call.
    """
    global _check_always
    from kiln._plugins import _lock

    with _lock:  # (see _call_and_check)
        _check_always = bool(always)
        if _check_always:
            # kernels checked once would be skipped: forget them so every call is checked from now on
            for opdef in OPS.values():
                opdef._checked.clear()


def kernel_outputs_checked_always() -> bool:
    """Whether every kernel call's output is checked (:func:`check_kernel_outputs`)."""
    return _check_always


def _check_output(opdef: OpDef, spec, out, dev_type: str, dtype) -> None:
    """Raise ``RuntimeError`` naming the op, the device type and the kernel's provider unless ``out``
    matches ``spec``."""
    if opdef.num_outputs == 1:
        problems = _output_problems(spec, out, "")
    elif not isinstance(out, tuple) or len(out) != opdef.num_outputs:
        problems = [f"returned {_describe(out)}, expected a tuple of {opdef.num_outputs} tensors"]
    else:
        problems = []
        for i, (s, o) in enumerate(zip(spec, out)):
            problems += _output_problems(s, o, f"output {i}: ")
    if problems:
        from kiln._plugins import describe_kernel_source

        source = describe_kernel_source(opdef, dev_type, dtype)
        raise RuntimeError(
            f"the kernel for op '{opdef.name}' on device type '{dev_type}' ({dtype}) from {source} "
            f"returned a result that does not match the op's meta function: {'; '.join(problems)}. "
            "A kernel must return a kiln.Tensor of spec's shape and dtype on spec's device "
            "(a tuple of them for ops with several outputs); this is a bug in the kernel."
        )


def _check_spec(opdef: OpDef, spec) -> None:
    """A meta function returns a :class:`~kiln.backend.Spec` (a tuple of them for several outputs): kernels
    read its fields by name. Checked before the first kernel call, so a core bug cannot reach a plugin."""
    specs = (spec,) if opdef.num_outputs == 1 else spec
    if not isinstance(specs, tuple) or not all(isinstance(s, Spec) for s in specs):
        raise TypeError(f"the meta function of op '{opdef.name}' returned {spec!r}, not a kiln.backend.Spec")


def _output_problems(spec, out, where: str) -> list[str]:
    """What is wrong with one output ``out`` given its :class:`~kiln.backend.Spec`."""
    shape, dtype, device = tuple(spec.shape), spec.dtype, spec.device
    if not isinstance(out, Tensor):
        return [f"{where}returned {_describe(out)}, expected a kiln.Tensor of shape {shape}, dtype {dtype} on {device}"]
    problems = []
    if out._shape != shape:
        problems.append(f"{where}shape {out._shape}, expected {shape}")
    if out._dtype is not dtype:
        problems.append(f"{where}dtype {out._dtype}, expected {dtype}")
    if out._device != device:
        problems.append(f"{where}device {out._device}, expected {device}")
    return problems


def _describe(x) -> str:
    """A short description of a non-tensor result (its type, with the module for non-builtins)."""
    if x is None:
        return "None"
    if isinstance(x, Tensor):  # one tensor where a tuple was expected
        return "a single kiln.Tensor"
    t = type(x)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    if isinstance(x, (tuple, list)):
        return f"a {name} of {len(x)}"
    return f"a {name}"


# ---------------------------------------------------------------------------------------- composites


class Composite:
    """A public function written in kiln ops (a loss, a layer's functional form) that carries an autocast
    policy of its own, as the PyTorch op of that name does: ``mse_loss`` runs in float32 under autocast
    although the ops it is made of would not. Made by :func:`composite`; listed in :data:`COMPOSITES`."""

    __slots__ = ("name", "fn", "autocast")

    def __init__(self, name: str, fn: Callable, autocast: str):
        if autocast not in AUTOCAST_POLICIES:
            raise ValueError(f"composite {name}: autocast must be one of {tuple(AUTOCAST_POLICIES)}, got {autocast!r}")
        self.name, self.fn, self.autocast = name, fn, autocast

    def __repr__(self) -> str:
        return f"<kiln composite {self.name} autocast={self.autocast!r}>"


COMPOSITES: dict[str, Composite] = {}
"""Every :class:`Composite` by its public name (``"mse_loss"``, ``"linear"`` ...)."""


def composite(*, autocast: str, name: str | None = None) -> Callable[[Callable], Callable]:
    """Give a function written in kiln ops an autocast policy (a key of :data:`AUTOCAST_POLICIES`).

    Under a pre-autograd mode (kiln-amp's autocast) the call goes through the modes'
    :meth:`DispatchMode.dispatch_composite`, which may cast the arguments; the function's own ops then run
    without that mode, as PyTorch runs a composite op below its autocast key. Outside every mode the
    cost is one truth test.
    """

    def decorate(fn: Callable) -> Callable:
        record = Composite(name or fn.__name__, fn, autocast)
        if record.name in COMPOSITES:
            raise ValueError(f"composite {record.name!r} is already defined")
        COMPOSITES[record.name] = record

        @functools.wraps(fn)
        def run(*args, **kwargs):
            if modes_away[0]:
                pre = state.pre_autograd_modes
                if pre:
                    return _composite_with_modes(pre, record, args, kwargs)
            return fn(*args, **kwargs)

        run.composite = record
        return run

    return decorate


def _composite_with_modes(stack: tuple, record: Composite, args: tuple, kwargs: dict):
    """:func:`kiln._modes.call_with_modes` for composites: each mode runs with its own stack level emptied."""
    mode = stack[-1]
    rest = stack[:-1]

    def redispatch(r, a, k):
        if rest:
            return _composite_with_modes(rest, r, a, k)
        return r.fn(*a, **k)

    saved = state.pre_autograd_modes
    state.pre_autograd_modes = rest
    try:
        return mode.dispatch_composite(record, args, kwargs, redispatch)
    finally:
        state.pre_autograd_modes = saved
