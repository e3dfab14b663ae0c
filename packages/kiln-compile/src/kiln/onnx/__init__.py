"""``kiln.onnx``: ``torch.onnx.export``'s API, built on the ``onnx`` package (kiln-compile's ``onnx`` extra).

:func:`export` traces the model as :func:`kiln.export.export` does (no gradients, the example inputs'
shapes), then writes each op of the program as ONNX nodes (:mod:`kiln.onnx._ops`), the weights as
initializers, checks the model with ``onnx.checker`` and writes it atomically. An op with no ONNX form raises
:class:`UnsupportedOperatorError` naming it. ``dynamic_axes`` marks input and output dims symbolic; reshapes
that keep the leading dim copy it from their input, so an MLP or a CNN exported with a dynamic batch runs
on any batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import kiln

__all__ = ["UnsupportedOperatorError", "export", "is_in_onnx_export"]

_OPSETS = range(17, 22)
_exporting = False


class UnsupportedOperatorError(RuntimeError):
    """A kiln op of the model has no ONNX form at the requested opset (``torch.onnx.errors.UnsupportedOperatorError``)."""


def is_in_onnx_export() -> bool:
    """True while :func:`export` traces the model (``torch.onnx.is_in_onnx_export``)."""
    return _exporting


def export(
    model: Callable,
    args: Any,
    f: str | os.PathLike | BinaryIO | None = None,
    *,
    kwargs: dict | None = None,
    export_params: bool = True,
    verbose: bool = False,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    do_constant_folding: bool = True,
    **unsupported: Any,
):
    """Export ``model(*args)`` to ONNX at ``f`` (a path, written atomically, or a binary file); returns the
    ``onnx.ModelProto``.

    ``args``: a tensor or a tuple of example inputs (a trailing dict is taken as keyword arguments, as in
    PyTorch). ``input_names`` / ``output_names`` name the graph's inputs and outputs (``input0``... and
    ``output0``... otherwise). ``opset_version``: 17 to 21 (default 18). ``dynamic_axes``: ``{name: {dim:
    "label"}}`` or ``{name: [dims]}`` for inputs and outputs whose sizes may change. ``export_params=False``
    leaves the weights out of the file (they become graph inputs of the same names). Constant folding always
    runs (kiln.compile's passes).
    """
    global _exporting
    import onnx
    from kiln.export import trace_program
    from kiln.onnx._ops import build_graph

    if unsupported:
        raise TypeError(f"kiln.onnx.export() got an unexpected keyword argument '{next(iter(unsupported))}'")
    opset = 18 if opset_version is None else opset_version
    if opset not in _OPSETS:
        raise ValueError(f"kiln.onnx.export: opset_version must be between 17 and 21, got {opset}")
    if isinstance(args, kiln.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        raise TypeError(f"kiln.onnx.export: args must be a tensor or a tuple of inputs, got {type(args).__name__}")
    if args and isinstance(args[-1], dict) and kwargs is None:
        args, kwargs = args[:-1], args[-1]
    was = _exporting
    _exporting = True
    try:
        graph, weights, state, _ = trace_program(model, args, kwargs or {}, "kiln.onnx.export")
    finally:
        _exporting = was
    model_proto = build_graph(
        graph, weights, state, opset, input_names, output_names, dynamic_axes or {}, export_params
    )
    onnx.checker.check_model(model_proto)
    if verbose:
        print(onnx.helper.printable_graph(model_proto.graph))
    if f is not None:
        _write(model_proto.SerializeToString(), f)
    return model_proto


def _write(data: bytes, f: str | os.PathLike | BinaryIO) -> None:
    """``data`` into ``f``: a path replaced whole or not at all (kiln's atomic write), a file object as is."""
    if hasattr(f, "write"):
        f.write(data)
        return
    from kiln.backend import atomic_write

    atomic_write(f, lambda fh, path: fh.write(data))
