"""kiln-compile's code generator for device ``"cpu"``: a fused group of pointwise ops (and a whole-tensor sum or
mean after them) becomes one Numba loop.

kiln-compile hands over a ``FusedGroup`` (plain data: the iteration shape, the inputs' shapes and dtypes,
scalar expressions, the outputs to store, an optional reduction). The loop is written as Python source to a
file named by its hash under ``KILN_CPU_CACHE`` (default ``~/.cache/kiln/cpu``; kiln.backend's
``generated_module``) and compiled with ``cache=True``, so a group compiles once per machine. Two functions
per group are compiled as needed: a flat loop (every input contiguous and of the full shape), a nested one
over contiguous inputs some of which broadcast (their strides written into the source: the shapes are the
trace's, fixed by its guards), and a nested loop over any strided views.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path

import numpy as np

from kiln.backend import from_array, generated_module, host_view

__all__ = ["codegen", "cache_dir", "source"]

_FLAGS = 'cache=True, nogil=True, error_model="numpy"'


def cache_dir() -> Path:
    """Where generated loops live (``KILN_CPU_CACHE``, default ``~/.cache/kiln/cpu``)."""
    root = os.environ.get("KILN_CPU_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kiln", "cpu")
    return Path(root) / "fused"


@functools.cache
def _helpers_digest() -> str:
    """A digest of the jitted helpers a generated loop inlines: in its text, so that a new kiln-cpu writes new
    files (Numba checks only the timestamp of the file that defines a function, not of what it inlines)."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("_fused_math.py", "_jit_f32math.py", "_jit_support.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def _broadcast_strides(shape: tuple, full: tuple) -> tuple:
    """Element strides of a C-contiguous array of ``shape`` read as ``full`` (0 along broadcast dims)."""
    shape = (1,) * (len(full) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step if n != 1 else 0)
        step *= n
    return tuple(reversed(strides))


_CHUNK = 1024  # elements the flat loop computes before summing them (the reduction's buffer)


def _sum_rows(indent: str, m: str) -> list[str]:
    """Add ``buf[:m]`` into ``acc`` with four running sums: the computing loop stays free of the reduction's
    dependency (so it vectorizes), and four chains hide the additions' latency."""
    return [
        f"{indent}s0 = s1 = s2 = s3 = 0.0",
        f"{indent}j = 0",
        f"{indent}while j + 4 <= {m}:",
        f"{indent}    s0 += buf[j]",
        f"{indent}    s1 += buf[j + 1]",
        f"{indent}    s2 += buf[j + 2]",
        f"{indent}    s3 += buf[j + 3]",
        f"{indent}    j += 4",
        f"{indent}while j < {m}:",
        f"{indent}    s0 += buf[j]",
        f"{indent}    j += 1",
        f"{indent}acc += (s0 + s1) + (s2 + s3)",
    ]


def source(group) -> str:
    """The module text of ``group``'s loops: ``flat`` (inputs of the full shape), ``dense`` (contiguous
    inputs, some broadcast: their strides are written into the loop, so the innermost one vectorizes) and
    ``strided`` (any views). With a reduction, each innermost run of values goes to a buffer first, then
    into the sum. An index that is not a bare loop variable is cast to unsigned (``_u``): Numba wraps
    negative signed indices, and that per-element select kept LLVM from vectorizing (a fused lerp of 200K
    float32 took 390 us in 1024-element chunks indexed ``first + j``, 30 us as one loop)."""
    n_in, n_out, nd = len(group.inputs), len(group.outputs), len(group.shape)
    arrays = [f"a{i}" for i in range(n_in)] + [f"b{j}" for j in range(n_out)]
    reduce = group.reduction[1] if group.reduction is not None else None

    def body(reads: list[str], write: str, slot: str, indent: str) -> list[str]:
        lines = [f"{indent}x{i} = a{i}[{r}]" for i, r in enumerate(reads)]
        lines += [f"{indent}{name} = {expr}" for name, expr in group.lines]
        lines += [f"{indent}b{j}[{write}] = {name}" for j, (name, _) in enumerate(group.outputs)]
        if reduce is not None:
            lines.append(f"{indent}buf[{slot}] = {reduce}")
        return lines

    def start(name: str, params: list[str], buffer: int) -> list[str]:
        out = [f"@njit({_FLAGS})", f"def {name}({', '.join(params)}):", "    acc = 0.0"]
        if reduce is not None:
            out.append(f"    buf = np.empty({max(buffer, 1)}, np.float64)")
        return out

    def nested(name: str, reads: list[str], write: str) -> list[str]:
        inner = group.shape[-1] if nd else 1
        out = start(name, arrays, inner)
        indent = "    "
        for k in range(nd):
            out.append(f"{indent}for i{k} in range({group.shape[k]}):")
            indent += "    "
        last = f"i{nd - 1}" if nd else "0"
        out += body(reads, write, last, indent)
        if reduce is not None:
            out += _sum_rows(indent[:-4] if nd else "    ", str(inner))
        return out + ["    return acc"]

    def flat_index(strides: tuple) -> str:
        terms = [f"i{k}" if s == 1 else f"i{k} * {s}" for k, s in enumerate(strides) if s]
        if len(terms) == 1 and terms[0].isidentifier():
            return terms[0]  # a loop variable: never negative, as LLVM sees
        return f"_u({' + '.join(terms)})" if terms else "0"

    flat = start("flat", ["n", *arrays], _CHUNK)
    if reduce is None:  # one loop: it vectorizes
        flat += ["    for i in range(n):"] + body(["i"] * n_in, "i", "", "        ")
    else:
        flat += [
            f"    for first in range(0, n, {_CHUNK}):",
            f"        m = min({_CHUNK}, n - first)",
            "        for j in range(m):",
        ]
        flat += ["            i = _u(first + j)"] + body(["i"] * n_in, "i", "j", "            ")
        flat += _sum_rows("        ", "m")
    flat.append("    return acc")
    reads = [flat_index(_broadcast_strides(shape, group.shape)) for shape, _ in group.inputs]
    dense = nested("dense", reads, flat_index(_broadcast_strides(group.shape, group.shape)))
    index = ", ".join(f"i{k}" for k in range(nd)) if nd else "()"
    strided = nested("strided", [index] * n_in, index)
    return "\n".join(
        [
            "# Generated by kiln-cpu (kiln_cpu.fusion) for a kiln.compile fused group; the file name is the hash",
            f"# of this text. Helpers: {_helpers_digest()}.",
            "from math import inf, nan",
            "",
            "import numpy as np",
            "from numba import njit",
            "from numpy import float32, float64",
            "",
            "from kiln_cpu._fused_math import cos, erf, erfc, exp, expm1, log, log1p, sigmoid, sin, sqrt, tanh",
            "from kiln_cpu._jit_support import _u",
            "",
            "",
            *flat,
            "",
            "",
            *dense,
            "",
            "",
            *strided,
            "",
        ]
    )


def _compile(group):
    mod = generated_module(source(group), cache_dir(), "kiln_cpu_fused")
    shape = group.shape
    n = math.prod(shape)
    out_dtypes = [np.dtype(d) for _, d in group.outputs]
    reduction = group.reduction
    keep = (1,) * len(shape) if group.keepdim else ()

    def kernel(*tensors):
        arrays = [host_view(t) for t in tensors]
        outs = [np.empty(shape, d) for d in out_dtypes]
        if all(a.flags.c_contiguous for a in arrays):
            flat = [a.reshape(-1) for a in arrays] + [o.reshape(-1) for o in outs]
            if all(a.shape == shape for a in arrays):
                acc = mod.flat(n, *flat)
            else:
                acc = mod.dense(*flat)
        else:
            acc = mod.strided(*(np.broadcast_to(a, shape) for a in arrays), *outs)
        results = [from_array(o) for o in outs]
        if reduction is not None:
            kind, _, dtype = reduction
            value = acc if kind == "sum" else (acc / n if n else math.nan)
            results.append(from_array(np.full(keep, value, dtype=np.dtype(dtype))))
        return tuple(results)

    return kernel


class _CodeGenerator:
    """What kiln-cpu registers through ``kiln_register_compilers``: ``codegen(group) -> kernel``."""

    device_type = "cpu"

    def __call__(self, group):
        """Compile ``group`` (a kiln.compile ``FusedGroup``) to a kernel taking and returning CPU tensors."""
        return _compile(group)


codegen = _CodeGenerator()
