"""kiln-cpu's whole programs: a kiln.compile graph (``mode="reduce-overhead"``) as one Numba function.

kiln-compile hands over a ``WholeProgram`` (:mod:`kiln.compile._whole`: the graph's values with their traced
layouts, its steps, its outputs and ``.grad`` assignments); :func:`program` writes one ``@njit`` function
for it, a file named by the text's hash under ``KILN_CPU_CACHE`` like the fused loops, so a program
compiles once per machine. The steps run without returning to Python between them: a small training step
spends its time in its arithmetic and its products, not in a Python call per op over caches its last
product emptied (a 784-256-10 MLP's SGD step, one thread, MKL: 0.70x PyTorch eager's time as one function,
0.94x as one Python call per kernel).

Each value is a local array in the traced layout: a value the program makes is allocated in its traced
strides; a view (an op tagged ``view``) is a strided view of the buffer it views, at the offset and strides
its spec gives (over an input, only a view that starts at the input's first element and stays within its
elements: ``t``, ``transpose``, ``expand``, ``view`` and the like). A fused group (kiln-compile's planning)
is one loop computing its expressions, storing its values (into an input it updates, after a run-time check
that the other inputs it reads share no memory with it) and adding its sum or mean in float64; a pointwise
op outside a group is a loop of its own; products call the BLAS the eager kernels use (MKL where kiln-cpu's
``mkl`` extra is active, else NumPy's OpenBLAS) on their thread counts; sums and means accumulate in
float64; the cross entropy's four ops (``_log_softmax``, ``_nll_loss`` and their backwards over the rows of
a 2-d input) are row loops. Writes into inputs are counted with ``mark_written`` after the call; an output
over an input is made from the input tensor then, as the default program makes it. Anything else (another
op, another dtype, a layout not above, two results in one buffer, a gradient over an input) makes
:func:`program` return None: kiln-compile's default program runs it. A target out of range stops the
function before it writes an input; the call is then run by the graph op by op, which raises PyTorch's
error.
"""

from __future__ import annotations

import math

import numba
import numpy as np

import kiln
from kiln.backend import contiguous_strides, from_array, generated_module, host_view, mark_written
from kiln_cpu import _blas, _mkl, _threads
from kiln_cpu._loop_text import FLAGS, cache_dir, module_text
from kiln_cpu._loop_text import FUSED_HELPERS as _HELPERS

__all__ = ["program"]

_DTYPES = {kiln.float32: "float32", kiln.float64: "float64", kiln.int64: "int64", kiln.bool: "bool_"}
_FLOATS = (kiln.float32, kiln.float64)


class _Refused(Exception):
    """The plan holds something this generator does not compile."""


class StopProgram(Exception):
    """Raised by a whole program at a value its loops do not take (a target out of range), before it wrote
    any input: the call is run by the graph op by op instead, which raises PyTorch's error."""


def _last(shape: tuple, stride: tuple) -> int | None:
    """The offset of the last element a layout reaches past its first (None: it has no elements)."""
    if 0 in shape:
        return None
    return sum((n - 1) * s for n, s in zip(shape, stride))


class _Writer:
    """The function's text, value by value."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.lines: list[str] = []
        self.extra: list[tuple[str, object]] = []  # (parameter name, value): the BLAS functions' addresses
        # value -> (the flat buffer it lies in, its first element there), or None: it lies in an input
        self.root: dict[int, tuple[str, int] | None] = {}
        self.size: dict[str, int] = {}  # flat buffer -> its elements
        self.reach: dict[int, int] = {}  # value over an input -> the last element it reaches, from the input's first
        self.origin: dict[int, int] = {}  # value over an input -> that input's index
        self.stored: set[int] = set()  # values a group stored into an input: that input itself, from then on
        self.apart: set[tuple[int, int]] = set()  # (target, input) positions that must share no memory
        self.products: list[int] = []  # the multiply-adds of each product
        self.written: list[int] = []  # input positions written
        self.wrote = False

    # ------------------------------------------------------------------ values

    def layout(self, index: int) -> tuple:
        return self.plan.layouts[index]

    def dtype(self, index: int) -> str:
        name = _DTYPES.get(self.layout(index)[2])
        if name is None:
            raise _Refused
        return name

    def alloc(self, index: int) -> str:
        """A new array for value ``index``, in its traced strides (row-major, or a permutation of it)."""
        shape, stride = self.layout(index)[:2]
        name, dtype = f"v{index}", self.dtype(index)
        order = sorted(range(len(shape)), key=lambda d: -stride[d])  # outermost first
        perm_shape = tuple(shape[d] for d in order)
        if tuple(stride[d] for d in order) != contiguous_strides(perm_shape) and 0 not in shape:
            raise _Refused  # not dense
        if order == list(range(len(shape))) or 0 in shape:
            self.lines.append(f"{name} = np.empty({tuple(shape)!r}, np.{dtype})")
            self.lines.append(f"f{index} = {name}.reshape(-1)")
        else:
            inverse = tuple(order.index(d) for d in range(len(shape)))
            self.lines.append(f"f{index} = np.empty({math.prod(shape)}, np.{dtype})")
            self.lines.append(f"{name} = np.transpose(f{index}.reshape({perm_shape!r}), {inverse!r})")
        self.root[index] = (f"f{index}", 0)
        self.size[f"f{index}"] = math.prod(shape)
        return name

    def ref(self, a) -> int:
        """The index of the plan's tensor argument ``a`` (a ``Ref``), made by an earlier step or an input."""
        return self.known(getattr(a, "index", None))

    def known(self, index) -> int:
        if index is None or index not in self.root:
            raise _Refused
        return index

    def read(self, index: int, shape: tuple, idx: list[str]) -> str:
        """The element of value ``index`` (broadcast to ``shape``) at loop indices ``idx``."""
        own = self.layout(index)[0]
        lead = len(shape) - len(own)
        if lead < 0:
            raise _Refused
        parts = [idx[lead + d] if n != 1 else "0" for d, n in enumerate(own)]
        return f"v{index}[{', '.join(parts)}]" if parts else f"v{index}[()]"

    def loops(self, shape: tuple, body: list[str]) -> list[str]:
        """``body`` in loops over ``shape`` (indices ``i0, i1...``)."""
        out, pad = [], ""
        for d, n in enumerate(shape):
            out.append(f"{pad}for i{d} in range({n}):")
            pad += "    "
        return out + [pad + line for line in body]

    @staticmethod
    def at(index: int, idx: list[str]) -> str:
        return f"v{index}[{', '.join(idx)}]" if idx else f"v{index}[()]"

    # ------------------------------------------------------------------ steps

    def step(self, step) -> None:
        if step.group is not None:
            self.fused(step)
        elif step.writes is not None:
            self.copy(step)
        elif step.expression is not None:
            self.pointwise(step)
        elif "view" in step.tags:
            self.view(step)
        else:
            emit = _OPS.get(step.op)
            if emit is None:
                raise _Refused
            emit(self, step)

    def pointwise(self, step) -> None:
        """A pointwise op alone: its expression in a loop over its output."""
        (out,) = step.outputs
        shape = self.layout(out)[0]
        self.alloc(out)
        idx = [f"i{d}" for d in range(len(shape))]
        body = [f"x{k} = {self.read(self.known(v), shape, idx)}" for k, v in enumerate(step.inputs)]
        body.append(f"{self.at(out, idx)} = {step.expression}")
        self.lines += self.loops(shape, body)

    def fused(self, step) -> None:
        """A fused group: one loop over its shape computing its lines, storing its values (into new arrays or
        the inputs it updates) and adding its reduction in float64."""
        g = step.group
        shape = tuple(g.shape)
        idx = [f"i{d}" for d in range(len(shape))]
        stored = step.outputs[: len(g.outputs)]
        targets = [t for t in step.stores if t is not None]
        if targets:
            self.check_stores(step, targets)
        body = [f"x{k} = {self.read(self.known(v), shape, idx)}" for k, v in enumerate(step.inputs)]
        body += [f"{name} = {expr}" for name, expr in g.lines]
        for v, dst, (name, _) in zip(stored, step.stores, g.outputs):
            if self.layout(v)[:2] != (shape, contiguous_strides(shape)):
                raise _Refused
            if dst is None:
                self.alloc(v)
            body.append(f"{self.at(v if dst is None else dst, idx)} = {name}")
        if g.reduction is not None:
            kind, name, _ = g.reduction
            red = step.outputs[len(g.outputs)]
            out_shape = self.layout(red)[0]
            dims = set(range(len(shape))) if g.dims is None else set(g.dims)
            body.append(f"{self.accumulator(red, out_shape, dims, g.keepdim)} += {name}")
        self.lines += self.loops(shape, body)
        for v, dst in zip(stored, step.stores):
            if dst is not None:  # the value is the tensor it was stored into, from here on
                self.lines.append(f"v{v} = v{dst}")
                self.root[v] = self.root[dst]
                self.origin[v] = dst
                self.reach[v] = self.reach[dst]
                self.stored.add(v)
                self.written.append(self.plan.inputs.index(dst))
                self.wrote = True
        if g.reduction is not None:
            count = math.prod(shape[d] for d in dims)
            self.reduced(red, f"a{red}", f" / {count}" if kind == "mean" else "")

    def accumulator(self, out: int, out_shape: tuple, dims: set, keepdim: bool) -> str:
        """The float64 sums of reduction ``out`` (``a<out>``, zeroed here): the element the loop indices
        ``i0, i1...`` over the reduced tensor add into."""
        nd = len(out_shape) + (0 if keepdim else len(dims))
        kept = [("0" if keepdim else None) if d in dims else f"i{d}" for d in range(nd)]
        kept = [k for k in kept if k is not None]
        if len(kept) != len(out_shape):
            raise _Refused
        self.lines.append(f"a{out} = np.zeros({tuple(out_shape)!r}, np.float64)")
        return f"a{out}[{', '.join(kept)}]" if kept else f"a{out}[()]"

    def reduced(self, out: int, acc: str, scale: str) -> None:
        """Value ``out``, made from the float64 sums ``acc`` of its shape (``scale``: the mean's division)."""
        if self.layout(out)[1] != contiguous_strides(self.layout(out)[0]):
            raise _Refused
        self.alloc(out)
        shape = self.layout(out)[0]
        idx = [f"i{d}" for d in range(len(shape))]
        src = f"{acc}[{', '.join(idx)}]" if idx else f"{acc}[()]"
        self.lines += self.loops(shape, [f"{self.at(out, idx)} = {src}{scale}"])

    def check_stores(self, step, targets: list[int]) -> None:
        """A group may store into inputs of its shape, row-major, that share no memory with what else it reads:
        an input it reads is one of them (read at the element it stores) or another input, whose memory the
        call checks against the target's before the function runs (:attr:`apart`); a view of an input,
        never."""
        for t in targets:
            if t not in self.plan.inputs or self.layout(t)[1] != contiguous_strides(self.layout(t)[0]):
                raise _Refused
            if tuple(self.layout(t)[0]) != tuple(step.group.shape):
                raise _Refused
        for v in step.inputs:
            if self.root.get(v, ()) is not None or v in targets:
                continue  # a value the program made, or a target itself
            if v not in self.plan.inputs:
                raise _Refused
            for t in targets:  # (two tensors over one buffer can be different storages: from_numpy of two views)
                self.apart.add((self.plan.inputs.index(t), self.plan.inputs.index(v)))

    def view(self, step) -> None:
        (out,) = step.outputs
        src = self.ref(step.args[0])
        spec = step.spec
        stride, offset = getattr(spec, "stride", None), getattr(spec, "offset", None)
        if stride is None or offset is None or tuple(spec.shape) != self.layout(out)[0]:
            raise _Refused
        isz = np.dtype(self.dtype(out)).itemsize
        strides = tuple(s * isz for s in stride)
        rel = offset - self.layout(src)[3]  # elements past the source's first element (the offsets are the trace's)
        last = _last(spec.shape, stride)  # the last element the view reaches, past its first (None: empty)
        if any(s < 0 for s in stride):
            raise _Refused
        root = self.root[src]
        if root is not None:  # in a buffer the program made: within it
            flat, start = root
            if start + rel < 0 or (last is not None and start + rel + last >= self.size[flat]):
                raise _Refused
            at = start + rel
            row_major = spec.shape and tuple(stride) == contiguous_strides(tuple(spec.shape))
            if row_major:  # a C array, whose loops vectorize
                n = math.prod(spec.shape)
                self.lines.append(f"v{out} = {flat}[{at}:{at + n}].reshape({tuple(spec.shape)!r})")
            else:
                self.lines.append(
                    f"v{out} = np.lib.stride_tricks.as_strided({flat}[{at}:], {tuple(spec.shape)!r}, {strides!r})"
                )
            self.root[out] = (flat, at)
        elif rel == 0 and (last is None or last <= self.reach[src]):
            # a view of an input from its first element (t, transpose, expand, view...), within the input's
            # own elements: the guards fix the input's layout, not how far its storage goes
            self.lines.append(f"v{out} = np.lib.stride_tricks.as_strided(v{src}, {tuple(spec.shape)!r}, {strides!r})")
            self.root[out] = None
            self.reach[out] = self.reach[src]
            if src in self.origin:
                self.origin[out] = self.origin[src]
        else:
            raise _Refused

    def copy(self, step) -> None:
        if step.op != "_copy_from":
            raise _Refused
        dst, src = self.ref(step.args[0]), self.ref(step.args[1])
        if dst not in self.plan.inputs or self.root[src] is None:
            raise _Refused  # only into an input, from a value the program made (no overlap)
        shape = self.layout(dst)[0]
        idx = [f"i{d}" for d in range(len(shape))]
        self.lines += self.loops(shape, [f"{self.at(dst, idx)} = {self.read(src, shape, idx)}"])
        self.written.append(self.plan.inputs.index(dst))
        self.wrote = True

    def argument(self, name: str, value) -> str:
        """``name``, an argument of the function that is ``value`` on every call (an address: not in the text)."""
        if all(n != name for n, _ in self.extra):
            self.extra.append((name, value))
        return name

    def fallible(self) -> None:
        """The next lines may stop the function: only before any input is written (the graph then reruns)."""
        if self.wrote:
            raise _Refused


def _float_args(w: _Writer, *refs) -> list[int]:
    out = [w.ref(r) for r in refs]
    if any(w.layout(i)[2] not in _FLOATS for i in out) or len({w.layout(i)[2] for i in out}) != 1:
        raise _Refused
    return out


def _product(w: _Writer, out: int, a: int, b: int, alpha, beta) -> None:
    """``out = alpha * a @ b + beta * out`` by the BLAS the eager kernels use. The functions' addresses are
    the program's arguments, never its text: the text (and so the compiled file) is the same in every
    process."""
    dtype = np.dtype(w.dtype(out))
    letter = "s" if dtype == np.float32 else "d"
    m, k = w.layout(a)[0]
    n = w.layout(b)[0][1]
    w.products.append(m * n * k)
    mkl = _mkl.active()
    if mkl is not None:
        if max(m, n, k, m * n) >= 1 << 31:
            raise _Refused  # past MKL's 32-bit sizes
        g, bg = mkl.gemm[dtype]
        names = w.argument(f"mkl_{letter}gemm", g), w.argument(f"mkl_{letter}batch", bg)
        setter = w.argument("mkl_threads", mkl.threads_address)
        # the eager kernels' threads: one below blas_threads_min_macs, else kiln's count at the call
        threads = "threads" if _blas.threaded(m * n * k) else "1"
        call = f"mkl_or_copies({names[0]}, {names[1]}, {setter}, {threads}, {float(alpha)!r}, {float(beta)!r}"
    else:
        found = _blas.gemm_function(dtype)
        if found is None:
            raise _Refused
        address, ilp64 = found
        call = f"blas_product({w.argument(f'blas_{letter}gemm', address)}, {ilp64}, {float(alpha)!r}, {float(beta)!r}"
    w.lines.append(f"{call}, v{a}, v{b}, v{out})")


def _matmul(w: _Writer, step) -> None:
    a, b = _float_args(w, *step.args[:2])
    (out,) = step.outputs
    if len(w.layout(a)[0]) != 2 or len(w.layout(b)[0]) != 2 or w.layout(out)[1] != contiguous_strides(w.layout(out)[0]):
        raise _Refused
    w.alloc(out)
    _product(w, out, a, b, 1, 0)


def _addmm(w: _Writer, step) -> None:
    base, a, b = _float_args(w, *step.args[:3])
    beta, alpha = (list(step.args[3:5]) + [1, 1])[:2]
    (out,) = step.outputs
    shape = w.layout(out)[0]
    if type(beta) not in (int, float) or type(alpha) not in (int, float) or len(w.layout(a)[0]) != 2:
        raise _Refused
    if w.layout(out)[1] != contiguous_strides(shape):
        raise _Refused
    w.alloc(out)
    if beta != 0:  # the input, broadcast, which the product adds beta times
        idx = [f"i{d}" for d in range(len(shape))]
        w.lines += w.loops(shape, [f"{w.at(out, idx)} = {w.read(base, shape, idx)}"])
    _product(w, out, a, b, alpha, beta)


def _reduce(w: _Writer, step, mean: bool) -> None:
    (x,) = _float_args(w, step.args[0])
    dims, keepdim = (list(step.args[1:3]) + [None, False])[:2]
    (out,) = step.outputs
    if len(step.args) > 3 and step.args[3] is not None:
        raise _Refused  # a dtype= argument
    shape = w.layout(x)[0]
    nd = len(shape)
    if dims is None or (isinstance(dims, tuple) and not dims):
        dims = tuple(range(nd))
    # (a 0-d input takes dim 0 or -1 and reduces nothing)
    dims = {d % nd for d in (dims if isinstance(dims, tuple) else (dims,))} if nd else set()
    out_shape = w.layout(out)[0]
    if w.layout(out)[1] != contiguous_strides(out_shape) or w.layout(out)[2] != w.layout(x)[2]:
        raise _Refused
    idx = [f"i{d}" for d in range(nd)]
    count = math.prod(shape[d] for d in dims)
    acc = w.accumulator(out, out_shape, dims, keepdim)
    w.lines += w.loops(shape, [f"{acc} += {w.at(x, idx)}"])
    w.reduced(out, f"a{out}", f" / {count}" if mean else "")


def _rows(w: _Writer, *indices) -> tuple[int, int]:
    shapes = {w.layout(i)[0] for i in indices}
    if len(shapes) != 1:
        raise _Refused
    shape = shapes.pop()
    if len(shape) != 2:
        raise _Refused
    return shape


def _log_softmax(w: _Writer, step) -> None:
    (x,) = _float_args(w, step.args[0])
    (out,) = step.outputs
    rows, n = _rows(w, x, out)
    if step.args[1] not in (1, -1):
        raise _Refused
    w.alloc(out)
    if not n:
        return  # (no classes: nothing to compute)
    w.lines += [  # (x - max) - log(sum(exp(x - max))), in that order: exact for large logits too
        f"for r in range({rows}):",
        f"    m = v{x}[r, 0]",
        f"    for j in range(1, {n}):",
        f"        if v{x}[r, j] > m:",
        f"            m = v{x}[r, j]",
        "    s = 0.0",
        f"    for j in range({n}):",
        f"        s += np.exp(np.float64(v{x}[r, j] - m))",
        "    c = np.log(s)",
        f"    for j in range({n}):",
        f"        v{out}[r, j] = (v{x}[r, j] - m) - c",
    ]


def _log_softmax_backward(w: _Writer, step) -> None:
    g, y = _float_args(w, *step.args[:2])
    (out,) = step.outputs
    rows, n = _rows(w, g, y, out)
    if step.args[2] not in (1, -1):
        raise _Refused
    w.alloc(out)
    w.lines += [
        f"for r in range({rows}):",
        "    s = 0.0",
        f"    for j in range({n}):",
        f"        s += v{g}[r, j]",
        f"    for j in range({n}):",
        f"        v{out}[r, j] = v{g}[r, j] - np.exp(v{y}[r, j]) * s",
    ]


def _nll_args(w: _Writer, step, first: int) -> tuple:
    x = w.ref(step.args[first])
    t = w.ref(step.args[first + 1])
    weight, ignore, reduction = (list(step.args[first + 2 :]) + [None, -100, "mean"])[:3]
    if weight is not None or reduction not in ("mean", "sum") or type(ignore) is not int:
        raise _Refused
    if w.layout(x)[2] not in _FLOATS or w.layout(t)[2] is not kiln.int64 or len(w.layout(t)[0]) != 1:
        raise _Refused
    rows, n = _rows(w, x)
    if w.layout(t)[0] != (rows,):
        raise _Refused
    return x, t, ignore, reduction, rows, n


def _count(w: _Writer, out: int, t: int, ignore: int, rows: int, n: int) -> None:
    """The array of an nll step's ``out``, then ``k``: how many targets are not ``ignore``, stopping the
    function (:class:`StopProgram`) at one out of range, before any input is written."""
    w.fallible()
    w.alloc(out)
    w.lines += [
        "k = 0",
        f"for r in range({rows}):",
        f"    c = v{t}[r]",
        f"    if c != {ignore}:",
        f"        if c < 0 or c >= {n}:",
        "            raise StopProgram()",
        "        k += 1",
    ]


def _nll(w: _Writer, step) -> None:
    x, t, ignore, reduction, rows, n = _nll_args(w, step, 0)
    (out,) = step.outputs
    if w.layout(out)[0] != ():
        raise _Refused
    _count(w, out, t, ignore, rows, n)
    w.lines += [
        "s = 0.0",
        f"for r in range({rows}):",
        f"    if v{t}[r] != {ignore}:",
        f"        s -= v{x}[r, v{t}[r]]",
        f"v{out}[()] = s / k if {reduction == 'mean'} else s",
    ]


def _nll_backward(w: _Writer, step) -> None:
    g = w.ref(step.args[0])
    x, t, ignore, reduction, rows, n = _nll_args(w, step, 1)
    (out,) = step.outputs
    if w.layout(g)[0] != () or w.layout(g)[2] is not w.layout(x)[2]:
        raise _Refused
    _count(w, out, t, ignore, rows, n)
    w.lines += [
        f"q = -v{g}[()] / k if {reduction == 'mean'} else -v{g}[()]",
        f"v{out}[...] = 0",
        f"for r in range({rows}):",
        f"    if v{t}[r] != {ignore}:",
        f"        v{out}[r, v{t}[r]] = q",
    ]


def _to_copy(w: _Writer, step) -> None:
    """A copy into another dtype on the same device (an optimizer's step count read as float64)."""
    x = w.ref(step.args[0])
    (out,) = step.outputs
    device = getattr(step.spec, "device", None)
    if device is None or device.type != "cpu" or w.layout(out)[0] != w.layout(x)[0]:
        raise _Refused
    w.dtype(x)
    w.alloc(out)
    shape = w.layout(out)[0]
    idx = [f"i{d}" for d in range(len(shape))]
    w.lines += w.loops(shape, [f"{w.at(out, idx)} = {w.read(x, shape, idx)}"])


_OPS = {
    "_to_copy": _to_copy,
    "matmul": _matmul,
    "addmm": _addmm,
    "sum": lambda w, s: _reduce(w, s, False),
    "mean": lambda w, s: _reduce(w, s, True),
    "_log_softmax": _log_softmax,
    "_log_softmax_backward_data": _log_softmax_backward,
    "_nll_loss": _nll,
    "_nll_loss_backward": _nll_backward,
}


def _text(plan) -> tuple[str, _Writer] | None:
    w = _Writer(plan)
    try:
        for index in (*plan.inputs, *plan.constants):
            w.dtype(index)
            w.root[index] = None
            shape, stride = w.layout(index)[:2]
            w.reach[index] = _last(shape, stride) or 0
        for index in plan.inputs:
            w.origin[index] = index
        for step in plan.steps:
            w.step(step)
        made = [k for k in plan.outputs if w.root.get(k) is not None]
        for k in plan.outputs:  # an output over an input is made from it after the call (a tensor view)
            if w.root.get(k) is None and k not in w.origin:
                raise _Refused  # (a constant's view)
        made += [k for _, k in plan.grads if k is not None]
        roots = [w.root.get(k) for k in made]
        if any(r is None for r in roots) or len({r[0] for r in roots}) != len(roots):
            raise _Refused  # a gradient over an input, or two results in one buffer
        for k, (flat, start) in zip(made, roots):
            shape, stride = w.layout(k)[:2]
            if start != 0 or stride != contiguous_strides(shape) or math.prod(shape) != w.size[flat]:
                raise _Refused  # a view of a buffer returned: eager returns the view, in its own strides
    except Exception:  # noqa: BLE001 - _Refused, or a plan this writer gets wrong: the default program runs it
        return None
    params = [f"v{i}" for i in (*plan.inputs, *plan.constants)] + [name for name, _ in w.extra] + ["threads"]
    results = "".join(f"v{k}, " for k in made)
    lines = [f"@njit({FLAGS})", f"def program({', '.join(params)}):"]
    lines += ["    " + line for line in [*w.lines, f"return ({results})"]]
    return "\n".join(lines), w


def _example(index: int, plan) -> np.ndarray:
    """An array of input ``index``'s traced shape, strides and dtype (what a call passes: its type)."""
    shape, stride, dtype = plan.layouts[index][:3]
    np_dtype = np.dtype(_DTYPES[dtype].rstrip("_"))
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0) if 0 not in shape else 0
    return np.lib.stride_tricks.as_strided(
        np.empty(max(span, 1), np_dtype), shape, [s * np_dtype.itemsize for s in stride]
    )


def program(plan):
    """The native function of ``plan`` (a kiln.compile ``WholeProgram``) wrapped as
    ``run(*inputs) -> tuple of outputs``, or None where some step is not one this module compiles."""
    made = _text(plan)
    if made is None:
        return None
    text, w = made
    source = module_text(
        [text.splitlines()],
        origin="kiln_cpu.whole) for a kiln.compile whole program",
        helpers=(*_HELPERS, "_jit_gemm.py"),
        imports=(
            "from kiln_cpu._jit_gemm import blas_product, mkl_or_copies",
            "from kiln_cpu.whole import StopProgram",
        ),
    )
    mod = generated_module(source, cache_dir(), "kiln_cpu_whole")
    fn = mod.program
    constants = [host_view(t) for t in plan.constants.values()] + [value for _, value in w.extra]
    try:  # compiled now, for arrays of the traced layouts: code Numba refuses leaves the default program
        examples = [*map(_example, plan.inputs, [plan] * len(plan.inputs)), *constants, 1]
        fn.compile(tuple(numba.typeof(a) for a in examples))
    except Exception:  # noqa: BLE001 - any refusal of Numba's (typing, lowering) means: not this way
        return None
    # per output: ("made", dtype) for an array the function returns, ("input", position) for an input itself,
    # ("view", position, shape, strides, storage offset) for a view of one (made as eager makes it: a tensor view)
    outputs = []
    for k in plan.outputs:
        shape, stride, dtype, offset = plan.layouts[k]
        if w.root.get(k) is not None:
            outputs.append(("made", dtype))
        else:
            pos = plan.inputs.index(w.origin[k])
            same = k == w.origin[k] or k in w.stored  # (a view of an input is a new tensor, as eagerly)
            outputs.append(("input", pos) if same else ("view", pos, shape, stride, offset))
    grads = [(pos, k, None if k is None else plan.layouts[k][2]) for pos, k in plan.grads]
    written = tuple(w.written)
    apart = tuple(sorted(w.apart))
    reference = plan.reference
    largest = max(w.products) if w.products and _mkl.active() is None else None

    def run(*tensors):
        arrays = [host_view(t) for t in tensors]
        for a, b in apart:
            if np.may_share_memory(arrays[a], arrays[b]):  # a store would change what the loop reads after it
                return reference(*tensors)
        threads = _threads.get_num_threads()
        try:
            # OpenBLAS's thread count as the eager kernel of the largest product sets it (MKL's: per product)
            with _blas.limit(None if largest is None else _blas.threads_for(largest)):
                values = fn(*arrays, *constants, threads)
        except StopProgram:  # before any write: the graph op by op raises PyTorch's error
            return reference(*tensors)
        for pos in written:
            mark_written(tensors[pos])
        out = []
        j = 0
        for kind, *rest in outputs:
            if kind == "made":
                out.append(from_array(values[j], rest[0]))
                j += 1
            elif kind == "input":
                out.append(tensors[rest[0]])
            else:
                out.append(tensors[rest[0]].as_strided(*rest[1:]))
        for pos, k, dtype in grads:
            if k is None:
                tensors[pos].grad = None
            else:
                tensors[pos].grad = from_array(values[j], dtype)
                j += 1
        return tuple(out)

    run.source = text
    return run
