"""``kiln.compile``: a guarded tracing compiler (``torch.compile``'s API) — kiln-compile's package.

``kiln.compile`` is this module, and it is callable: ``kiln.compile(fn)``, ``@kiln.compile``,
``@kiln.compile(fullgraph=True)``, ``kiln.compile(model)`` and ``model.compile()`` work as in PyTorch. The
first call of a compiled function runs it eagerly under a tracer that records every op the dispatcher runs
(backward formulas and optimizer writes included) and the guards the trace depends on; later calls whose
guards hold run the compiled program instead, and forward and backward each become one generated program
behind a single autograd node. The architecture page ("Compilation") explains the design; the kiln-compile
guide shows it in use.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from kiln.compile import _config as config
from kiln.compile._backends import list_backends, whole_backend
from kiln.compile._graph import Graph, Node, Value
from kiln.compile._guards import module_class
from kiln.compile._marks import ConstraintViolationError
from kiln.compile._runtime import BackendCompilerFailed, CompiledFunction, is_compiling, note_unsupported, trace_call
from kiln.compile._trace import GraphBreakError

__all__ = [
    "BackendCompilerFailed",
    "CompiledFunction",
    "ConstraintViolationError",
    "ExplainOutput",
    "Graph",
    "GraphBreakError",
    "Node",
    "OptimizedModule",
    "Value",
    "compile",
    "disable",
    "explain",
    "freeze",
    "is_compiling",
    "list_backends",
    "optimize_for_inference",
    "reset",
    "script",
    "trace",
    "trace_module",
]

if os.environ.get("KILN_COMPILE_DISABLE") == "1":
    config.disabled = True

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_WHOLE_MODES = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # kiln.compile._whole
_compiled: weakref.WeakSet = weakref.WeakSet()


def compile(  # noqa: A001 - PyTorch's name
    model: Callable | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable = "kiln",
    mode: str | None = None,
    options: dict | None = None,
    disable: bool = False,
):
    """Compile a function or a module (``torch.compile``); with no ``model``, a decorator.

    * ``backend``: ``"kiln"`` (default; ``"inductor"`` is the same), ``"eager"`` (the traced graph run op by
      op: for telling tracing problems from code generation ones), ``"debug"`` (checks every compiled result
      against eager), a name a plugin registered, or a callable ``backend(graph, example_inputs)``.
    * ``fullgraph=True``: a value read into Python (``item()``, ``if tensor:``) raises
      :class:`GraphBreakError` naming the line, instead of becoming a guard on the value.
    * ``dynamic``: every trace is guarded on its exact shapes, and a call at a new shape traces again (one
      eager call); what differs is what that costs. ``None`` (default): the first trace's kernels are made
      for its shapes; a later trace of the same program at other shapes (the same ops on tensors of the
      same ranks: only sizes, strides and the int arguments of ops differ) does not count towards
      ``config.cache_size_limit`` (only towards ``config.accumulated_cache_size_limit``, 256), and its fused
      kernels read the sizes that changed at run time, so that every later shape reuses them: a new batch
      size costs one traced call and no kernel compilation (but for a kernel that holds a size as a number:
      the backward of a ``mean`` divides by the element count). ``True``: so from the first trace, every size
      read at run time. ``False``: every new shape counts towards ``cache_size_limit`` and gets kernels made
      for it. Whatever ``dynamic`` is, a dim marked with ``kiln._dynamo.mark_dynamic`` is compiled for varying
      sizes from its first trace, and one marked with ``mark_static`` counts every new size.
    * ``mode``: PyTorch's modes are accepted. With the ``"kiln"`` backend, ``"reduce-overhead"``, ``"max-autotune"``
      and ``"max-autotune-no-cudagraphs"`` compile each traced graph whole into one native function where the
      device's code generator can (kiln-cpu: the ops of an MLP's training step; others keep the default
      program): no Python runs between its ops, at the price of a longer first compilation (cached on disk).
    * ``disable=True``: return ``model`` unchanged.
    """
    if mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(m for m in _MODES if m)}")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if dynamic not in (None, True, False):
        raise TypeError(f"kiln.compile: dynamic must be None, True or False, got {dynamic!r}")
    if model is None:
        return functools.partial(
            compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options, disable=disable
        )
    if not callable(model):
        raise RuntimeError("kiln.compile: the model must be a callable (a function or a kiln.nn.Module)")
    if mode in _WHOLE_MODES and backend in ("kiln", "inductor"):
        backend = whole_backend
    if disable or getattr(model, "_kiln_compile_disabled", False):
        return model
    module_cls = module_class()  # None without kiln-nn imported: then model cannot be a module
    if module_cls is not None and isinstance(model, module_cls):
        from kiln.compile._module import OptimizedModule

        return OptimizedModule(model, backend=backend, fullgraph=fullgraph, options=options, dynamic=dynamic)
    compiled = CompiledFunction(model, backend=backend, fullgraph=fullgraph, options=options, dynamic=dynamic)
    _compiled.add(compiled)
    return compiled


def reset() -> None:
    """Forget every compiled function's traces (``torch.compiler.reset``): the next calls trace again."""
    for fn in list(_compiled):
        fn._reset()


def disable(fn: Callable | None = None, recursive: bool = True, *, reason: str | None = None):
    """Mark ``fn`` never to be compiled (``torch.compiler.disable``); with no ``fn``, a decorator.

    ``kiln.compile(fn)`` returns such a function unchanged, and a compiled function that calls it runs
    eagerly (kiln cannot compile around a call, so the whole call stays eager, reported by :func:`explain`,
    with ``reason`` when given). A module stays a module: an ``OptimizedModule`` wrapping it, which calls it
    so marked (``model.block = disable(model.block)``).
    """
    if fn is None:
        return functools.partial(disable, recursive=recursive, reason=reason)
    if not callable(fn):
        raise AssertionError("fn must be callable")
    why = f" ({reason})" if reason else ""
    name = getattr(fn, "__qualname__", type(fn).__qualname__)

    def run(*args, **kwargs):
        note_unsupported(f"it calls {name}, marked kiln.compile.disable{why}")
        return fn(*args, **kwargs)

    module_cls = module_class()
    if module_cls is not None and isinstance(fn, module_cls):  # still a module (PyTorch: an OptimizedModule)
        from kiln.compile._module import OptimizedModule

        wrapped = OptimizedModule(fn, call=run)
    else:
        wrapped = functools.wraps(fn)(run)
    wrapped._kiln_compile_disabled = True
    return wrapped


def trace(func: Callable, example_inputs: Any = None, *, example_kwarg_inputs: dict | None = None, **kwargs: Any):
    """``torch.jit.trace`` (``kiln.jit.trace``): ``func`` run once on the example inputs and recorded as an
    exported program (:func:`kiln.export.export`), which ``kiln.jit.save`` writes and ``kiln.jit.load`` runs."""
    import kiln
    from kiln.export import export

    if example_inputs is None and example_kwarg_inputs is None:
        raise RuntimeError("kiln.jit.trace: example_inputs (or example_kwarg_inputs) is required")
    if isinstance(example_inputs, kiln.Tensor):
        example_inputs = (example_inputs,)
    return export(func, tuple(example_inputs or ()), example_kwarg_inputs)


def trace_module(mod: Callable, inputs: dict, **kwargs: Any):
    """``torch.jit.trace_module``: the ``"forward"`` entry of ``inputs`` traced as :func:`trace` does."""
    if set(inputs) != {"forward"}:
        raise RuntimeError("kiln.jit.trace_module: only the 'forward' method can be traced")
    return trace(mod, inputs["forward"])


def script(obj: Any, *args: Any, **kwargs: Any):
    """``torch.jit.script`` has no kiln counterpart: kiln compiles by tracing. Raises ``NotImplementedError``
    pointing to :func:`trace` (a program that runs without the model's code) and ``kiln.compile``."""
    raise NotImplementedError(
        "kiln has no TorchScript: use kiln.jit.trace(model, example_inputs) for a program that runs without the "
        "model's code (kiln.jit.save / kiln.jit.load), or kiln.compile(model) to compile it in place"
    )


def freeze(mod: Any, preserved_attrs: Any = None, optimize_numerics: bool = True):
    """``torch.jit.freeze``: an exported program's weights are already constants of the program; returned as is."""
    from kiln.backend import ExportedProgram

    if not isinstance(mod, ExportedProgram):
        raise RuntimeError("Freezing expects a traced program (kiln.jit.trace) as input")
    return mod


def optimize_for_inference(mod: Any, other_methods: Any = None):
    """``torch.jit.optimize_for_inference``: a traced program is already optimized (kiln.compile's passes ran
    when it was made); returned as is."""
    return freeze(mod)


class ExplainOutput:
    """What :func:`explain` found: the graphs, the breaks and why, the guards (``torch._dynamo.explain``'s
    ``ExplainOutput``)."""

    def __init__(self, entry) -> None:
        self.graphs: list[Graph] = entry.graphs
        guards = sum(1 for n in entry.graphs[0].nodes if n.kind == "guard")
        self.graph_count = guards + 1 + (len(entry.graphs) - 1)
        self.graph_break_count = len(entry.breaks)
        self.break_reasons: list[str] = [f"{what} at {where}" for what, where in entry.breaks]
        self.ops_per_graph: list[list[str]] = [[n.op.name for n in g.nodes if n.kind == "op"] for g in entry.graphs]
        self.op_count = sum(len(ops) for ops in self.ops_per_graph)
        self.out_guards: list[str] = entry.guard_words
        self.compiles: bool = entry.reason is None
        self.reason: str | None = entry.reason

    def __str__(self) -> str:
        lines = [
            f"Graph Count: {self.graph_count}",
            f"Graph Break Count: {self.graph_break_count}",
            f"Op Count: {self.op_count}",
        ]
        if self.break_reasons:
            lines.append("Break Reasons:")
            lines += [f"  {i + 1}. {r}" for i, r in enumerate(self.break_reasons)]
        if not self.compiles:
            lines.append(f"Runs eagerly: {self.reason}")
        lines.append("Graphs:")
        for g in self.graphs:
            lines += ["  " + line for line in str(g).splitlines()]
        lines.append(f"Guards ({len(self.out_guards)}):")
        lines += [f"  - {w}" for w in self.out_guards]
        return "\n".join(lines)


def explain(fn: Callable, *args: Any, **kwargs: Any):
    """Trace ``fn`` on ``args`` and report its graphs, breaks and guards (runs ``fn`` once, eagerly);
    ``explain(fn)(*args)`` works too, as ``torch._dynamo.explain``."""
    target = getattr(fn, "_orig_mod", fn)
    target = getattr(target, "__wrapped__", target) if isinstance(target, CompiledFunction) else target

    def run(*a, **k) -> ExplainOutput:
        entry, _ = trace_call(target, a, k, fullgraph=False)
        if entry.reason == "escaped":
            entry.reason = "the call stores a tensor it made in Python state (traced again on the next call)"
        return ExplainOutput(entry)

    if args or kwargs:
        return run(*args, **kwargs)
    return run


def __getattr__(name: str):
    if name == "OptimizedModule":
        from kiln.compile._module import OptimizedModule

        return OptimizedModule
    raise AttributeError(f"module 'kiln.compile' has no attribute '{name}'")


class _CallableModule(types.ModuleType):
    """``kiln.compile`` is a module and ``torch.compile``'s function at once."""

    def __call__(self, model: Callable | None = None, **kwargs: Any):
        return compile(model, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
