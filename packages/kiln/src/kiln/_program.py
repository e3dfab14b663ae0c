"""Exported programs: a traced graph of kiln ops plus its weights, saved and run with only the core installed.

kiln-compile's ``kiln.export.export(model, args)`` makes an :class:`ExportedProgram`; this module runs,
saves and loads one, so that a program exported where kiln-compile is installed loads and runs anywhere
kiln is (``kiln.jit.load`` / ``kiln.export.load``), without the model's Python code and without executing
anything from the file. The file is a safetensors file (:func:`kiln.save`): the weights as tensors, the
program as JSON under the key ``"program"`` — every node an op name from kiln's registry and arguments
that are JSON values, tensors by index, or tagged dtypes, devices and tuples. Loading validates all of it
(op names, indices, argument forms, sizes) and raises ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, BinaryIO

from kiln import _dtype as dt
from kiln._device import device as _device
from kiln._tensor import Tensor

__all__ = ["ExportedProgram", "load_program", "save_program"]

FORMAT = "kiln.exported_program"
VERSION = 1
_MAX_NODES = 1_000_000


class ExportedProgram:
    """A program of kiln ops with its weights (``torch.export.ExportedProgram``): call it like the model it
    was exported from, on inputs of the exported shapes and dtypes.

    ``graph`` is the program as JSON-ready data (``inputs``, ``nodes``, ``outputs``, ``out_spec``);
    ``state_dict`` holds the weights by name (the model's parameter and buffer names where the export found
    them). Print it to read the graph.
    """

    def __init__(self, graph: dict, state_dict: dict[str, Tensor]) -> None:
        _validate(graph, state_dict)
        self.graph = graph
        self.state_dict = dict(state_dict)
        self._nodes = [(_op(n["op"]), n["args"], n["outputs"]) for n in graph["nodes"]]

    @property
    def input_specs(self) -> list[tuple[tuple[int, ...], dt.dtype]]:
        """(shape, dtype) of each tensor input, in call order."""
        return [(tuple(i["shape"]), _dtype(i["dtype"])) for i in self.graph["inputs"]]

    def __call__(self, *args: Any) -> Any:
        """Run the program on ``args`` (tensors of the exported shapes and dtypes), op by op."""
        flat = list(args)
        specs = self.input_specs
        if len(flat) != len(specs):
            raise TypeError(f"the exported program takes {len(specs)} tensors, got {len(flat)}")
        env: dict[int, Tensor] = {}
        for k, (t, (shape, dtype)) in enumerate(zip(flat, specs)):
            if not isinstance(t, Tensor):
                raise TypeError(f"exported program input {k}: expected a kiln.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape or t.dtype is not dtype:
                raise RuntimeError(
                    f"exported program input {k}: expected {dtype} of shape {list(shape)}, got {t.dtype} of shape "
                    f"{list(t.shape)} (a program runs on the shapes it was exported with)"
                )
            if t.storage_offset() or not t.is_contiguous():  # the program was traced on row-major inputs
                t = t.contiguous().clone() if t.is_contiguous() else t.contiguous()
            env[self.graph["inputs"][k]["value"]] = t
        for name, index in self.graph["weights"].items():
            env[index] = self.state_dict[name]
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            for opdef, raw_args, outs in self._nodes:
                result = opdef(*(_decode(a, env) for a in raw_args))
                for index, t in zip(outs, (result,) if len(outs) == 1 else result):
                    env[index] = t
        return _rebuild(self.graph["out_spec"], [env[i] for i in self.graph["outputs"]])

    def module(self) -> ExportedProgram:
        """The program as a callable (``ExportedProgram.module()`` in PyTorch returns a module; this one is
        called the same way)."""
        return self

    def __str__(self) -> str:
        g = self.graph
        inputs = ", ".join("v{}: {}{}".format(i["value"], i["dtype"], i["shape"]) for i in g["inputs"])
        lines = [f"ExportedProgram({inputs}):"]
        lines += [f"    weight v{index} = {name}" for name, index in g["weights"].items()]
        for n in g["nodes"]:
            outs = ", ".join(f"v{i}" for i in n["outputs"])
            lines.append(f"    {outs} = {n['op']}({', '.join(_show(a) for a in n['args'])})")
        lines.append(f"    return ({', '.join(f'v{i}' for i in g['outputs'])})")
        return "\n".join(lines)


def save_program(program: ExportedProgram, f: str | os.PathLike | BinaryIO) -> None:
    """Write ``program`` to ``f`` (a path, written atomically, or a binary file) as safetensors + JSON."""
    if not isinstance(program, ExportedProgram):
        raise TypeError(f"save expects an ExportedProgram, got {type(program).__name__}")
    from kiln.serialization import save

    save({"program": json.dumps(program.graph), "weights": program.state_dict}, f, format="safetensors")


def load_program(f: str | os.PathLike | BinaryIO) -> ExportedProgram:
    """Read a program :func:`save_program` wrote; nothing in the file is executed (``ValueError`` if it is
    not a valid program)."""
    from kiln.serialization import load

    data = load(f, map_location="cpu")
    if not isinstance(data, dict) or set(data) != {"program", "weights"} or not isinstance(data["program"], str):
        raise ValueError("not a kiln exported program (expected the keys 'program' and 'weights')")
    try:
        graph = json.loads(data["program"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"exported program: the program is not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError("exported program: the program's JSON is nested too deeply") from None
    weights = data["weights"]
    if not isinstance(weights, dict):
        raise ValueError("exported program: 'weights' is not a dict of tensors")
    return ExportedProgram(graph, weights)


# ---------------------------------------------------------------------------------------------- arguments


def encode_argument(a: Any, value_index) -> Any:
    """An op argument as JSON-ready data: ``value_index(a)`` gives the value index of what stands for a tensor
    (None for anything else); ``TypeError`` for anything a program cannot hold."""
    index = value_index(a)
    if index is not None:
        return {"v": index}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, list):
        return [encode_argument(x, value_index) for x in a]
    if isinstance(a, tuple):
        return {"tuple": [encode_argument(x, value_index) for x in a]}
    if isinstance(a, slice):
        return {"slice": [encode_argument(x, value_index) for x in (a.start, a.stop, a.step)]}
    if a is Ellipsis:
        return {"ellipsis": None}
    if isinstance(a, dt.dtype):
        return {"dtype": a.name}
    if isinstance(a, _device):
        return {"device": str(a)}
    from kiln._memory_format import memory_format

    if isinstance(a, memory_format):
        return {"memory_format": a.name}
    raise TypeError(f"a {type(a).__name__} argument cannot be exported")


def _decode(a: Any, env: dict[int, Tensor]) -> Any:
    if isinstance(a, list):
        return [_decode(x, env) for x in a]
    if not isinstance(a, dict):
        return a
    ((tag, v),) = a.items()
    if tag == "v":
        return env[v]
    if tag == "tuple":
        return tuple(_decode(x, env) for x in v)
    if tag == "float":
        return float(v)
    if tag == "slice":
        return slice(*(_decode(x, env) for x in v))
    if tag == "ellipsis":
        return Ellipsis
    if tag == "dtype":
        return _dtype(v)
    if tag == "device":
        return _device(v)
    import kiln

    return getattr(kiln, v)  # memory_format: validated to be one of kiln's


def _show(a: Any) -> str:
    if isinstance(a, list):
        return f"[{', '.join(_show(x) for x in a)}]"
    if not isinstance(a, dict):
        return repr(a)
    ((tag, v),) = a.items()
    if tag == "v":
        return f"v{v}"
    if tag == "tuple":
        return f"({', '.join(_show(x) for x in v)}{',' if len(v) == 1 else ''})"
    return f"{tag}:{v}"


def _rebuild(spec: Any, tensors: list[Tensor]) -> Any:
    if isinstance(spec, int):
        return tensors[spec]
    if spec is None:
        return None
    kind, items = spec
    if kind == "dict":
        return {k: _rebuild(v, tensors) for k, v in items}
    out = [_rebuild(x, tensors) for x in items]
    return tuple(out) if kind == "tuple" else out


# ---------------------------------------------------------------------------------------------- validation


def _dtype(name: str) -> dt.dtype | None:
    return dt._BY_NAME.get(name) if isinstance(name, str) else None


def _op(name: str):
    from kiln._dispatch import OPS

    return OPS[name]


def _bad(msg: str) -> ValueError:
    return ValueError(f"invalid exported program: {msg}")


def _validate(graph: Any, weights: dict) -> None:
    """Check every field before anything runs (a file is data from anywhere)."""
    from kiln._dispatch import OPS
    from kiln._memory_format import memory_format

    if not isinstance(graph, dict) or graph.get("format") != FORMAT:
        raise _bad(f"'format' must be {FORMAT!r}")
    if graph.get("version") != VERSION:
        raise _bad(f"version {graph.get('version')!r} (this kiln reads version {VERSION})")
    for key in ("inputs", "weights", "nodes", "outputs"):
        if key not in graph:
            raise _bad(f"missing {key!r}")
    known: set[int] = set()

    def index(v: Any, what: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _bad(f"{what}: {v!r} is not a value index")
        return v

    if not isinstance(graph["inputs"], list):
        raise _bad("'inputs' must be a list")
    for k, i in enumerate(graph["inputs"]):
        if not isinstance(i, dict) or set(i) != {"value", "shape", "dtype"}:
            raise _bad(f"input {k} must have 'value', 'shape' and 'dtype'")
        known.add(index(i["value"], f"input {k}"))
        if not isinstance(i["shape"], list) or not all(isinstance(n, int) and n >= 0 for n in i["shape"]):
            raise _bad(f"input {k}: bad shape {i['shape']!r}")
        if not isinstance(i["dtype"], str) or _dtype(i["dtype"]) is None:
            raise _bad(f"input {k}: unknown dtype {i['dtype']!r}")
    if not isinstance(graph["weights"], dict):
        raise _bad("'weights' must map names to value indices")
    for name, v in graph["weights"].items():
        if name not in weights or not isinstance(weights[name], Tensor):
            raise _bad(f"weight {name!r} is not in the file")
        known.add(index(v, f"weight {name!r}"))
    nodes = graph["nodes"]
    if not isinstance(nodes, list) or len(nodes) > _MAX_NODES:
        raise _bad("'nodes' must be a list (of at most a million nodes)")

    def check_arg(a: Any, where: str, depth: int = 0) -> None:
        if depth > 20:
            raise _bad(f"{where}: arguments nested too deeply")
        if a is None or isinstance(a, (bool, int, float, str)):
            return
        if isinstance(a, list):
            for x in a:
                check_arg(x, where, depth + 1)
            return
        if not isinstance(a, dict) or len(a) != 1:
            raise _bad(f"{where}: argument {a!r} is not an exported form")
        ((tag, v),) = a.items()
        if tag == "v":
            if index(v, where) not in known:
                raise _bad(f"{where}: value v{v} is used before it is made")
        elif tag == "tuple":
            if not isinstance(v, list):
                raise _bad(f"{where}: a tuple must hold a list")
            for x in v:
                check_arg(x, where, depth + 1)
        elif tag == "float":
            if v not in ("inf", "-inf", "nan"):
                raise _bad(f"{where}: {v!r} is not a float")
        elif tag == "slice":
            if not isinstance(v, list) or len(v) != 3 or not all(x is None or type(x) is int for x in v):
                raise _bad(f"{where}: a slice must hold [start, stop, step], each an int or null")
        elif tag == "ellipsis":
            if v is not None:
                raise _bad(f"{where}: bad ellipsis")
        elif tag == "dtype":
            if not isinstance(v, str) or _dtype(v) is None:
                raise _bad(f"{where}: unknown dtype {v!r}")
        elif tag == "device":
            try:
                _device(v)
            except (RuntimeError, TypeError, ValueError):
                raise _bad(f"{where}: bad device {v!r}") from None
        elif tag == "memory_format":
            import kiln

            if not isinstance(getattr(kiln, str(v), None), memory_format):
                raise _bad(f"{where}: unknown memory format {v!r}")
        else:
            raise _bad(f"{where}: unknown argument tag {tag!r}")

    for k, n in enumerate(nodes):
        if not isinstance(n, dict) or set(n) != {"op", "args", "outputs"}:
            raise _bad(f"node {k} must have 'op', 'args' and 'outputs'")
        if not isinstance(n["op"], str) or n["op"] not in OPS:
            raise _bad(f"node {k}: kiln has no op {n['op']!r}")
        if not isinstance(n["args"], list) or not isinstance(n["outputs"], list) or not n["outputs"]:
            raise _bad(f"node {k}: 'args' and 'outputs' must be lists")
        if len(n["outputs"]) != OPS[n["op"]].num_outputs:
            raise _bad(f"node {k}: op {n['op']} makes {OPS[n['op']].num_outputs} outputs, not {len(n['outputs'])}")
        for a in n["args"]:
            check_arg(a, f"node {k} ({n['op']})")
        for v in n["outputs"]:
            known.add(index(v, f"node {k}"))
    if not isinstance(graph["outputs"], list):
        raise _bad("'outputs' must be a list")
    for v in graph["outputs"]:
        if index(v, "outputs") not in known:
            raise _bad(f"output v{v} is never made")
    _check_spec(graph.get("out_spec"), len(graph["outputs"]))


def _check_spec(spec: Any, n: int, depth: int = 0) -> None:
    if depth > 50:
        raise _bad("'out_spec' nested too deeply")
    if spec is None:
        return
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not 0 <= spec < n:
            raise _bad(f"'out_spec' refers to output {spec} of {n}")
        return
    if not isinstance(spec, list) or len(spec) != 2 or spec[0] not in ("tuple", "list", "dict"):
        raise _bad(f"'out_spec' entry {spec!r} is not an exported form")
    if not isinstance(spec[1], list):
        raise _bad(f"'out_spec' entry {spec!r} must hold a list")
    for item in spec[1]:
        if spec[0] == "dict":
            if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
                raise _bad("'out_spec': a dict entry must be [key, spec]")
            _check_spec(item[1], n, depth + 1)
        else:
            _check_spec(item, n, depth + 1)
