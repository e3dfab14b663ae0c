"""``kiln.func``: PyTorch's function transforms (``torch.func``) on kiln's autograd.

``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian`` and ``linearize``
take a function of tensors (or of nested tuples, lists and dicts of them) and return its derivative as a
function; they nest (``jacrev(jacrev(f))``, ``grad(grad(f))``), and ``functional_call`` runs a module
with parameters and buffers given as a dict, so a model's loss is a function of its parameters.

How: each transform runs the function on fresh leaves that require grad and differentiates it with
:func:`kiln.autograd.grad`. A transform nested inside another one, or given inputs that require grad,
keeps the graph (``create_graph=True``) so the outer transform, or ``backward()``, can differentiate its
result, as ``torch.func`` composes with autograd; otherwise results are plain tensors. kiln has no forward-mode AD: ``jvp``, ``jacfwd`` and
``linearize`` compute the same values through reverse mode (``jvp`` by the double-vjp identity).

Left out, with their reason: ``vmap`` (kiln's op record has no batching rules, and a Python loop
would not be vmap), ``functionalize``, ``replace_all_batch_norm_modules_`` (vmap's companions) and
``debug_unwrap``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kiln._tensor import Tensor

__all__ = [
    "functional_call",
    "grad",
    "grad_and_value",
    "hessian",
    "jacfwd",
    "jacrev",
    "jvp",
    "linearize",
    "stack_module_state",
    "vjp",
]

_state = threading.local()


@contextlib.contextmanager
def _level():
    """Enter one transform level; yields whether its results must keep their graph for an outer
    differentiation: inside another transform, always; at the outermost level, only when grad mode is on
    (:func:`_keeps` then asks whether an input requires grad)."""
    import kiln

    depth = getattr(_state, "depth", 0)
    enabled = kiln.is_grad_enabled()
    _state.depth = depth + 1
    try:
        with kiln.enable_grad():
            yield enabled and depth > 0, enabled
    finally:
        _state.depth = depth


def _keeps(level: tuple[bool, bool], tensors: list[Tensor]) -> bool:
    """Whether a transform's results keep their graph: nested, or grad mode on and an input requiring grad."""
    nested, enabled = level
    return nested or (enabled and any(t.requires_grad for t in tensors))


# ---------------------------------------------------------------------------- pytrees of tensors


def _flatten(tree: Any, what: str) -> tuple[list[Tensor], Any]:
    """The tensors of a nested tuple/list/dict, and the structure to rebuild it with :func:`_unflatten`."""
    if isinstance(tree, Tensor):
        return [tree], None
    if isinstance(tree, (tuple, list)):
        leaves, specs = [], []
        for item in tree:
            sub, spec = _flatten(item, what)
            leaves += sub
            specs.append((len(sub), spec))
        return leaves, (type(tree), specs)
    if isinstance(tree, dict):
        leaves, specs = [], []
        for key, item in tree.items():
            sub, spec = _flatten(item, what)
            leaves += sub
            specs.append((key, len(sub), spec))
        return leaves, (type(tree), specs)
    if what == "input":
        raise ValueError(f"Thing passed to transform API must be Tensor, got {type(tree)}")
    raise RuntimeError(f"Expected tensors, got unsupported type {type(tree)}")


def _unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    if spec is None:
        return leaves[0]
    kind, specs = spec
    out, i = [], 0
    if issubclass(kind, dict):
        for key, n, sub in specs:
            out.append((key, _unflatten(leaves[i : i + n], sub)))
            i += n
        return kind(out)
    for n, sub in specs:
        out.append(_unflatten(leaves[i : i + n], sub))
        i += n
    return kind(out) if kind in (tuple, list) else kind(*out)


def _argnums(argnums: int | tuple[int, ...], nargs: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums or not all(isinstance(n, int) for n in nums):
        raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {argnums!r}")
    for n in nums:
        if not -nargs <= n < nargs:
            raise RuntimeError(f"Got argnum={n}, but only {nargs} positional inputs")
    nums = tuple(n % nargs for n in nums)
    if len(set(nums)) != len(nums):
        raise RuntimeError(f"argnums elements must be unique, got {argnums}")
    return nums


def _reaches_outside(outputs: list, leaves: list[list[Tensor]]) -> bool:
    """Whether the outputs' graph reaches a leaf that requires grad other than the transform's own fresh
    leaves: a tensor the function closes over (a model's parameters), whose gradient an outer
    ``backward()`` must still get, so the results keep their graph as ``torch.func``'s do."""
    from kiln.autograd.graph import AccumulateGrad

    own = {id(t) for group in leaves for t in group}
    stack = [o.grad_fn for o in outputs if isinstance(o, Tensor) and o.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            if id(node.variable) not in own:
                return True
            continue
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return False


def _fresh(t: Tensor, keep: bool) -> Tensor:
    """The leaf a transform differentiates with respect to: an alias that keeps the input's graph when the
    results keep theirs, else a detached copy."""
    if keep and t.requires_grad:
        return t.view_as(t)
    return t.detach().requires_grad_()


def _plain(tree: Any, keep: bool) -> Any:
    """Results as the caller sees them: detached unless they keep their graph."""
    if keep:
        return tree
    leaves, spec = _flatten_any(tree)
    return _unflatten([x.detach() if isinstance(x, Tensor) else x for x in leaves], spec)


def _flatten_any(tree: Any) -> tuple[list[Any], Any]:
    """Like :func:`_flatten`, but non-tensor leaves (aux outputs) are kept as they are."""
    if isinstance(tree, (tuple, list, dict)) and not (isinstance(tree, tuple) and hasattr(tree, "_fields")):
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        leaves, specs = [], []
        for key, item in items:
            sub, spec = _flatten_any(item)
            leaves += sub
            specs.append((key, len(sub), spec) if isinstance(tree, dict) else (len(sub), spec))
        return leaves, (type(tree), specs)
    return [tree], None


def _grads(outputs: list[Tensor], inputs: list[Tensor], cotangents: list[Tensor] | None, create_graph: bool):
    """``kiln.autograd.grad`` with zeros for inputs the outputs do not depend on."""
    import kiln

    diff = [(o, c) for o, c in zip(outputs, cotangents or [None] * len(outputs), strict=True) if o.requires_grad]
    if not diff:
        return [kiln.zeros_like(x) for x in inputs]
    res = kiln.autograd.grad(
        [o for o, _ in diff],
        inputs,
        [c for _, c in diff] if cotangents is not None else None,
        retain_graph=True,
        create_graph=create_graph,
        allow_unused=True,
    )
    return [kiln.zeros_like(x) if g is None else g for g, x in zip(res, inputs, strict=True)]


def _regroup(flat: list, leaves: list[list[Tensor]], specs: list) -> list:
    """``flat`` (one value per fresh leaf) split back per argument and rebuilt in each argument's structure."""
    out, i = [], 0
    for group, spec in zip(leaves, specs, strict=True):
        out.append(_unflatten(flat[i : i + len(group)], spec))
        i += len(group)
    return out


def _call(func: Callable, args: tuple, kwargs: dict, nums: tuple[int, ...], level: tuple[bool, bool]):
    """Run ``func`` on fresh leaves for the arguments in ``nums``: (output, leaves per argument, their
    structures, whether the results keep their graph)."""
    args = list(args)
    flats, specs = [], []
    for n in nums:
        flat, spec = _flatten(args[n], "input")
        flats.append(flat)
        specs.append(spec)
    keep = _keeps(level, [t for flat in flats for t in flat])
    leaves = []
    for n, flat, spec in zip(nums, flats, specs, strict=True):
        fresh = [_fresh(t, keep) for t in flat]
        args[n] = _unflatten(fresh, spec)
        leaves.append(fresh)
    out = func(*args, **kwargs)
    if not keep and level[1]:  # grad mode on: a closed-over tensor that requires grad keeps the graph too
        keep = _reaches_outside(_flatten_any(out)[0], leaves)
    return out, leaves, specs, keep


def _split_aux(out: Any, has_aux: bool, api: str) -> tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(
            f"{api}(f, ...)(*args): output of function f should be a tuple: (output, aux) if has_aux is True"
        )
    return out


# ------------------------------------------------------------------------------------- transforms


def grad_and_value(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """A function returning ``(gradient, value)`` of ``func`` (which must return a scalar tensor) with
    respect to the positional arguments ``argnums``; with ``has_aux`` ``func`` returns ``(value, aux)``
    and the result is ``(gradient, (value, aux))``."""

    def wrapper(*args, **kwargs):
        nums = _argnums(argnums, len(args))
        with _level() as level:
            out, leaves, specs, keep = _call(func, args, kwargs, nums, level)
            value, aux = _split_aux(out, has_aux, "grad_and_value")
            if not isinstance(value, Tensor):
                raise RuntimeError(f"grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got {type(value)}")
            if value.dim() != 0:
                raise RuntimeError(
                    "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with "
                    f"{value.dim()} dims. Maybe you wanted to use the vjp or jacrev APIs instead?"
                )
            flat = [t for group in leaves for t in group]
            g = _grads([value], flat, None, create_graph=keep)
            grads = _regroup(g, leaves, specs)
            result = grads[0] if isinstance(argnums, int) else tuple(grads)
            value = value if aux is None else (value, aux)
            return _plain(result, keep), _plain(value, keep)

    return wrapper


def grad(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """A function returning the gradient of ``func`` (a scalar-valued function) with respect to its
    positional arguments ``argnums`` (an int, or a tuple giving a tuple of gradients); each argument may
    be a tensor or a nested tuple/list/dict of tensors (the gradient has the same structure). With
    ``has_aux``, ``func`` returns ``(value, aux)`` and the result is ``(gradient, aux)``."""
    gv = grad_and_value(func, argnums, has_aux)

    def wrapper(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapper


def vjp(func: Callable, *primals: Any, has_aux: bool = False):
    """``(func(*primals), vjp_fn)``; ``vjp_fn(cotangents)`` returns the vector-Jacobian products with
    respect to every primal, as a tuple (``cotangents`` has the structure of the output). With
    ``has_aux`` the result is ``(output, vjp_fn, aux)``."""
    with _level() as level:
        out, leaves, specs, keep = _call(func, primals, {}, tuple(range(len(primals))), level)
        out, aux = _split_aux(out, has_aux, "vjp")
        flat_out, out_spec = _flatten(out, "output")

    def vjp_fn(cotangents):
        flat_ct, ct_spec = _flatten(cotangents, "output")
        if ct_spec != out_spec or len(flat_ct) != len(flat_out):
            raise RuntimeError("Expected pytree structure of cotangents to be the same as pytree structure of outputs")
        for o, c in zip(flat_out, flat_ct, strict=True):
            if tuple(o.shape) != tuple(c.shape):
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[0] has a shape of {c.shape} and output[0] has a shape of {o.shape}."
                )
        with _level() as inner:
            keep_fn = keep or _keeps(inner, flat_ct)
            flat_in = [t for group in leaves for t in group]
            g = _grads(flat_out, flat_in, flat_ct, create_graph=keep_fn)
        res = _regroup(g, leaves, specs)
        return _plain(tuple(res), keep_fn)

    result = (_plain(out, keep), vjp_fn)
    return result + (_plain(aux, keep),) if has_aux else result


def jvp(func: Callable, primals: Any, tangents: Any, *, strict: bool = False, has_aux: bool = False):
    """``(func(*primals), J @ tangents)``: the Jacobian-vector product, computed in reverse mode as the
    vjp of a vjp (kiln has no forward mode; the values are the same). ``primals`` and ``tangents`` are
    tuples of the same structure. ``strict=True`` is not supported, as in PyTorch."""
    import kiln

    if strict:
        raise RuntimeError("jvp(f, primals, tangents): strict is not supported (it is not in PyTorch either)")
    if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
        raise RuntimeError("jvp(f, primals, tangents): Expected primals and tangents to be tuples.")
    p_flat, p_spec = _flatten(primals, "input")
    t_flat, t_spec = _flatten(tangents, "input")
    if p_spec != t_spec:
        raise RuntimeError(
            "jvp(f, primals, tangents): Expected primals and tangents to have the same python structure."
        )
    for p, t in zip(p_flat, t_flat, strict=True):
        if tuple(p.shape) != tuple(t.shape):
            raise RuntimeError(
                "jvp(f, primals, tangents): Expected primals and tangents to have the same shape, "
                f"got {tuple(p.shape)} and {tuple(t.shape)}."
            )
    with _level() as level:
        out, leaves, _, keep = _call(func, primals, {}, tuple(range(len(primals))), level)
        keep = keep or _keeps(level, t_flat)
        out, aux = _split_aux(out, has_aux, "jvp")
        flat_out, out_spec = _flatten(out, "output")
        flat_in = [t for group in leaves for t in group]
        dummies = [kiln.zeros_like(o).requires_grad_() for o in flat_out]
        g = _grads(flat_out, flat_in, dummies, create_graph=True)
        pairs = [(gi, ti) for gi, ti in zip(g, t_flat, strict=True) if gi.requires_grad]
        if pairs:
            res = kiln.autograd.grad(
                [gi for gi, _ in pairs],
                dummies,
                [ti for _, ti in pairs],
                create_graph=keep,
                allow_unused=True,
            )
        else:
            res = [None] * len(dummies)
        jv = [kiln.zeros_like(o) if r is None else r for r, o in zip(res, flat_out, strict=True)]
        result = (_plain(out, keep), _plain(_unflatten(jv, out_spec), keep))
        return result + (_plain(aux, keep),) if has_aux else result


def linearize(func: Callable, *primals: Any):
    """``(func(*primals), jvp_fn)`` where ``jvp_fn(*tangents)`` is the Jacobian-vector product at
    ``primals``."""
    out = jvp(func, primals, tuple(_zeros_tree(p) for p in primals))[0]

    def jvp_fn(*tangents):
        return jvp(func, primals, tangents)[1]

    return out, jvp_fn


def _zeros_tree(tree: Any) -> Any:
    import kiln

    flat, spec = _flatten(tree, "input")
    return _unflatten([kiln.zeros_like(t) for t in flat], spec)


def jacrev(
    func: Callable, argnums: int | tuple[int, ...] = 0, *, has_aux: bool = False, chunk_size: int | None = None
) -> Callable:
    """A function returning the Jacobian of ``func`` with respect to the positional arguments
    ``argnums``, by reverse mode: for an output of shape ``O`` and an input of shape ``I``, a tensor of
    shape ``O + I`` (nested like the outputs, then like ``argnums``). ``chunk_size`` (rows per backward
    pass in PyTorch) is accepted; kiln computes one row per pass."""
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")
    return _jacobian(func, argnums, has_aux, "jacrev")


def jacfwd(
    func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False, *, randomness: str = "error"
) -> Callable:
    """The Jacobian of ``func`` as :func:`jacrev` gives it (kiln has no forward mode, so the same
    reverse-mode computation serves both). ``randomness`` is vmap's option (``"error"``, ``"different"``,
    ``"same"``), accepted and checked."""
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    return _jacobian(func, argnums, has_aux, "jacfwd")


def _jacobian(func: Callable, argnums, has_aux: bool, api: str) -> Callable:
    import kiln

    def wrapper(*args, **kwargs):
        nums = _argnums(argnums, len(args))
        with _level() as level:
            out, leaves, specs, keep = _call(func, args, kwargs, nums, level)
            out, aux = _split_aux(out, has_aux, api)
            flat_out, out_spec = _flatten(out, "output")
            flat_in = [t for group in leaves for t in group]
            per_out = []
            for o in flat_out:
                rows = [_grads([e], flat_in, None, create_graph=keep) for e in o.reshape(-1).unbind(0)]
                blocks = []
                for j, x in enumerate(flat_in):
                    if rows:
                        block = kiln.stack([r[j] for r in rows]).reshape(tuple(o.shape) + tuple(x.shape))
                    else:
                        block = kiln.zeros(tuple(o.shape) + tuple(x.shape), dtype=x.dtype, device=x.device)
                    blocks.append(block)
                groups = _regroup(blocks, leaves, specs)
                per_out.append(groups[0] if isinstance(argnums, int) else tuple(groups))
            jac = _unflatten(per_out, out_spec)
            jac = _plain(jac, keep)
            return (jac, _plain(aux, keep)) if has_aux else jac

    return wrapper


def hessian(func: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """The Hessian of ``func`` with respect to ``argnums``: ``jacfwd(jacrev(func, argnums), argnums)``."""
    return jacfwd(jacrev(func, argnums), argnums)


# ------------------------------------------------------------------------------------- modules


def _slot(module: Any, name: str) -> tuple[Any, str]:
    """The submodule owning dotted ``name``, and the attribute name within it."""
    *path, attr = name.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def functional_call(
    module: Any,
    parameter_and_buffer_dicts: dict[str, Tensor] | Sequence[dict[str, Tensor]],
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """Call ``module(*args, **kwargs)`` with its parameters and buffers replaced by the tensors in
    ``parameter_and_buffer_dicts`` (keys are ``named_parameters()``/``named_buffers()`` names), restoring
    them afterwards, even on an exception. With ``tie_weights``, a tensor given for one of several tied
    names serves them all; ``strict=True`` requires exactly the module's names."""
    dicts = [parameter_and_buffer_dicts] if isinstance(parameter_and_buffer_dicts, dict) else parameter_and_buffer_dicts
    given: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if k in given:
                raise ValueError(f"{k} appeared in multiple dictionaries; behavior of functional call is ambiguous")
            given[k] = v
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    if tie_weights:
        by_id: dict[int, list[str]] = {}
        for n, t in named:
            by_id.setdefault(id(t), []).append(n)
        for names in by_id.values():
            hits = [n for n in names if n in given]
            for a in hits[1:]:
                if given[a] is not given[hits[0]]:
                    raise ValueError(
                        f"functional_call got multiple values for keys {hits}, which are tied. "
                        "Consider using tie_weights=False"
                    )
            if hits:
                for n in names:
                    given.setdefault(n, given[hits[0]])
    if strict:
        names = {n for n, _ in named}
        missing = sorted(names - given.keys())
        unexpected = sorted(given.keys() - names)
        if missing or unexpected:
            lines = [f"Error(s) in reparametrizing for {type(module).__name__}:"]
            if unexpected:
                lines.append("\tUnexpected key(s): " + ", ".join(repr(k) for k in unexpected) + ".")
            if missing:
                lines.append("\tMissing key(s): " + ", ".join(repr(k) for k in missing) + ".")
            raise RuntimeError("\n".join(lines))
    saved = []  # (owner, attr, store or None, old value)
    try:
        for name, value in given.items():
            owner, attr = _slot(module, name)
            for store in ("_parameters", "_buffers"):
                table = owner.__dict__.get(store)
                if table is not None and attr in table:
                    saved.append((owner, attr, table, table[attr]))
                    table[attr] = value
                    break
            else:
                had = attr in owner.__dict__
                saved.append((owner, attr, None, owner.__dict__.get(attr) if had else _ABSENT))
                object.__setattr__(owner, attr, value)
        if args is None:
            args = ()
        elif not isinstance(args, tuple):
            args = (args,)
        return module(*args, **(kwargs or {}))
    finally:
        for owner, attr, table, old in reversed(saved):
            if table is not None:
                table[attr] = old
            elif old is _ABSENT:
                object.__delattr__(owner, attr)
            else:
                object.__setattr__(owner, attr, old)


_ABSENT = object()


def stack_module_state(models: Sequence[Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(params, buffers)``: each parameter and buffer of the same-structured ``models`` stacked along
    a new first dimension (parameters detached and made leaves that require grad, as in PyTorch)."""
    import kiln

    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or not any(m.training for m in models)):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    if len({type(m) for m in models}) != 1:
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    params = {
        k: kiln.stack([dict(m.named_parameters())[k] for m in models]).detach().requires_grad_()
        for k, _ in models[0].named_parameters()
    }
    buffers = {k: kiln.stack([dict(m.named_buffers())[k] for m in models]) for k, _ in models[0].named_buffers()}
    return params, buffers
