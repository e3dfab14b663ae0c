"""The public function of each op, generated from its signature with the dispatcher's path written in.

:func:`make_public` is what ``kiln._dispatch.op`` calls for every op it defines: the function has the op's
exact signature (Python binds the arguments) and, on a thread with no dispatch mode, runs the op's meta
function, its checked kernel and autograd's record itself, leaving everything else to
``kiln._dispatch.call`` (architecture page, "Ops and the dispatcher").
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

from kiln._device import out_of_memory
from kiln._state import away, modes_away, state
from kiln._tensor import Tensor, stale_view_requires_grad

__all__ = ["LANE_PREFIX", "make_binder", "make_public", "takes_tensor_list"]

LANE_PREFIX = "_lane"
"""The generated function's local names start with it; an op parameter may not (``kiln._dispatch.op``)."""

_CODE_BY_LAYOUT: dict[tuple, types.CodeType] = {}


def make_public(opdef, doc_fn: Callable, dispatch: types.ModuleType) -> Callable:
    """Generate the public function of ``opdef`` with the op's exact signature and the dispatcher's path
    written into it (``dispatch``: the ``kiln._dispatch`` module, which imports this one, handed in by its
    ``op`` decorator; the generated code calls into it).

    Argument binding by Python itself is far cheaper than ``inspect.Signature.bind`` on every call. On a
    thread with no dispatch mode (in grad mode, ``no_grad`` or ``inference_mode``) the function runs the
    meta function, the cached kernel and autograd's test itself (:func:`_lane`), a small op's time a tenth
    less than through ``kiln._dispatch.call``, which serves every other call. The code is compiled once
    per parameter layout and shared by every op with that layout (compiling per op would dominate
    ``import kiln``); each op gets its own globals, defaults and names.
    """
    params = list(opdef.signature.parameters.values())
    takes_out = dispatch._takes_out(opdef)
    grads = _grad_tests(opdef, params)
    key = (tuple((p.name, p.kind, p.default is not p.empty) for p in params), takes_out, opdef.num_outputs, grads)
    code = _CODE_BY_LAYOUT.get(key)
    if code is None:
        texts, seen_kwonly, names, args = _parameters(params)
        lane = _lane(", ".join(names), args, opdef.num_outputs, grads)
        if takes_out:
            texts += ([] if seen_kwonly else ["*"]) + ["out=None"]
            lane = "\n".join("    " + line for line in lane.splitlines())
            body = f"    if out is None:\n{lane}\n        return _call(_op, {args})\n    return _call_out(_op, {args}, out)\n"
        else:
            body = f"{lane}\n    return _call(_op, {args})\n"
        code = _CODE_BY_LAYOUT[key] = _compiled(f"def op({', '.join(texts)}):\n{body}")
    positional_defaults, keyword_defaults = _defaults(params)
    if takes_out:
        keyword_defaults["out"] = None
    namespace: dict[str, Any] = {
        "_call": dispatch.call,
        "_call_out": dispatch.call_out,
        "_Sparse": dispatch.SparseArgument,
        "_rg": dispatch._requires_grad,
        "_dispatch": dispatch,  # call_kernel is read from the module, replaceable as call's is
        "_op": opdef,
        "_meta": opdef.meta,  # kept in step with the record by OpDef.__setattr__ (a global: 50 ns less than _op.meta)
        "_away": away,
        "_modes": modes_away,
        "_state": state,
        "_oom": out_of_memory,
        "_T": Tensor,
        "_stale": stale_view_requires_grad,
        "__builtins__": __builtins__,
    }
    namespace["_record"] = _recorder_stand_in(namespace)
    fn = types.FunctionType(
        code.replace(co_name=opdef.name, co_qualname=opdef.name, co_filename=f"<kiln op {opdef.name}>"),
        namespace,
        opdef.name,
        positional_defaults or None,
    )
    fn.__kwdefaults__ = keyword_defaults or None
    fn.__doc__ = doc_fn.__doc__
    fn.__module__ = doc_fn.__module__
    fn.__qualname__ = opdef.name
    fn.__signature__ = opdef.signature
    if takes_out:
        out_param = inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)
        fn.__signature__ = opdef.signature.replace(parameters=[*params, out_param])
    fn.__wrapped__ = doc_fn
    fn.op = opdef
    return fn


def _recorder_stand_in(namespace: dict) -> Callable:
    """The public function's ``_record`` until the op first records: it binds the op's own recorder
    (``kiln.autograd.graph.recorder``, code written out for the op) in its place."""

    def _record(opdef, args, out):
        from kiln.autograd.graph import recorder

        fn = namespace["_record"] = recorder(opdef)
        return fn(opdef, args, out)

    return _record


def make_binder(opdef) -> Callable:
    """A function with the op's signature (less ``out=``) that returns its arguments as the tuple the op's
    meta function and kernels take, defaults filled in: what an in-place variant needs to call an
    in-place kernel (``Tensor.add_``'s ``(self, other, alpha)``). Compiled once per parameter layout."""
    params = list(opdef.signature.parameters.values())
    key = ("bind", tuple((p.name, p.kind, p.default is not p.empty) for p in params))
    code = _CODE_BY_LAYOUT.get(key)
    if code is None:
        texts, _seen_kwonly, _names, args = _parameters(params)
        code = _CODE_BY_LAYOUT[key] = _compiled(f"def op({', '.join(texts)}):\n    return {args}\n")
    positional_defaults, keyword_defaults = _defaults(params)
    fn = types.FunctionType(  # named as the op: a wrong argument's TypeError reads as the public function's
        code.replace(co_name=opdef.name, co_qualname=opdef.name, co_filename=f"<kiln op {opdef.name}>"),
        {"__builtins__": __builtins__},
        opdef.name,
        positional_defaults or None,
    )
    fn.__kwdefaults__ = keyword_defaults or None
    return fn


def _parameters(params: list) -> tuple[list[str], bool, list[str], str]:
    """The parameter list of a generated function (defaults as None, set on the function afterwards),
    whether it has a keyword-only part, the parameter names, and the source of their tuple."""
    texts = []
    seen_kwonly = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not seen_kwonly:
            texts.append("*")
            seen_kwonly = True
        texts.append(p.name + ("=None" if p.default is not p.empty else ""))  # real defaults set by the caller
    names = [p.name for p in params]
    return texts, seen_kwonly, names, f"({', '.join(names)}{',' if len(names) == 1 else ''})"


def _defaults(params: list) -> tuple[tuple, dict]:
    """A generated function's ``__defaults__`` and ``__kwdefaults__``: the op's own defaults."""
    positional = tuple(p.default for p in params if p.default is not p.empty and p.kind is not p.KEYWORD_ONLY)
    keyword = {p.name: p.default for p in params if p.default is not p.empty and p.kind is p.KEYWORD_ONLY}
    return positional, keyword


def _compiled(src: str) -> types.CodeType:
    namespace: dict[str, Any] = {}
    exec(compile(src, "<kiln op>", "exec"), namespace)  # noqa: S102 - generated from a signature
    return namespace["op"].__code__


def _grad_tests(opdef, params: list) -> tuple:
    """Per tensor parameter, how the public function tests it for ``requires_grad``: ``("tensor", name)`` or,
    for a parameter that may hold a list of tensors, ``("any", name)``; empty for an op with no backward."""
    if opdef._backward_needs is None:
        return ()
    return tuple(("any" if takes_tensor_list(params[i]) else "tensor", params[i].name) for i in opdef.tensor_params)


def takes_tensor_list(param: inspect.Parameter) -> bool:
    """Whether a tensor parameter of an op may hold a list of tensors (``cat``'s), read off its annotation."""
    note = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    return any(word in note for word in ("Sequence", "list", "tuple", "Iterable"))


def _lane(spread: str, args: str, num_outputs: int, grads: tuple) -> str:
    """The body of a public op function for a thread with no dispatch mode: ``call``'s path (meta
    function, the kernel ``call_kernel`` would find in the op's cache, autograd's test and record), written
    out so that no call of ``call`` or ``call_kernel`` sits between the user and the kernel. The thread-local
    state is read only when some thread is away from the defaults (``away[0]``; its dispatch modes only
    when some thread has one, ``modes_away[0]``), as ``call`` reads it. A
    kernel not yet checked runs through ``call_kernel``; a dispatch mode or a sparse argument leaves for
    ``call``, below it. Its local names start with :data:`LANE_PREFIX`, which no op parameter may."""
    first = "_lane_spec" if num_outputs == 1 else "_lane_spec[0]"
    lines = [
        "    _lane_moded = _away[0]",
        "    if not _modes[0] or not (_state.pre_autograd_modes or _state.post_autograd_modes):",
        "        try:",
        f"            _lane_spec = _meta({spread})",
        "        except _Sparse:",
        f"            return _call(_op, {args})",
        f"        _lane_by = _op._checked.get({first}[1])",
        f"        _lane_k = None if _lane_by is None else _lane_by.get({first}[2].type)",
        "        if _lane_k is None:  # its first call: checked",
        f"            _lane_result = _dispatch.call_kernel(_op, {args}, _lane_spec)",
        "        else:",
        "            try:",
        f"                _lane_result = _lane_k(_lane_spec, {spread})",
        "            except MemoryError as _lane_exc:",
        "                raise _oom(_lane_exc) from None",
    ]
    # a view that needs no gradient asks its base when the base was written since (stale_view_requires_grad)
    tests = [
        f"(isinstance({n}, _T) and ({n}._requires_grad or ({n}._base is not None and {n}._view_vc != {n}._vc[0] and _stale({n}))))"
        if kind == "tensor"
        else f"_rg({n})"
        for kind, n in grads
    ]
    if tests:
        test = " or ".join(tests)
        lines += [
            f"        if (not _lane_moded or _state.grad_enabled) and ({test}):",
            f"            _record(_op, {args}, _lane_result)",
        ]
    lines.append("        return _lane_result")
    return "\n".join(lines)
