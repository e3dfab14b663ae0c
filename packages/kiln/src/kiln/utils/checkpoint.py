"""Activation checkpointing (``torch.utils.checkpoint``): trade compute for memory.

:func:`checkpoint` runs a function without keeping the intermediate tensors its backward would need,
and runs it again during backward to get them back, with the CPU random state it had in forward
(``preserve_rng_state=True``), so dropout masks match. :func:`checkpoint_sequential` checkpoints the
segments of a sequence of modules.

Both of PyTorch's variants exist:

``use_reentrant=True`` (the default when ``use_reentrant`` is not passed, with PyTorch's warning)
    A custom :class:`kiln.autograd.Function`: forward runs under ``no_grad``; backward recomputes under
    ``enable_grad`` and calls :func:`kiln.autograd.backward` on the recomputed graph, which accumulates
    into the ``.grad`` of the parameters the function uses. As in PyTorch: only positional arguments
    (keyword arguments raise ``ValueError``), at least one tensor input must require grad for anything
    to get a gradient (a warning otherwise), and only ``.backward()`` works, not
    :func:`kiln.autograd.grad`.

``use_reentrant=False`` (recommended)
    Keyword arguments, nested outputs, :func:`kiln.autograd.grad` and parameters reached without any
    input requiring grad all work, as in PyTorch. kiln has no saved-tensor hooks, so this variant is
    built differently: forward runs the function recording its graph, finds the edges by which that
    graph leaves the function (the inputs, and the parameters/outside tensors it reads), then cuts the
    graph off, so every intermediate is freed when forward returns, and links the outputs to one node
    whose backward recomputes the function and differentiates it with :func:`kiln.autograd.grad`. The
    differences from PyTorch: the forward does the bookkeeping of recording (its intermediates live
    until the function returns, as they do inside any function, but not after); the whole function is
    recomputed at the first gradient that reaches it (``early_stop`` has no effect); the determinism
    check compares the shape, dtype and device of the recomputed *outputs* (PyTorch compares every
    saved tensor); ``debug=True`` adds nothing; and in-place changes to inputs made inside the function
    are not supported, nor is a non-leaf tensor that requires grad read other than through the
arguments (from a closure): the call raises, naming the fix, rather than leave it without a gradient.

The recompute runs with the random state (below) and the autocast state the forward had.
Only the default CPU generator's state is preserved (kiln's devices other than the CPU share no
random state that a recompute would need). ``context_fn`` is honoured by the non-reentrant variant:
it returns two context managers, one entered around the forward and one around the recompute.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from kiln._state import set_grad_mode, state
from kiln._tensor import Tensor
from kiln.autograd.function import Function
from kiln.autograd.graph import AccumulateGrad, Node, _edge, _seq

__all__ = [
    "CheckpointError",
    "checkpoint",
    "checkpoint_sequential",
    "noop_context_fn",
]

_DEFAULT_DETERMINISM_MODE = "default"


class CheckpointError(RuntimeError):
    """Raised when the recomputation during backward does not match the original forward."""


def noop_context_fn() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """The default ``context_fn``: two context managers that do nothing."""
    return contextlib.nullcontext(), contextlib.nullcontext()


def _get_rng():
    from kiln.random import get_rng_state

    return get_rng_state()


@contextlib.contextmanager
def _rng_as(saved):
    """Run the body with the CPU generator in state ``saved`` (None: untouched); restore it after."""
    if saved is None:
        yield
        return
    from kiln.random import get_rng_state, set_rng_state

    outer = get_rng_state()
    set_rng_state(saved)
    try:
        yield
    finally:
        set_rng_state(outer)


def _get_autocast() -> tuple[dict, dict]:
    """This thread's autocast state: per device type, whether it is on and its dtype."""
    from kiln._autocast import _state as autocast_state

    return dict(autocast_state.enabled), dict(autocast_state.dtype)


@contextlib.contextmanager
def _autocast_as(saved: tuple[dict, dict]):
    """Run the body with the autocast state ``saved`` (the recompute runs as the forward ran, as in PyTorch)."""
    from kiln._autocast import _state as autocast_state
    from kiln._autocast import autocast, get_autocast_dtype

    enabled, dtypes = saved
    with contextlib.ExitStack() as stack:
        for dev in sorted(set(enabled) | {d for d, on in autocast_state.enabled.items() if on}):
            on = enabled.get(dev, False)
            stack.enter_context(autocast(dev, dtype=dtypes.get(dev) or get_autocast_dtype(dev), enabled=on))
        yield


@contextlib.contextmanager
def _grad_mode(enabled: bool):
    prev = set_grad_mode(enabled)
    try:
        yield
    finally:
        set_grad_mode(prev)


def _detached(args: tuple) -> tuple:
    out = []
    for a in args:
        if isinstance(a, Tensor):
            d = a.detach()
            d.requires_grad_(a.requires_grad)
            out.append(d)
        else:
            out.append(a)
    return tuple(out)


# ---------------------------------------------------------------------------------------------------
# use_reentrant=True


class CheckpointFunction(Function):
    """The reentrant variant: a custom Function whose backward reruns the function and its backward."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        """Run ``run_function(*args)`` without recording; keep the inputs and the RNG state."""
        if not any(a.requires_grad for a in args if isinstance(a, Tensor)):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=4)
        ctx.run_function = run_function
        ctx.rng_state = _get_rng() if preserve_rng_state else None
        ctx.autocast = _get_autocast()
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.save_for_backward(*(a for a in args if isinstance(a, Tensor)))
        return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        """Recompute the function with grad enabled and backpropagate ``grads`` through it."""
        from kiln.autograd import backward

        inputs = list(ctx.inputs)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[i] = t
        detached = _detached(tuple(inputs))
        with _rng_as(ctx.rng_state), _grad_mode(True), _autocast_as(ctx.autocast):
            outputs = ctx.run_function(*detached)
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        with_grad, their_grads = [], []
        for out, g in zip(outputs, grads):
            if isinstance(out, Tensor) and out.requires_grad:
                with_grad.append(out)
                their_grads.append(g)
        if not with_grad:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        backward(with_grad, their_grads)
        return (None, None) + tuple(d.grad if isinstance(d, Tensor) else None for d in detached)


# ---------------------------------------------------------------------------------------------------
# use_reentrant=False


def _flatten(obj: Any, out: list) -> None:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _flatten(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _flatten(o, out)


def _replace(obj: Any, new: dict) -> Any:
    if isinstance(obj, Tensor):
        return new.get(id(obj), obj)
    if isinstance(obj, tuple):
        items = [_replace(o, new) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [_replace(o, new) for o in obj]
    if isinstance(obj, dict):
        return type(obj)((k, _replace(v, new)) for k, v in obj.items())
    return obj


def _meta(t: Tensor) -> dict:
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": t.device}


class CheckpointBackward(Node):
    """The node of a non-reentrant checkpoint's outputs: its backward recomputes the function."""

    __slots__ = ("run", "n_outputs", "out_meta", "sources", "determinism_check", "recompute_ctx", "_used")

    def apply(self, grads: tuple) -> tuple:
        from kiln.autograd import grad as autograd_grad

        if self.run is None:
            raise RuntimeError(
                "Trying to backward through the graph a second time (or directly access saved tensors after "
                "they have already been freed). Saved intermediate values of the graph are freed when you call "
                ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
                "graph a second time or if you need to access saved tensors after calling backward."
            )
        function, args, kwargs, rng_state, autocast_state = self.run
        # explicit tensor arguments become fresh leaves; parameters and other outside tensors the function
        # reads are differentiated where they are (``sources``: one (tensor, is_arg) per outgoing edge)
        arg_leaves: dict[int, Tensor] = {}

        def leaf(a):
            if isinstance(a, Tensor) and a.requires_grad:
                d = arg_leaves.get(id(a))
                if d is None:
                    d = arg_leaves[id(a)] = a.detach().requires_grad_(True)
                return d
            return a

        new_args = _replace_args(args, leaf)
        new_kwargs = {k: _replace_args(v, leaf) for k, v in kwargs.items()}
        create_graph = state.grad_enabled
        with _rng_as(rng_state), _grad_mode(True), _autocast_as(autocast_state), self.recompute_ctx:
            outputs = function(*new_args, **new_kwargs)
        flat: list = []
        _flatten(outputs, flat)
        if self.determinism_check == _DEFAULT_DETERMINISM_MODE:
            metas = [_meta(t) for t in flat]
            if len(metas) != len(self.out_meta) or any(m is not None and m != r for m, r in zip(self.out_meta, metas)):
                raise CheckpointError(
                    "kiln.utils.checkpoint: Recomputed values for the following tensors have different metadata "
                    "than during the forward pass.\n"
                    + "".join(
                        f"tensor at position {i}:\nsaved metadata: {m}\nrecomputed metadata: {r}\n"
                        for i, (m, r) in enumerate(zip(self.out_meta, metas))
                        if m is not None and m != r
                    )
                )
        roots, root_grads = [], []
        for k, (t, g) in enumerate(zip(flat, grads)):
            if self.out_meta[k] is None or g is None or not t.requires_grad:
                continue
            roots.append(t)
            root_grads.append(g)
        targets = [arg_leaves.get(id(t), t) if is_arg else t for t, is_arg in self.sources]
        if not roots:
            return (None,) * len(targets)
        # leaf hooks run once, when the outer backward accumulates: not inside this inner grad
        hooked = [(t, t._hooks) for t in targets if t.grad_fn is None and t._hooks]
        for t, _ in hooked:
            t._hooks = None
        outer_nonleaf = any(t.grad_fn is not None for t in targets)
        try:
            result = autograd_grad(
                roots,
                targets,
                root_grads,
                retain_graph=create_graph or outer_nonleaf,
                create_graph=create_graph,
                allow_unused=True,
            )
        finally:
            for t, h in hooked:
                t._hooks = h
        return tuple(result)

    def release(self) -> None:
        """After a backward without ``retain_graph``: drop the function and inputs the recompute needs (a
        second backward then raises, as through any freed node)."""
        self.run = None


def _replace_args(obj: Any, fn: Callable) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_replace_args(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_replace_args(o, fn) for o in obj]
    if isinstance(obj, dict):
        return type(obj)((k, _replace_args(v, fn)) for k, v in obj.items())
    return obj


def _checkpoint_without_reentrant(
    function, preserve_rng_state, context_fn, determinism_check, debug, early_stop, *args, **kwargs
):
    if determinism_check not in (_DEFAULT_DETERMINISM_MODE, "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    forward_ctx, recompute_ctx = context_fn()
    if not state.grad_enabled:  # nothing would be recorded: just run it
        with forward_ctx:
            return function(*args, **kwargs)
    rng_state = _get_rng() if preserve_rng_state else None
    # the edges by which the function's graph reaches what was there before it ran (taken first: an argument
    # that is a view of a base written since takes its history now, outside the function's nodes)
    arg_edges: dict = {}
    flat_args: list = []
    _flatten((args, kwargs), flat_args)
    for a in flat_args:
        if a.requires_grad:
            arg_edges.setdefault(_edge(a), a)
    start = next(_seq)
    with forward_ctx:
        outputs = function(*args, **kwargs)
    flat: list = []
    _flatten(outputs, flat)

    def inside(node) -> bool:
        return node is not None and not isinstance(node, AccumulateGrad) and node._seq > start

    sources: list = []
    source_index: dict = {}
    seen: set = set()
    stack = [t.grad_fn for t in flat if inside(t.grad_fn)]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for nxt, nr in node.next_functions:
            if nxt is None:
                continue
            if inside(nxt):
                stack.append(nxt)
                continue
            key = (nxt, nr)
            if key in source_index:
                continue
            if key in arg_edges:
                source = (arg_edges[key], True)
            elif isinstance(nxt, AccumulateGrad):
                source = (nxt.variable, False)
            else:  # an outside non-leaf tensor reached through an argument: differentiated where it is
                stand_in = _edge_tensor(nxt, nr, flat_args)
                if stand_in is None:  # never a silently missing gradient
                    raise RuntimeError(
                        "kiln.utils.checkpoint(use_reentrant=False): the function reads a tensor that requires grad "
                        "and has a history of its own (not a leaf) other than through its arguments, e.g. from a "
                        "closure; this variant cannot send it a gradient. Pass that tensor as an argument, or use "
                        "use_reentrant=True."
                    )
                source = (stand_in, False)
            source_index[key] = len(sources)
            sources.append(source)
    if not sources:
        return outputs
    node = CheckpointBackward(tuple(_edge(t) for t, _ in sources), len(flat))
    node.run = (function, args, kwargs, rng_state, _get_autocast())
    node.sources = sources
    node.determinism_check = determinism_check
    node.recompute_ctx = recompute_ctx
    node.out_meta = []
    new: dict[int, Tensor] = {}
    for k, t in enumerate(flat):
        if inside(t.grad_fn) and id(t) not in new:
            d = t.detach()
            d._grad_fn = node
            d._requires_grad = True
            d._output_nr = k
            new[id(t)] = d
            node.out_meta.append(_meta(t))
        else:
            node.out_meta.append(None)
    return _replace(outputs, new)


def _edge_tensor(node, nr, candidates) -> Tensor | None:
    for t in candidates:
        if t.grad_fn is node and t._output_nr == nr:
            return t
    return None


# ---------------------------------------------------------------------------------------------------


def checkpoint(
    function: Callable,
    *args: Any,
    use_reentrant: bool | None = None,
    context_fn: Callable[[], tuple] = noop_context_fn,
    determinism_check: str = _DEFAULT_DETERMINISM_MODE,
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` without keeping its intermediate tensors; recompute them in backward.

    ``preserve_rng_state`` (keyword, default True) restores the CPU random state for the recompute, so
    random ops (dropout) give the same values. ``use_reentrant`` picks the variant (see the module
    docstring); not passing it warns, as PyTorch does, and uses the reentrant one. ``context_fn``,
    ``determinism_check`` (``"default"`` or ``"none"``), ``debug`` and ``early_stop`` are accepted by the
    non-reentrant variant only.
    """
    if use_reentrant is None:
        warnings.warn(
            "kiln.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in "
            "PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. use_reentrant=False "
            "is recommended, but if you need to preserve the current default behavior, you can pass "
            "use_reentrant=True. Refer to docs for more details on the differences between the two variants.",
            stacklevel=2,
        )
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
        return CheckpointFunction.apply(function, preserve, *args)
    return _checkpoint_without_reentrant(
        function, preserve, context_fn, determinism_check, debug, early_stop, *args, **kwargs
    )


def checkpoint_sequential(
    functions: Iterable[Callable] | Any,
    segments: int,
    input: Any,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``functions`` (a list of modules/functions or a ``kiln.nn.Sequential``) one after the other,
    checkpointing all but the last of ``segments`` equal segments."""
    if use_reentrant is None:
        warnings.warn(
            "kiln.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be passed "
            "explicitly. In version 2.9 we will raise an exception if use_reentrant is not passed. "
            "use_reentrant=False is recommended, but if you need to preserve the current default behavior, "
            "you can pass use_reentrant=True. Refer to docs for more details on the differences between the "
            "two variants.",
            stacklevel=2,
        )
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start: int, end: int, functions: list) -> Callable:
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x

        return forward

    children = getattr(functions, "children", None)
    functions = list(children()) if callable(children) and not isinstance(functions, (list, tuple)) else list(functions)
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(  # noqa: A001
            run_function(start, end, functions), input, use_reentrant=use_reentrant, preserve_rng_state=preserve
        )
    return run_function(end + 1, len(functions) - 1, functions)(input)
