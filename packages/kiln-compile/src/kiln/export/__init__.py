"""``kiln.export``: ``torch.export``'s API — a model traced once into a program of kiln ops plus its weights.

The module is callable: ``kiln.export(model, args)`` is ``kiln.export.export(model, args)``.

:func:`export` traces ``model(*args)`` without gradients (kiln.compile's tracer, ``fullgraph``: a value read
into Python or a NumPy hand-off is an error naming the line), runs kiln.compile's graph passes, and returns an
:class:`ExportedProgram`. :func:`save` writes it as one safetensors file (the weights as tensors, the graph
as JSON); :func:`load` — also ``kiln.jit.load``, which needs only the core — reads it back, validating every
field, and executes nothing from the file. The program runs on the example inputs' shapes and dtypes.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any, BinaryIO

import kiln
from kiln.backend import ExportedProgram, encode_argument, load_program, save_program
from kiln.compile._graph import Value
from kiln.compile._passes import optimize
from kiln.compile._runtime import _SLOT, trace_call

__all__ = ["ExportedProgram", "export", "load", "save", "trace_program"]

FORMAT, VERSION = "kiln.exported_program", 1


def export(
    mod: Callable,
    args: tuple,
    kwargs: dict | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = True,
) -> ExportedProgram:
    """Trace ``mod(*args, **kwargs)`` (a ``kiln.nn.Module`` or a function) into an :class:`ExportedProgram`.

    Parameters and buffers become the program's weights under their ``state_dict`` names; other tensors the
    model reads are kept as constants. Random ops (dropout in training mode), data-dependent control flow and
    writes to ``.grad`` cannot be exported and raise ``RuntimeError`` saying why. ``dynamic_shapes`` is not
    supported: the program is specialised to the example inputs' shapes.
    """
    if not isinstance(args, tuple):
        raise TypeError(f"Expecting `args` to be a tuple of example positional inputs, got {type(args)}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"Expecting `kwargs` to be a dict, got {type(kwargs)}")
    if dynamic_shapes is not None:
        raise NotImplementedError(
            "kiln.export specialises on the example inputs' shapes; dynamic_shapes is not supported"
        )
    graph, weights, state, template = trace_program(mod, args, kwargs or {}, "kiln.export")
    nodes = []
    for node in graph.nodes:
        try:
            args_json = [encode_argument(a, _value_index) for a in node.args]
        except TypeError as exc:
            raise RuntimeError(f"kiln.export: op {node.op.name}: {exc}") from None
        nodes.append({"op": node.op.name, "args": args_json, "outputs": [v.index for v in node.outputs]})
    program = {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [{"value": v.index, "shape": list(v.shape), "dtype": v.dtype.name} for v in _inputs(graph)],
        "weights": {name: v.index for name, v in weights.items()},
        "nodes": nodes,
        "outputs": [v.index for v in graph.outputs],
        "out_spec": _out_spec(template, iter(range(len(graph.outputs)))),
    }
    return ExportedProgram(program, state)


_CONSTANT, _FOLDED = "_constant", "_folded"  # the names of weights that are not the model's state


def is_constant_name(name: str) -> bool:
    """Whether a weight of :func:`trace_program` is a constant the program made or the passes folded, not one
    of the model's parameters or buffers (those keep their state-dict names)."""
    return name.startswith((_CONSTANT, _FOLDED))


def trace_program(mod: Callable, args: tuple, kwargs: dict, who: str):
    """``mod(*args, **kwargs)`` traced without gradients into an optimized graph of op nodes only:
    ``(graph, {weight name: Value}, {weight name: tensor}, output template)`` — what :func:`export` and
    ``kiln.onnx.export`` write. Weights are the tensors read by reference (parameters and buffers under their
    state-dict names) and the constants the passes folded."""
    # the program runs on row-major inputs (ExportedProgram makes them so): trace it on such
    args, kwargs = _row_major(args), {k: _row_major(v) for k, v in kwargs.items()}
    with kiln.no_grad():
        entry, _ = trace_call(mod, args, kwargs, fullgraph=True)
    if entry.reason is not None and entry.reason != "escaped":
        raise RuntimeError(f"{who}: the model cannot be exported: {entry.reason}")
    graph = optimize(entry.graphs[0])
    for node in graph.nodes:
        if node.kind != "op":
            what = (
                {
                    "random": "a random draw (dropout in training mode? call model.eval())",
                    "host data": "a tensor made from host data (kiln.tensor, arange...) that the model writes or returns",
                }.get(node.expected, node.kind)
                if node.kind == "draw"
                else node.kind
            )
            raise RuntimeError(f"{who}: the model cannot be exported: {what} is not a program op")
    names = _weight_names(mod)
    n_inputs = len(_inputs(graph))
    weights: dict[str, Value] = {}
    state: dict[str, kiln.Tensor] = {}
    for v, t in zip(graph.inputs[n_inputs:], entry.externals):
        name = names.get(id(t)) or f"{_CONSTANT}{len(state)}"
        weights[name], state[name] = v, t.detach().clone()
    by_index = {v.index: v for n in entry.graphs[0].nodes for v in n.outputs}
    for index, t in graph.constants.items():
        name = f"{_FOLDED}{index}"
        weights[name], state[name] = by_index[index], t.detach().clone()
    return graph, weights, state, entry.out_template


def _row_major(x: Any) -> Any:
    if isinstance(x, kiln.Tensor):
        return (
            x
            if x.is_contiguous() and not x.storage_offset()
            else x.detach().clone(memory_format=kiln.contiguous_format)
        )
    if type(x) in (tuple, list):
        return type(x)(_row_major(v) for v in x)
    return x


def _inputs(graph) -> list[Value]:
    return [v for v in graph.inputs if v.source == "input"]


def save(ep: ExportedProgram, f: str | os.PathLike | BinaryIO) -> None:
    """Write ``ep`` to ``f`` (a path, written atomically, or a binary file): safetensors plus the graph as JSON."""
    save_program(ep, f)


def load(f: str | os.PathLike | BinaryIO) -> ExportedProgram:
    """Read a program :func:`save` wrote (``kiln.jit.load`` does the same with the core alone)."""
    return load_program(f)


def _value_index(a: Any) -> int | None:
    return a.index if isinstance(a, Value) else None


def _weight_names(mod: Any) -> dict[int, str]:
    module = getattr(mod, "_orig_mod", mod)
    if not hasattr(module, "named_parameters"):
        return {}
    names = {id(t): name for name, t in module.named_buffers()}
    names.update((id(t), name) for name, t in module.named_parameters())
    return names


def _out_spec(template: Any, slots) -> Any:
    """The output structure as JSON: an output's position, None, or [kind, items]."""
    if template is _SLOT:
        return next(slots)
    if template is None:
        return None
    if type(template) in (tuple, list):
        return [type(template).__name__, [_out_spec(x, slots) for x in template]]
    if type(template) is dict and all(isinstance(k, str) for k in template):
        return ["dict", [[k, _out_spec(v, slots)] for k, v in template.items()]]
    raise RuntimeError(f"kiln.export: the model returns a {type(template).__name__}, which a program cannot hold")


class _CallableModule(types.ModuleType):
    """``kiln.export(model, args)`` is :func:`export` (the module keeps ``torch.export``'s names too)."""

    def __call__(self, mod: Callable, args: tuple, kwargs: dict | None = None, **options: Any) -> ExportedProgram:
        return export(mod, args, kwargs, **options)


sys.modules[__name__].__class__ = _CallableModule
