"""The compiler backends kiln-compile registers, and how a ``backend=`` argument is resolved.

* ``"kiln"`` (the default; ``"inductor"`` is accepted as its PyTorch name): the graph passes (constant
  folding, common subexpressions, dead code; where a code generator exists, pointwise ops without a fused
  expression decomposed into ones with one), then one generated Python function that calls each kernel
  directly, with the device's code generator (registered by its backend plugin) replacing what it fuses
  and the op pairs it computes in one kernel (cross entropy: :mod:`kiln.compile._patterns`);
* ``"eager"`` (``"aot_eager"``): the traced graph run op by op through the dispatcher — the reference, for
  telling a tracing problem from a code-generation one;
* ``"debug"``: ``"kiln"``'s program, checked on every call against the graph run eagerly on copies of the
  inputs (same random numbers), raising ``AssertionError`` naming the first output that differs.

A backend is also any callable ``backend(graph, example_inputs) -> callable`` (PyTorch's custom-backend
protocol), passed directly or registered by a plugin through ``kiln_register_compilers``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import kiln
import kiln.plugins
from kiln.compile._codegen import generate
from kiln.compile._fusion import EXPRESSIONS, hoist_reductions
from kiln.compile._fusion import lower as fusion_lower
from kiln.compile._graph import Graph
from kiln.compile._passes import decompose, optimize
from kiln.compile._patterns import lower as patterns_lower
from kiln.compile._whole import whole_program

__all__ = ["debug_backend", "eager_backend", "kiln_backend", "list_backends", "lookup_backend", "whole_backend"]

_ALIASES = {"inductor": "kiln", "aot_eager": "eager"}


def kiln_backend(graph: Graph, example_inputs: list, *, whole: bool = False) -> Callable:
    """The default backend: passes, then generated code (with the device's fused kernels); with ``whole``,
    the device's code generator's native program of the whole graph where it makes one
    (:mod:`kiln.compile._whole`)."""
    graph = optimize(graph)
    codegens = {c.device_type: c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None)}
    if codegens:  # pointwise ops the fusion has no expression for, written in ones it has (and folded again)
        graph = optimize(decompose(graph, keep=lambda op: op.name in EXPRESSIONS or "pointwise" not in op.tags))
        graph = hoist_reductions(graph, codegens)
        if whole:
            program = whole_program(graph, codegens)
            if program is not None:
                return program
    return generate(graph, functools.partial(_lower, codegens=codegens))


def whole_backend(graph: Graph, example_inputs: list) -> Callable:
    """``"kiln"`` compiling each graph whole into one native function where the device's code generator can
    (``kiln.compile(mode="reduce-overhead")`` or ``"max-autotune"``): no Python between its ops."""
    return kiln_backend(graph, example_inputs, whole=True)


def _lower(graph: Graph, names, codegens: dict) -> dict[int, str | None]:
    """The fused groups' calls, then the patterns' (:mod:`kiln.compile._patterns`) at the positions left."""
    replaced = fusion_lower(graph, names, codegens)
    replaced.update(patterns_lower(graph, names, codegens, set(replaced)))
    return replaced


def eager_backend(graph: Graph, example_inputs: list) -> Callable:
    """The traced graph, run op by op through the dispatcher."""
    return graph


def debug_backend(graph: Graph, example_inputs: list) -> Callable:
    """``kiln``'s program, checked against the eager graph on every call."""
    program = kiln_backend(graph, example_inputs)

    def run(*inputs):
        copies = [t.detach().clone() for t in inputs]
        rng = _rng_states()
        with kiln.no_grad():
            expected = graph(*copies)
        _set_rng_states(rng)
        got = program(*inputs)
        for i, (e, g) in enumerate(zip(expected, got)):
            _compare(f"output {i}", e, g)
        for i, (c, t) in enumerate(zip(copies, inputs)):
            _compare(f"input {i} after the call", c, t)
        return got

    run.graph = graph
    return run


def _compare(what: str, expected: kiln.Tensor, got: kiln.Tensor) -> None:
    if expected.shape != got.shape or expected.dtype != got.dtype:
        raise AssertionError(
            f"kiln.compile debug backend: {what} is {got.dtype} {list(got.shape)}, eagerly {expected.dtype} "
            f"{list(expected.shape)}"
        )
    a, b = expected.detach().cpu(), got.detach().cpu()
    if a.dtype.is_floating_point:
        ok = kiln.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    else:
        ok = kiln.equal(a, b)
    if not ok:
        raise AssertionError(f"kiln.compile debug backend: {what} differs from the eager result")


def _rng_states() -> list:
    states = [kiln.get_rng_state()]
    if kiln.cuda.is_available():
        states.append(kiln.cuda.get_rng_state_all())
    return states


def _set_rng_states(states: list) -> None:
    kiln.set_rng_state(states[0])
    if len(states) > 1:
        kiln.cuda.set_rng_state_all(states[1])


_BUILTIN = {"kiln": kiln_backend, "eager": eager_backend, "debug": debug_backend}


def list_backends() -> list[str]:
    """The backend names ``kiln.compile(backend=...)`` accepts (the built-in ones and the plugins')."""
    return sorted({*_BUILTIN, *_ALIASES, *_registered()})


def _registered() -> dict[str, Callable]:
    return {name: c for name, c in kiln.plugins.compilers().items() if getattr(c, "device_type", None) is None}


def lookup_backend(backend: str | Callable) -> Callable:
    """The backend callable for a name or a callable (``ValueError`` naming the known ones otherwise)."""
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"kiln.compile: backend must be a name or a callable, not {type(backend).__name__}")
    name = _ALIASES.get(backend, backend)
    found = _BUILTIN.get(name) or _registered().get(name)
    if found is None:
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; the available ones are {list_backends()}")
    return found
