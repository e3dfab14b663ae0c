"""kiln-compile's code generator for device ``"cpu"``: a fused group of pointwise ops (and a sum or mean after
them, over every dim or some) becomes one Numba loop.

kiln-compile hands over a ``FusedGroup`` (plain data: the iteration shape, the inputs' shapes and dtypes,
scalar expressions, the outputs to store, an optional reduction). The loop is written as Python source to a
file named by its hash under ``KILN_CPU_CACHE`` (default ``~/.cache/kiln/cpu``; kiln.backend's
``generated_module``) and compiled with ``cache=True``, so a group compiles once per machine. Three functions
per group are compiled as needed: a flat loop (every input contiguous and of the full shape), a nested one
over contiguous inputs (their strides written into the source: the shapes are the trace's, fixed by its
guards), and a nested loop over any strided views. A sum or mean over some dims (``FusedGroup.dims``) adds
into one float64 sum per kept element, in the nested loops only. A dynamic group (``FusedGroup.dynamic``:
the compiled function has met other shapes) reads the sizes and strides that change at run time instead,
so that its loops serve every shape (:class:`_Geometry`).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln.backend import from_array, generated_module, host_view
from kiln_cpu import kernels_loss
from kiln_cpu._loop_text import FLAGS, cache_dir, module_text

__all__ = ["codegen", "cache_dir", "source"]


def _broadcast_strides(shape: tuple, full: tuple) -> tuple:
    """Element strides of a C-contiguous array of ``shape`` read as ``full`` (0 along broadcast dims)."""
    shape = (1,) * (len(full) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step if n != 1 else 0)
        step *= n
    return tuple(reversed(strides))


_CHUNK = 1024  # elements the flat loop computes into its buffers before storing and summing them
_ROW_MAX = 1 << 16  # the longest row the nested loops buffer (a longer one is stored as computed)
_RUN = 8192  # the values a dynamic group's nested loops compute into their buffers at a time
_NUMPY = {"float32": "float32", "float64": "float64", "bool": "bool_"}


def _merge(
    shape: tuple, operands: list[tuple], reduced: tuple | None, cap: int | None
) -> tuple[tuple, list[tuple], tuple]:
    """The iteration ``shape`` with its size-1 dims dropped (the last one kept if all are) and each run of
    adjacent dims merged into one where every operand (element strides, 0 along a broadcast dim) steps
    through them as through one dim, all or none of them are ``reduced``, and the merged dim is at most
    ``cap`` long (None: any length): ``(shape, the operands' strides, the reduced dims)``. A conv bias's gradient,
    (64, 16, 28, 28) summed over (0, 2, 3), loops over (64, 16, 784): its rows are long enough for vector
    lanes."""
    dims = [d for d, n in enumerate(shape) if n != 1] or list(range(len(shape)))[-1:]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in operands]
    out_reduced: list[int] = []
    for d in dims:
        red = reduced is not None and d in reduced
        if (
            out_shape
            and (cap is None or out_shape[-1] * shape[d] <= cap)  # (a longer row is not buffered: see source())
            and red == (len(out_shape) - 1 in out_reduced)
            and all(st[-1] == op[d] * shape[d] for st, op in zip(out_strides, operands))
        ):
            out_shape[-1] *= shape[d]
            for st, op in zip(out_strides, operands):
                st[-1] = op[d]
            continue
        out_shape.append(shape[d])
        for st, op in zip(out_strides, operands):
            st.append(op[d])
        if red:
            out_reduced.append(len(out_shape) - 1)
    return tuple(out_shape), [tuple(st) for st in out_strides], tuple(out_reduced)


class _Geometry:
    """The sizes and strides of one loop. A group compiled for one shape (``FusedGroup.dynamic`` false) has
    them written into the loop as numbers, so LLVM knows every trip count. A dynamic group's loop reads the
    ones that depend on a dim whose size changes (``FusedGroup.dynamic_dims``; each number comes with its
    value at a probe shape, where those dims are larger, and is read if the two differ) at run time, from one
    int64 array (``g``), under names (``n0``, ``s1``...). Its text then depends only on the sizes that do not
    change, and one compiled loop serves the group at every size of the others (a new batch size compiles
    nothing; a row of unknown length costs ~4% on 1024-element rows, more on short ones)."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.prologue: list[str] = []

    def name(self, prefix: str, value: int, probe) -> str:
        """How the loop writes ``value`` (``probe``: its value at the probe shape): the number, or a name read
        from ``g`` where it changes with the dynamic dims (a static group's probe shape is its shape)."""
        if value == probe:
            return str(int(value))
        name = f"{prefix}{len(self.values)}"
        self.prologue.append(f"    {name} = g[{len(self.values)}]")
        self.values.append(int(value))
        return name

    def strides(self, strides: tuple, probes: tuple) -> tuple:
        """Each stride as the loop writes it: the number (an int), or a name where it changes with the dynamic
        dims (:meth:`name`; ``probes``: the strides at the probe shape)."""
        return tuple(st if st == pr else self.name("s", st, pr) for st, pr in zip(strides, probes))

    def array(self) -> np.ndarray:
        """What the loop is called with: its ``g``."""
        return np.array(self.values or [0], dtype=np.int64)


def _probe(group, shape: tuple) -> tuple[tuple, list[tuple]]:
    """The probe shape of a dynamic group and its inputs' shapes: each dynamic dim of size 2 or more made
    larger (sizes 0 and 1 are kept: their loops are of another pattern, as PyTorch specializes them)."""
    nd = len(shape)
    varying = getattr(group, "dynamic_dims", None)
    varying = range(nd) if varying is None else varying
    probe = tuple(n * 2 + 2 if d in varying and n > 1 else n for d, n in enumerate(shape))
    inputs = []
    for s, _ in group.inputs:
        lead = nd - len(s)
        inputs.append(tuple(probe[lead + k] if n == shape[lead + k] and n != 1 else n for k, n in enumerate(s)))
    return probe, inputs


def _layout(shape: tuple, inputs: list[tuple], dims, cap) -> tuple:
    """``(merged shape, merged strides of the inputs, the output and the kept elements, merged reduced dims,
    kept elements' strides, number of kept elements)`` of a group's loops at ``shape``."""
    full = _broadcast_strides(shape, shape)
    # the element index into the kept elements (C order) of each position: stride 0 along the reduced dims
    kept = _broadcast_strides(tuple(1 if dims and d in dims else n for d, n in enumerate(shape)), shape)
    operands = [_broadcast_strides(s, shape) for s in inputs] + [full, kept]
    merged, strides, reduced = _merge(shape, operands, dims, cap)
    count = math.prod(n for d, n in enumerate(shape) if d not in dims) if dims is not None else 0
    return merged, strides, reduced, kept, count


def _body(group, reads: list[str], slot: str, indent: str, buffered: bool, write: str) -> list[str]:
    """The loop body of ``group``: its inputs read at ``reads``, its lines, its outputs stored (into the run's
    buffers at ``slot`` when ``buffered``, else at ``write``) and the reduction's term buffered."""
    lines = [f"{indent}x{i} = a{i}[{r}]" for i, r in enumerate(reads)]
    lines += [f"{indent}{name} = {expr}" for name, expr in group.lines]
    for j, (name, _) in enumerate(group.outputs):
        lines.append(f"{indent}o{j}[{slot}] = {name}" if buffered else f"{indent}b{j}[{write}] = {name}")
    if group.reduction is not None:
        lines.append(f"{indent}buf[{slot}] = {group.reduction[1]}")
    return lines


def _store(group, indent: str, count: str, target: str) -> list[str]:
    """Copy ``count`` buffered values into each output, slot ``s`` to element ``target``."""
    if not group.outputs:
        return []
    return [f"{indent}for s in range({count}):"] + [
        f"{indent}    b{j}[{target}] = o{j}[s]" for j in range(len(group.outputs))
    ]


def _start(group, name: str, params: list[str], prologue: list[str], run: str, buffered: bool, acc: str) -> list[str]:
    """A function's head: its geometry read, the sum ``acc`` and the buffers of a run of ``run`` values."""
    out = [f"@njit({FLAGS})", f"def {name}({', '.join(params)}):", *prologue, f"    acc = {acc}"]
    if buffered:
        out += [f"    o{j} = np.empty({run}, np.{_NUMPY[d]})" for j, (_, d) in enumerate(group.outputs)]
    if group.reduction is not None:
        out.append(f"    buf = np.empty({run}, np.float64)")
    return out


def _flat(group, name: str) -> list[str]:
    """``group``'s loop over inputs of its full shape, contiguous: ``name(n, a0.., b0..)`` in runs of
    :data:`_CHUNK` values (a sum or mean over every dim returned)."""
    arrays = [f"a{i}" for i in range(len(group.inputs))] + [f"b{j}" for j in range(len(group.outputs))]
    out = _start(group, name, ["n", *arrays], [], str(_CHUNK), True, "0.0")
    out += [
        f"    for first in range(0, n, {_CHUNK}):",
        f"        m = min({_CHUNK}, n - first)",
        "        for j in range(m):",
        "            i = _u(first + j)",
    ]
    out += _body(group, ["i"] * len(group.inputs), "j", "            ", True, "")
    out += _store(group, "        ", "m", "_u(first + s)")
    if group.reduction is not None:
        out.append("        acc += sum_run(buf, m)")
    return out + ["    return acc"]


def source(group) -> tuple[str, np.ndarray, np.ndarray]:
    """The module text of ``group``'s loops and the geometry arrays its ``dense`` and ``strided`` loops take
    (:class:`_Geometry`): ``flat`` (inputs of the full shape; left out when the group reduces some dims: a
    flat index does not say which kept element it adds into), ``dense`` (contiguous inputs, any of them
    broadcast, over the dims :func:`_merge` leaves, so the innermost one vectorizes) and ``strided`` (any
    views). A dynamic group's text holds none of the sizes that change (``FusedGroup.dynamic_dims``): groups
    that differ only in those share it, and its compiled loops.

    Each run of values (1024 of ``flat``'s, a row of the others, up to :data:`_ROW_MAX`, or :data:`_RUN` of a
    row whose length is read at run time) is computed into
    small buffers, then stored into the outputs and added into the reduction's sum. LLVM vectorizes a loop
    whose stores may overlap its loads only after checking at run time that they do not; an output stored
    into one of the inputs (an optimizer's ``exp_avg``, updated in place) fails that check, and the loop ran
    unvectorized (an Adam update of 200K float32: 640 us, 90 us through the buffers). An index that is not
    a bare loop variable is cast to unsigned (``_u``): Numba wraps negative signed indices, and that
    per-element select blocks vectorization too (a fused lerp of 200K float32: 390 us, 30 us)."""
    n_in, n_out, nd = len(group.inputs), len(group.outputs), len(group.shape)
    arrays = [f"a{i}" for i in range(n_in)] + [f"b{j}" for j in range(n_out)]
    reduce = group.reduction[1] if group.reduction is not None else None
    dims = getattr(group, "dims", None) if reduce is not None else None  # some dims: one float64 sum per kept element
    dynamic = bool(getattr(group, "dynamic", False))  # (a kiln-compile before dynamic groups has no such field)

    def index(strides: tuple, last: str) -> str:
        """The flat element index of ``(i0, ..., last)`` for these element strides (0, 1 or a name)."""
        names = [f"i{k}" for k in range(len(strides) - 1)] + [last]
        terms = [n if st == 1 else f"{n} * {st}" for n, st in zip(names, strides) if st != 0]
        if len(terms) == 1 and terms[0].isidentifier():
            return terms[0]  # a loop variable: never negative, as LLVM sees
        return f"_u({' + '.join(terms)})" if terms else "0"

    def nested(name: str, shape: tuple, reduced, reads, target, kept: tuple, count: tuple) -> tuple:
        """Loops over ``shape`` (``reduced``: the dims the reduction adds over, None for every one); ``reads``
        and ``target`` map a geometry and the last index to index expressions, ``kept`` are the element
        strides of the kept elements (with some dims reduced), ``count`` the number of kept elements. Each
        number comes with its value at the probe shape (:class:`_Geometry`). A last dim of a size read at
        run time (or longer than :data:`_ROW_MAX`) is walked in runs of at most :data:`_RUN` values."""
        geo = _Geometry()
        sizes = [geo.name("n", n, pr) for n, pr in shape]
        ndim = len(shape)
        inner = sizes[-1] if ndim else "1"
        chunked = ndim > 0 and dynamic and (not inner.isdigit() or int(inner) > _ROW_MAX)
        buffered = chunked or (shape[-1][0] if ndim else 1) <= _ROW_MAX
        last = "(c + j)" if chunked else (f"i{ndim - 1}" if ndim else "0")
        acc = "0.0"
        if dims is not None:
            kept_strides = geo.strides(*kept)
            acc = f"np.zeros({geo.name('k', *count)}, np.float64)"
        read = reads(geo, last)
        put = target(geo)
        run = f"max({inner}, 1)" if not inner.isdigit() else str(max(int(inner), 1))
        out = _start(
            group, name, ["g", *arrays], geo.prologue, f"min({run}, {_RUN})" if chunked else run, buffered, acc
        )
        indent = "    "
        for k in range(ndim - 1 if chunked else ndim):
            out.append(f"{indent}for i{k} in range({sizes[k]}):")
            indent += "    "
        if chunked:
            out += [f"{indent}for c in range(0, {inner}, {_RUN}):", f"{indent}    m = min({_RUN}, {inner} - c)"]
            out.append(f"{indent}    for j in range(m):")
            indent += "        "
        out += _body(group, read, "j" if chunked else last, indent, buffered, put(last))
        row = indent[:-4] if ndim else "    "
        count, first = ("m", "(c + s)") if chunked else (inner, "s")
        if buffered:
            out += _store(group, row, count, put(first if ndim else "0"))
        if dims is not None and ndim - 1 in reduced:  # the row adds into one kept element
            out.append(f"{row}acc[{index(kept_strides, last)}] += sum_run(buf, {count})")
        elif dims is not None:  # the row adds into a row of kept elements
            out += [f"{row}for s in range({count}):", f"{row}    acc[{index(kept_strides, first)}] += buf[s]"]
        elif reduce is not None:
            out.append(f"{row}acc += sum_run(buf, {count})")
        return out + ["    return acc"], geo.array()

    shape = group.shape
    # (with some dims reduced, a flat index does not say which kept element it adds into)
    flat = _flat(group, "flat") if dims is None else []
    cap = None if dynamic else _ROW_MAX
    merged, strides, reduced, kept, count = layout = _layout(shape, [s for s, _ in group.inputs], dims, cap)
    probe_shape = shape
    p_merged, p_strides, p_reduced, p_kept, p_count = layout  # a static group: every number written in
    if dynamic:
        probe_shape, probe_inputs = _probe(group, shape)
        p_merged, p_strides, p_reduced, p_kept, p_count = _layout(probe_shape, probe_inputs, dims, cap)
    if len(p_merged) != len(merged) or p_reduced != reduced:  # (the same dims merge at both: a safeguard)
        p_merged, p_strides = (None,) * len(merged), [(None,) * len(st) for st in strides]  # every number read

    def dense_reads(geo: _Geometry, last: str) -> list[str]:
        return [index(geo.strides(st, pr), last) for st, pr in zip(strides[:n_in], p_strides)]

    def dense_target(geo: _Geometry):
        out = geo.strides(strides[n_in], p_strides[n_in]) if merged else ()
        return lambda last: index(out, last) if merged else "0"

    dense, dense_geo = nested(
        "dense",
        tuple(zip(merged, p_merged)),
        reduced,
        dense_reads,
        dense_target,
        (strides[n_in + 1], p_strides[n_in + 1]),
        (count, p_count),
    )

    def point(last: str) -> str:
        return ", ".join([f"i{k}" for k in range(nd - 1)] + [last]) if nd else "()"

    strided, strided_geo = nested(
        "strided",
        tuple(zip(shape, probe_shape)),
        dims,
        lambda geo, last: [point(last)] * n_in,
        lambda geo: point,
        (kept, p_kept),
        (count, p_count),
    )
    text = module_text([flat, dense, strided])
    return text, dense_geo, strided_geo


def _target(view: np.ndarray, arrays: list) -> np.ndarray:
    """Where the loop stores an output meant for the tensor ``view`` shows: ``view`` itself, unless one of
    the other inputs ``arrays`` overlaps its memory in another layout (a transposed or broadcast view of it:
    an element would be read after it was stored); then a new array, copied into ``view`` after the loop."""
    for a in arrays:
        if np.may_share_memory(a, view):  # bounds only: cheap, and most inputs are elsewhere
            same = a.shape == view.shape and a.strides == view.strides and a.ctypes.data == view.ctypes.data
            if not same:
                return np.empty(view.shape, view.dtype)
    return view


def _compile(group):
    text, dense_geo, strided_geo = source(group)
    mod = generated_module(text, cache_dir(), "kiln_cpu_fused")
    shape = group.shape
    n = math.prod(shape)
    out_dtypes = [np.dtype(d) for _, d in group.outputs]
    reduction = group.reduction
    dims = getattr(group, "dims", None)  # (a kiln-compile before partial reductions has no such field)
    reduced = range(len(shape)) if dims is None else dims
    if group.keepdim:
        keep = tuple(1 if d in reduced else size for d, size in enumerate(shape))
    else:
        keep = tuple(size for d, size in enumerate(shape) if d not in reduced)
    count = math.prod(shape[d] for d in reduced)  # the elements each result adds

    kinds = [getattr(kiln, d) for _, d in group.outputs]  # the kiln dtypes: from_array then skips finding them
    # every input of the group's own shape (the trace's, kept by its guards): contiguous ones take the flat loop
    flat_loop = dims is None and all(tuple(s) == shape for s, _ in group.inputs)

    def kernel(*tensors, out=None):
        arrays = [host_view(t) for t in tensors]
        if out is None:
            views = None
            outs = [np.empty(shape, d) for d in out_dtypes]
        else:
            views = [None if t is None else host_view(t) for t in out]
            outs = [
                np.empty(shape, d) if v is None else _target(v, [a for a, x in zip(arrays, tensors) if x is not t])
                for d, v, t in zip(out_dtypes, views, out)
            ]  # the target read as an input is itself: read at the same elements
        for a in arrays:
            if not a.flags.c_contiguous:
                acc = mod.strided(strided_geo, *[np.broadcast_to(a, shape) for a in arrays], *outs)
                break
        else:
            flat = [a.reshape(-1) for a in arrays]
            flat += [o.reshape(-1) for o in outs]
            acc = mod.flat(n, *flat) if flat_loop else mod.dense(dense_geo, *flat)
        if views is None:
            results = [from_array(o, k) for o, k in zip(outs, kinds)]
        else:
            for o, v in zip(outs, views):
                if v is not None and o is not v:  # stored aside: an input overlapped the target
                    np.copyto(v, o)
            results = [from_array(o, k) if t is None else t for o, k, t in zip(outs, kinds, out)]
        if reduction is not None:
            kind, _, dtype = reduction
            if kind == "mean":
                acc = acc / count if count else acc * math.nan  # (an empty mean is NaN, as eager's)
            results.append(from_array(np.asarray(acc, dtype=np.dtype(dtype)).reshape(keep), getattr(kiln, dtype)))
        return tuple(results)

    return kernel


_HORIZONTAL_CHUNK = 16
"""The most groups one generated ``many`` function calls: Numba's compile time grows with its arguments
(three per group for an SGD update), so a long run is cut into calls of this many groups. Runs of the same
groups (an optimizer over parameters of any shapes) repeat one module text, compiled once."""


def _compile_horizontal(groups: list):
    """One kernel for several independent groups (kiln-compile's horizontal fusion: an optimizer's update of
    each parameter), each reading only tensors of its own shape: one Numba call per
    :data:`_HORIZONTAL_CHUNK` groups runs each group's flat loop in turn (groups with the same text share
    one function). Its inputs, ``out`` entries and results are the groups' in order. A call whose tensors
    the flat loops do not take (one not C-contiguous, a target another input overlaps in another layout)
    runs each group's own kernel instead."""
    chunks = []
    for first in range(0, len(groups), _HORIZONTAL_CHUNK):
        part = groups[first : first + _HORIZONTAL_CHUNK]
        flats: dict[str, str] = {}  # a flat loop's text (named "flat") -> its name in the module
        calls, params = [], []
        for i, g in enumerate(part):
            text = "\n".join(_flat(g, "flat"))
            name = flats.setdefault(text, f"flat{len(flats)}")
            names = [f"a{i}_{k}" for k in range(len(g.inputs))] + [f"b{i}_{k}" for k in range(len(g.outputs))]
            calls.append(f"    {name}(n{i}, {', '.join(names)})")
            params += [f"n{i}", *names]
        functions = [text.replace("def flat(", f"def {name}(", 1).splitlines() for text, name in flats.items()]
        many = [f"@njit({FLAGS})", f"def many({', '.join(params)}):", *calls]
        chunks.append(generated_module(module_text([*functions, many]), cache_dir(), "kiln_cpu_fused").many)
    layout = [
        (
            g.shape,
            math.prod(g.shape),
            len(g.inputs),
            [np.dtype(d) for _, d in g.outputs],
            [getattr(kiln, d) for _, d in g.outputs],
        )
        for g in groups
    ]
    alone: list = []  # each group's own kernel, made on the first call that needs them

    def kernel(*tensors, out=None):
        targets = out if out is not None else [None] * sum(len(g.outputs) for g in groups)
        args, made = [], []
        t = o = 0
        for shape, n, n_in, dtypes, kinds in layout:
            ins = tensors[t : t + n_in]
            arrays = [host_view(x) for x in ins]
            if any(a.shape != shape or not a.flags.c_contiguous for a in arrays):
                return _each(tensors, out)
            group_args = [n, *(a.reshape(-1) for a in arrays)]
            for d, k, dst in zip(dtypes, kinds, targets[o : o + len(dtypes)]):
                if dst is None:
                    made.append((np.empty(shape, d), k, None))
                else:
                    view = host_view(dst)
                    if _target(view, [a for a, x in zip(arrays, ins) if x is not dst]) is not view:
                        return _each(tensors, out)
                    made.append((view, k, dst))
                group_args.append(made[-1][0].reshape(-1))
            args.append(group_args)
            t, o = t + n_in, o + len(dtypes)
        for c, many in enumerate(chunks):
            many(*(a for group_args in args[c * _HORIZONTAL_CHUNK : (c + 1) * _HORIZONTAL_CHUNK] for a in group_args))
        return tuple(from_array(a, k) if dst is None else dst for a, k, dst in made)

    def _each(tensors, out):
        if not alone:
            alone.extend(_compile(g) for g in groups)
        results = []
        t = o = 0
        for g, own in zip(groups, alone):
            n_in, n_out = len(g.inputs), len(g.outputs)
            results += own(*tensors[t : t + n_in], out=None if out is None else out[o : o + n_out])
            t, o = t + n_in, o + n_out
        return tuple(results)

    return kernel


class _CodeGenerator:
    """What kiln-cpu registers through ``kiln_register_compilers``: ``codegen(group) -> kernel``."""

    device_type = "cpu"
    partial_reductions = True  # it sums over some dims of a group too (FusedGroup.dims)

    def __call__(self, group):
        """Compile ``group`` (a kiln.compile ``FusedGroup``) to a kernel taking and returning CPU tensors."""
        return _compile(group)

    @staticmethod
    def horizontal(groups):
        """Several independent groups, each reading only tensors of its own shape, as one kernel."""
        return _compile_horizontal(groups)

    # kiln-compile's fused cross entropy (log-softmax then nll_loss) and its backward, one pass each
    log_softmax_nll = staticmethod(kernels_loss.log_softmax_nll)
    log_softmax_nll_backward = staticmethod(kernels_loss.log_softmax_nll_backward)

    @staticmethod
    def program(plan):
        """A whole graph (a kiln.compile ``WholeProgram``) as one native function, or None
        (:mod:`kiln_cpu.whole`)."""
        from kiln_cpu.whole import program

        return program(plan)


codegen = _CodeGenerator()
