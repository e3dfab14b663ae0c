"""The kernels kiln-cpu registers: layout analysis in Python, loops in Numba (:mod:`kiln_cpu._jit`).

Each kernel has the reference kernel's contract (``kernel(spec, *args)`` returning a CPU tensor) and
hands a call back to the reference kernel whenever it would not be faster or not be identical: small
outputs (:data:`kiln_cpu.config.min_numel`), operands whose dtype differs from the compute dtype (the
reference casts them), and layouts the Numba loops do not take (more than 4 dims after merging).
"""

from __future__ import annotations

import functools
import importlib
import math
import sys

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import Tensor, from_array
from kiln_cpu import _threads, config

FLOAT = (dt.float32, dt.float64)
ARITH = (dt.float32, dt.float64, dt.int32, dt.int64)
HALF = (dt.float16, dt.bfloat16)  # in the order of the Numba loops' codes _jit.F16, _jit.BF16
_F32 = np.dtype(np.float32)


def loops(module: str):
    """A getter of the Numba module ``kiln_cpu.<module>`` (its jitted loops), imported on the getter's first
    call: building the kernel table, ``import kiln`` and ``import kiln_cpu`` import no Numba."""
    name = f"kiln_cpu.{module}"

    def get():
        found = sys.modules.get(name)
        return found if found is not None else importlib.import_module(name)

    return get


def with_fallback(name: str, body):
    """A kernel for op ``name`` that runs ``body(spec, *args)`` and hands the call to the reference kernel
    when ``body`` returns None (not taken)."""
    reference = wrap_reference(OPS[name])

    def kernel(spec, *args):
        out = body(spec, *args)
        return reference(spec, *args) if out is None else out

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


_kernels = loops("_jit")


_GRAIN = 1 << 18
"""Elements per thread at least: a job on the thread team costs 20-40 us (:mod:`kiln_cpu._threads`),
about what one thread needs to add 64K-128K float32 elements, and a worker that spins steals a core from
BLAS's own threads (a small CNN's training step: 19.9 ms with 256K elements per thread, 21.3 ms with
64K). With a plain thread pool, whose wake-up took 75-95 us here, 32K elements per thread made an add of
800K elements slower on two threads (358 us) than on one (317 us)."""
parallel = _threads.parallel


# ------------------------------------------------------------------------------------------ layouts


def _flat(a: np.ndarray) -> np.ndarray | None:
    """A 1-d view of a dense array (any dim order, positive strides) in memory order, else None."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    order = sorted(range(a.ndim), key=lambda i: -a.strides[i])
    t = a.transpose(order)
    return t.reshape(-1) if t.flags.c_contiguous else None


def _coalesce(shape: tuple, strides: list[tuple]) -> tuple[tuple, list[tuple]] | None:
    """Merge dims that are contiguous in every operand and drop size-1 dims; pad to 4 dims in front.
    None when more than 4 dims remain."""
    dims: list[tuple[int, list[int]]] = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[i] for s in strides]
        if dims:
            pn, pst = dims[-1]
            if all(ps == s * n for ps, s in zip(pst, st)):
                dims[-1] = (pn * n, st)
                continue
        dims.append((n, st))
    if len(dims) > 4:
        return None
    dims = [(1, [0] * len(strides))] * (4 - len(dims)) + dims
    return tuple(n for n, _ in dims), [tuple(d[1][k] for d in dims) for k in range(len(strides))]


def _scalar(x, np_dtype: np.dtype, d: dt.dtype | None = None):
    """A Python number as the reference uses it in compute dtype ``np_dtype`` (integers wrap; a float
    meeting a half-precision tensor ``d`` is rounded to that precision first)."""
    if np_dtype.kind in "iu":
        return np.array(x).astype(np_dtype)[()]
    if d in HALF and isinstance(x, float):
        with np.errstate(over="ignore"):  # beyond the half range: inf, as the reference
            return np_dtype.type(np.array(x, dtype=d.numpy))
    return np_dtype.type(x)


def half_kind(d: dt.dtype) -> int:
    """The Numba loops' code for half-precision storage dtype ``d`` (``_jit.F16``/``BF16``), else 0."""
    if d is dt.float16:
        return _kernels().F16
    return _kernels().BF16 if d is dt.bfloat16 else 0


def bits(a: np.ndarray) -> np.ndarray:
    """A float16/bfloat16 array as its uint16 bits (what the Numba loops take), any other array as is."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind in "fV" else a


# ------------------------------------------------------------------------------------------- binary

# scalar-on-the-left forms that are the same op with the operands swapped
_SWAPPED = {}


def _init_swapped(j) -> None:
    _SWAPPED.update(
        {j.ADD: j.ADD, j.MUL: j.MUL, j.EQ: j.EQ, j.NE: j.NE, j.LT: j.GT, j.GT: j.LT, j.LE: j.GE, j.GE: j.LE}
    )


def _operand(x, shape: tuple) -> tuple:
    """(storage, offset, strides in elements broadcast to ``shape``) of a tensor or a NumPy scalar."""
    if isinstance(x, Tensor):
        buf, off, xs, xst = bits(x._storage), x._offset, x._shape, x._stride
    else:
        buf, off, xs, xst = np.array([x]), 0, (), ()
    pad = len(shape) - len(xs)
    strides = (0,) * pad + tuple(0 if n == 1 else s for n, s in zip(xs, xst))
    return buf, off, strides


def _run_strided(get_kernel, shape: tuple, operands: list, out_np: np.dtype, extra: tuple = (), order=None):
    """Run the strided loop ``get_kernel()`` as ``kernel(*(storage, offset, strides4) per operand, out,
    out_strides4, shape4, *extra, lo, hi)`` over tasks of up to ``_jit._BLOCK`` innermost elements, into
    a new array of ``shape`` laid out as NumPy (and PyTorch) lay out a result of the operands (or in dim
    ``order``, outermost first, where given); None (nothing run) if more than 4 dims remain after
    merging."""
    ops = [_operand(x, shape) for x in operands]
    if order is None:
        order = numpy_order(shape, [o[2] for o in ops])
    dense = np.empty([shape[d] for d in order], out_np)
    out = dense.transpose(np.argsort(order))
    if dense.size:
        out_strides = tuple(s // dense.itemsize for s in out.strides)
        merged = _coalesce(shape, [out_strides] + [o[2] for o in ops])
        if merged is None:
            return None
        shape4, (so, *strides4) = merged
        args = []
        for (buf, off, _), st in zip(ops, strides4):
            args += [buf, off, st]
        block = _kernels()._BLOCK
        tasks = shape4[0] * shape4[1] * shape4[2] * -(-shape4[3] // block)
        kernel_args = (*args, dense.reshape(-1), so, shape4, *extra)
        parallel(get_kernel(), kernel_args, tasks, max(1, _GRAIN // min(shape4[3], block)))
    return out


def numpy_order(shape: tuple, strides: list[tuple]) -> list[int]:
    """The dims of a new result, outermost first, as NumPy's iterator orders them (PyTorch's TensorIterator
    agrees in the cases that matter: a result follows the layout of its dense operands). NumPy's
    insertion sort, innermost dim first: a dim moves inward past another when every operand strided in
    both (stride 0 or size 1: no opinion) has the other's stride larger, and jumps over dims where no
    operand has an opinion."""
    nd = len(shape)
    st = [[0 if shape[d] == 1 else s[d] for d in range(nd)] for s in strides]
    perm = list(range(nd - 1, -1, -1))  # innermost first
    for i0 in range(1, nd):
        j0 = perm[i0]
        pos = i0
        for i1 in range(i0 - 1, -1, -1):
            j1 = perm[i1]
            ambiguous, swap = True, False
            for s in st:
                if s[j0] != 0 and s[j1] != 0:
                    if abs(s[j1]) <= abs(s[j0]):
                        swap = False
                    elif ambiguous:
                        swap = True
                    ambiguous = False
            if not ambiguous:
                if not swap:
                    break
                pos = i1
        if pos != i0:
            perm.insert(pos, perm.pop(i0))
    return perm[::-1]


def dense_strides(shape: tuple, order: list) -> tuple:
    """The strides of a new dense array of ``shape`` laid out in dim ``order`` (outermost first): what an
    intermediate result of NumPy's brings to the layout of the next step."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _run_binary(code: int, a, b, c, shape: tuple, out_np: np.dtype, half: int) -> np.ndarray | None:
    """``a <op> b`` over ``shape`` (``a``/``b``: tensors of the compute dtype, or of a half-precision dtype
    computed in float32 (``half``), or scalars of the compute dtype) into a new array of ``out_np``
    (uint16 for half-precision results); None: not taken."""
    j = _kernels()
    a_arr = isinstance(a, Tensor)
    b_arr = isinstance(b, Tensor)
    if not _SWAPPED:
        _init_swapped(j)
    if not a_arr and b_arr and code in _SWAPPED:
        code, a, b, a_arr, b_arr = _SWAPPED[code], b, a, True, False
    if a_arr and a._shape == shape:
        x = bits(a._numpy())
        fa = _flat(x)
        if fa is not None and (not b_arr or (b._shape == shape and b._stride == a._stride)):
            out = np.empty_like(x, dtype=out_np)
            fo = _flat(out)
            if fo is not None:
                if b_arr:
                    parallel(j.binary(code, "flat", half), (fa, _flat(bits(b._numpy())), fo, c), fo.size, _GRAIN)
                else:
                    parallel(j.binary(code, "scalar", half), (fa, b, fo, c), fo.size, _GRAIN)
                return out
    if half:  # the strided loop reads a scalar operand as stored: half-precision bits, if it has them
        operands = []
        for x in (a, b):
            if not isinstance(x, Tensor):
                with np.errstate(over="ignore"):
                    stored = x.astype(HALF[half - 1].numpy)
                if stored.astype(np.float32) != x and x == x:
                    return None  # a float32 scalar (mul, div) that the storage dtype cannot hold
                x = stored.view(np.uint16)
            operands.append(x)
        a, b = operands
    return _run_strided(lambda: j.binary(code, "strided", half), shape, [a, b], out_np, (c,))


def _binary_kernel(name: str, served: tuple, pick, *, compare: bool = False):
    """A kernel for binary op ``name``: ``pick(np_dtype, a, b, rest) -> (code, a, b, c)`` chooses the op
    code and may fold scalars; the reference runs whatever this kernel does not take."""
    reference = wrap_reference(OPS[name])

    def kernel(spec, a, b, *rest):
        shape = spec[0]
        d = spec[3] if compare else spec[1]
        if d not in served or math.prod(shape) < config.min_numel:
            return reference(spec, a, b, *rest)
        half = half_kind(d)
        if half and name in ("add", "sub") and rest and rest[0] != 1:  # alpha: the reference's roundings
            return reference(spec, a, b, *rest)
        np_dtype = _F32 if half else d.numpy
        for x in (a, b):
            if isinstance(x, Tensor) and x._dtype is not d:
                return reference(spec, a, b, *rest)
        picked = pick(np_dtype, a, b, rest)
        if picked is None:
            return reference(spec, a, b, *rest)
        code, x, y, c = picked
        rounded = None if name in ("mul", "div") else d  # PyTorch's mul and div keep a scalar in float32
        if not isinstance(x, Tensor):
            x = _scalar(x, np_dtype, rounded)
        if not isinstance(y, Tensor):
            y = _scalar(y, np_dtype, rounded)
        out_np = spec[1].numpy
        out = _run_binary(code, x, y, c, shape, np.dtype(np.uint16) if half and not compare else out_np, half)
        if out is None:
            return reference(spec, a, b, *rest)
        return from_array(out.view(out_np), spec[1])

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


def _zero(np_dtype):
    return np_dtype.type(0)


def _pick_fixed(code_name: str):
    def pick(np_dtype, a, b, rest):
        return getattr(_kernels(), code_name), a, b, _zero(np_dtype)

    return pick


def _pick_add_sub(plain: str, with_alpha: str):
    def pick(np_dtype, a, b, rest):
        j = _kernels()
        alpha = rest[0] if rest else 1
        if alpha == 1:
            return getattr(j, plain), a, b, _zero(np_dtype)
        if isinstance(alpha, bool) or (np_dtype.kind in "iu" and not isinstance(alpha, int)):
            return None  # the meta refuses these; the reference raises as it does
        c = _scalar(alpha, np_dtype)
        if not isinstance(b, Tensor):  # the reference rounds b * alpha first: fold it the same way
            return getattr(j, plain), a, np.multiply(_scalar(b, np_dtype), c, dtype=np_dtype), _zero(np_dtype)
        return getattr(j, with_alpha), a, b, c

    return pick


def _pick_div(np_dtype, a, b, rest):
    j = _kernels()
    mode = rest[0] if rest else None
    code = {None: j.DIV, "floor": j.FLOOR_DIV, "trunc": j.TRUNC_DIV}.get(mode)
    return None if code is None else (code, a, b, _zero(np_dtype))


# -------------------------------------------------------------------------------------------- unary


def _unary_kernel(name: str, served: tuple, code_name, params: dict | None = None):
    """A kernel for unary op ``name`` (Numba op ``code_name``), output dtype = input dtype; an op with
    parameters maps each value it takes to its own code (``params``: (value, ...) -> code name)."""
    reference = wrap_reference(OPS[name])

    def kernel(spec, a, *rest):
        d = spec[1]
        name_of_code = code_name if not rest else (params or {}).get(rest)
        if d not in served or name_of_code is None or math.prod(spec[0]) < config.min_numel:
            return reference(spec, a, *rest)
        if a._dtype is not d:
            return reference(spec, a, *rest)
        x = bits(a._numpy())
        j = _kernels()
        code, half = getattr(j, name_of_code), half_kind(d)
        fx = _flat(x)
        if fx is not None:
            out = np.empty_like(x)
            fo = _flat(out)
            if fo is not None:
                parallel(j.unary(code, "flat", half), (fx, fo), fo.size, _GRAIN)
                return from_array(out.view(d.numpy), d)
        out = _run_strided(lambda: j.unary(code, "strided", half), a._shape, [a], x.dtype)
        return reference(spec, a, *rest) if out is None else from_array(out.view(d.numpy), d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


# --------------------------------------------------------------------------------------- conversion

_INTS = (dt.int32, dt.int64)


def _converts(src: dt.dtype, dst: dt.dtype) -> bool:
    """The conversions the Numba loop makes exactly as NumPy's ``astype`` does: between float32, float64
    and the integers (and bools: dropout's masks) into floats; into float16/bfloat16 only from float32,
    half precision or bool (one rounding; NumPy rounds float64 and integers to half directly, not through
    float32); into integers only from integers and bools (a float out of an integer's range is undefined
    in C, and NumPy's result is the hardware's)."""
    if dst in HALF:
        return src is dt.float32 or src in HALF or src is dt.bool
    if dst in _INTS:
        return src in _INTS or src is dt.bool
    return dst in FLOAT and (src in FLOAT or src in HALF or src in _INTS or src is dt.bool)


def cast_flat(x: np.ndarray, out: np.ndarray, hin: int, hout: int) -> np.ndarray:
    """Convert the 1-d array ``x`` into ``out`` (same size) over the threads, as NumPy's ``astype``
    converts; ``hin``/``hout``: :func:`half_kind` of a half-precision side, whose arrays hold its uint16
    bits. Returns ``out``."""
    parallel(_kernels().cast("flat", hin, hout), (x, out), x.size, _GRAIN)
    return out


def _widened(t: Tensor) -> Tensor | None:
    """The float16/bfloat16 tensor ``t`` as a new float32 tensor in its own layout (exact, as the
    reference's ``astype`` widens it); None unless its elements fill one block of memory."""
    x = bits(t._numpy())
    fx = _flat(x) if 0 not in x.strides else None
    if fx is None:
        return None
    out = np.empty_like(x, dtype=_F32)  # "K" order: the same layout
    cast_flat(fx, _flat(out), half_kind(t._dtype), 0)
    return from_array(out, dt.float32)


def _rounded(t: Tensor, d: dt.dtype) -> Tensor:
    """The float32 result ``t`` rounded once to half precision ``d`` (nearest-even), in its layout."""
    x = t._numpy()
    fx = _flat(x)
    if fx is None:  # not dense: NumPy's conversion (the reference's own)
        return from_array(x, d)
    out = np.empty_like(x, dtype=np.uint16)
    cast_flat(fx, _flat(out), 0, half_kind(d))
    return from_array(out.view(d.numpy), d)


def through_float32(name: str, kernel):
    """Kernel ``kernel`` (float32/float64 loops) for op ``name`` extended to float16/bfloat16 the way the
    reference computes those: each half-precision tensor operand widened to float32 in its layout, the
    float32 kernel on a spec whose half-precision results are float32, each such result rounded back
    once. The reference runs where an operand's elements do not fill one block of memory, and where no
    operand reaches :data:`kiln_cpu.config.multipass_min_numel` elements (the float32 loops would hand
    those back after the widening)."""
    opdef = OPS[name]
    reference = wrap_reference(opdef)
    multi = opdef.num_outputs > 1

    def wrapped(spec, *args):
        specs = spec if multi else (spec,)
        halves = [s[1] if s[1] in HALF else None for s in specs]
        if not any(halves) and not any(isinstance(a, Tensor) and a._dtype in HALF for a in args):
            return kernel(spec, *args)
        work = max(math.prod(a._shape) for a in args if isinstance(a, Tensor))
        if config.too_small(work, multipass=True):  # no widening where the loops would hand back anyway
            return reference(spec, *args)
        wide = []
        for a in args:
            if isinstance(a, Tensor) and a._dtype in HALF:
                a = _widened(a)
                if a is None:
                    return reference(spec, *args)
            wide.append(a)
        specs32 = [s if h is None else (s[0], dt.float32, *s[2:]) for s, h in zip(specs, halves)]
        out = kernel(tuple(specs32) if multi else specs32[0], *wide)
        outs = out if multi else (out,)
        outs = [o if h is None else _rounded(o, h) for o, h in zip(outs, halves)]
        return tuple(outs) if multi else outs[0]

    wrapped.__name__ = getattr(kernel, "__name__", f"kiln_cpu_{name}")
    wrapped.__doc__ = f"{kernel.__doc__} float16/bfloat16 through the float32 kernel."
    return wrapped


def _to_copy_kernel():
    reference = wrap_reference(OPS["_to_copy"])

    def kernel(spec, a, dtype, device):
        if (
            device is not a._device
            or not _converts(a._dtype, dtype)
            or a._dtype is dtype
            or not a._shape
            or math.prod(a._shape) < max(config.min_numel, 1)
        ):
            return reference(spec, a, dtype, device)
        j = _kernels()
        hin, hout = half_kind(a._dtype), half_kind(dtype)
        store_np = np.dtype(np.uint16) if hout else dtype.numpy
        x = bits(a._numpy())
        fx = _flat(x) if 0 not in x.strides else None
        if fx is not None:
            out = np.empty_like(x, dtype=store_np)
            cast_flat(fx, _flat(out), hin, hout)
        else:
            out = _run_strided(lambda: j.cast("strided", hin, hout), a._shape, [a], store_np)
            if out is None:
                return reference(spec, a, dtype, device)
        return from_array(out.view(dtype.numpy), dtype)

    kernel.__name__ = "kiln_cpu__to_copy"
    kernel.__doc__ = "Numba kernel for dtype conversion on the CPU (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ dropout


def _fused_dropout_kernel():
    reference = wrap_reference(OPS["_fused_dropout"])

    def kernel(spec, x, u, p):
        d = spec[0][1]
        n = math.prod(x._shape)
        if d not in FLOAT + HALF or x._dtype is not d or n < max(config.min_numel, 1):
            return reference(spec, x, u, p)
        xs, us = bits(x._numpy()), u._numpy()
        if not (xs.flags.c_contiguous and us.flags.c_contiguous):  # the reference's result follows layouts
            return reference(spec, x, u, p)
        half = half_kind(d)
        compute = _F32 if half else d.numpy
        out = np.empty(n, xs.dtype)
        noise = np.empty(n, xs.dtype)
        args = (xs.reshape(-1), us.reshape(-1), 1.0 - p, compute.type(1.0 - p), out, noise)
        parallel(_kernels().dropout(half), args, n, _GRAIN)
        shape = x._shape
        return from_array(out.view(d.numpy).reshape(shape), d), from_array(noise.view(d.numpy).reshape(shape), d)

    kernel.__name__ = "kiln_cpu__fused_dropout"
    kernel.__doc__ = "Numba kernel for _fused_dropout: draws compared, scaled and applied in one pass (kiln-cpu)."
    return kernel


# --------------------------------------------------------------------------------------- reductions


def _merge(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(size, stride) pairs, outermost first: size-1 dims dropped, contiguous neighbours merged."""
    out: list[tuple[int, int]] = []
    for n, s in dims:
        if n == 1:
            continue
        if out and out[-1][1] == s * n:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out


def _subtrees(lo: int, n: int, depth: int, acc: list) -> None:
    """The (start, length) of NumPy's pairwise-summation subtrees ``depth`` levels down, in order."""
    if depth == 0 or n <= 1024:
        acc.append((lo, n))
        return
    n2 = n // 2
    n2 -= n2 % 8
    _subtrees(lo, n2, depth - 1, acc)
    _subtrees(lo + n2, n - n2, depth - 1, acc)


def _combine(vals: list, n: int, depth: int, join):
    """Fold subtree results in NumPy's tree order (consumes ``vals`` from the front)."""
    if depth == 0 or n <= 1024:
        return vals.pop(0)
    n2 = n // 2
    n2 -= n2 % 8
    left = _combine(vals, n2, depth - 1, join)
    return join(left, _combine(vals, n - n2, depth - 1, join))


_INT_VIEW = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_TREE_DEPTH = 4  # 16 subtrees: enough tasks to balance the threads


@functools.lru_cache(maxsize=64)
def _subtree_plan(n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts and lengths of :func:`_subtrees` of ``n`` elements, ``depth`` levels down, built once
    for every reduction of that many (shared: the kernels only read them; flagging them read-only would
    compile each kernel again for read-only arrays)."""
    segs: list = []
    _subtrees(0, n, depth, segs)
    los = np.array([s[0] for s in segs], np.int64)
    ns = np.array([s[1] for s in segs], np.int64)
    return los, ns


def _reduce_all(j, code: int, a: np.ndarray, off: int = 0, n: int | None = None, st: int = 1):
    """Reduce ``a[off + i*st]``, i < n (all of the 1-d ``a`` by default), to a NumPy scalar: NumPy's one
    pairwise tree over the run, its subtrees in parallel."""
    n = a.shape[0] if n is None else n
    los, ns = _subtree_plan(n, _TREE_DEPTH)
    part = np.empty(len(los), a.dtype)
    grain = max(1, len(los) * _GRAIN // max(n, 1))
    if code != j.SUM and st == 1:  # max/min of a dense run: the vectorised folds of the integer view
        ints, part_ints = a[off : off + n].view(_INT_VIEW[a.dtype]), part.view(_INT_VIEW[a.dtype])
        parallel(j.reduce(code, "segments-contiguous"), (ints, los, ns, part_ints), len(los), grain)
    else:
        parallel(j.reduce(code, "segments"), (a, off, st, los, ns, part), len(los), grain)
    join = {j.SUM: np.add, j.AMAX: np.maximum, j.AMIN: np.minimum}[code]
    vals = list(part)
    res = _combine(vals, n, _TREE_DEPTH, join)
    return np.add(a.dtype.type(0), res) if code == j.SUM else res


def _run_reduce(code: int, t: Tensor, dims: tuple, keepdim: bool) -> np.ndarray:
    """Reduce ``t`` over ``dims`` into a new array laid out as NumPy lays out the result (the kept dims
    in the input's stride order)."""
    j = _kernels()
    buf, off, shape, strides = t._storage, t._offset, t._shape, t._stride
    keep_idx = [i for i in range(len(shape)) if i not in dims]
    keep_idx = [keep_idx[i] for i in numpy_order([shape[i] for i in keep_idx], [[strides[i] for i in keep_idx]])]
    red_idx = sorted(dims, key=lambda i: -abs(strides[i]))
    kept = _merge([(shape[i], strides[i]) for i in keep_idx])
    red = _merge([(shape[i], strides[i]) for i in red_idx])
    flat_out = np.empty(math.prod(shape[i] for i in keep_idx), buf.dtype)
    # the result: the kept dims back in their places (a view), reduced dims as size 1 for keepdim
    out = flat_out.reshape([shape[i] for i in keep_idx]).transpose(np.argsort(keep_idx))
    if keepdim:
        out = np.expand_dims(out, tuple(dims))
    if not kept:
        if len(red) <= 1:  # one run, dense or strided (x[:, ::2] of a contiguous x), or one element
            flat_out[0] = _reduce_all(j, code, buf, off, t.numel(), red[0][1] if red else 1)
            return out
        if len(red) == 2:  # a sliced matrix: its rows, then the row results
            (n0, s0), (n1, s1) = red
            flat = np.empty(n0, buf.dtype)
            parallel(j.reduce(code, "rows"), (buf, off, s0, n1, s1, flat), n0, max(1, _GRAIN // n1))
        else:
            flat = np.ascontiguousarray(t._numpy()).reshape(-1)
        flat_out[0] = _reduce_all(j, code, flat)
        return out
    if len(kept) == 1 and len(red) == 1:
        (nk, sk), (nr, sr) = kept[0], red[0]
        if sk == 1 and sr != 1:
            parallel(j.reduce(code, "cols"), (buf, off, nr, sr, flat_out), nk, max(1024, _GRAIN // nr))
        elif sr == 1 and code != j.SUM:
            ints, out_ints = buf.view(_INT_VIEW[buf.dtype]), flat_out.view(_INT_VIEW[buf.dtype])
            kernel = j.reduce(code, "rows-contiguous")
            parallel(kernel, (ints, off, sk, nr, out_ints), nk, max(1, _GRAIN // nr))
        else:
            parallel(j.reduce(code, "rows"), (buf, off, sk, nr, sr, flat_out), nk, max(1, _GRAIN // nr))
        return out
    if len(kept) == 1 and len(red) == 2:  # e.g. a conv bias's gradient, over (N, H, W): in place, no copy
        (nk, sk), (n0, s0), (n1, s1) = kept[0], red[0], red[1]
        args = (buf, off, sk, n0, s0, n1, s1, flat_out)
        parallel(j.reduce(code, "slabs"), args, nk, max(1, _GRAIN // (n0 * n1)))
        return out
    # several kept or reduced dims that do not merge: one copy with the reduced dims last
    xx = np.ascontiguousarray(t._numpy().transpose(keep_idx + red_idx)).reshape(-1)
    nk = flat_out.size
    nr = xx.size // nk
    parallel(j.reduce(code, "rows"), (xx, 0, nr, nr, 1, flat_out), nk, max(1, _GRAIN // nr))
    return out


def _reduce_kernel(name: str, code_name: str, *, mean: bool = False):
    """A kernel for reduction ``name`` over ``spec[3]`` dims, float32/float64 input of the output dtype."""
    reference = wrap_reference(OPS[name])

    def kernel(spec, a, *rest):
        d = spec[1]
        if d not in FLOAT or a._dtype is not d or not a._shape:
            return reference(spec, a, *rest)
        n = math.prod(a._shape)
        if n < max(config.min_numel, 1):
            return reference(spec, a, *rest)
        dims = tuple(spec[3])
        out = _run_reduce(getattr(_kernels(), code_name), a, dims, len(spec[0]) == len(a._shape) and bool(dims))
        if mean:
            count = math.prod(a._shape[i] for i in dims)
            np.true_divide(out, count, out=out)
        return from_array(out, d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ registry


def kernels() -> dict[str, tuple]:
    """Every kernel kiln-cpu provides: op name -> (kernel, output dtypes served)."""
    table: dict[str, tuple] = {
        "add": (_binary_kernel("add", ARITH + HALF, _pick_add_sub("ADD", "ADD_ALPHA")), ARITH + HALF),
        "sub": (_binary_kernel("sub", ARITH + HALF, _pick_add_sub("SUB", "SUB_ALPHA")), ARITH + HALF),
        "mul": (_binary_kernel("mul", ARITH + HALF, _pick_fixed("MUL")), ARITH + HALF),
        "div": (_binary_kernel("div", FLOAT + HALF, _pick_div), FLOAT + HALF),
        "maximum": (_binary_kernel("maximum", FLOAT + HALF, _pick_fixed("MAXIMUM")), FLOAT + HALF),
        "minimum": (_binary_kernel("minimum", FLOAT + HALF, _pick_fixed("MINIMUM")), FLOAT + HALF),
    }
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        # narrowed by output dtype, which is bool: the kernel itself sends other compute dtypes back
        table[name] = (_binary_kernel(name, FLOAT + HALF, _pick_fixed(name.upper()), compare=True), (dt.bool,))
    for name in ("neg", "abs", "relu"):
        table[name] = (_unary_kernel(name, ARITH + HALF, name.upper()), ARITH + HALF)
    for name in ("exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "erf"):
        table[name] = (_unary_kernel(name, FLOAT + HALF, name.upper()), FLOAT + HALF)
    table["_threshold_backward"] = (
        _binary_kernel("_threshold_backward", FLOAT + HALF, _pick_fixed("RELU_GRAD")),
        FLOAT + HALF,
    )
    gelu = {("none",): "GELU", ("tanh",): "GELU_TANH"}
    table["gelu"] = (_unary_kernel("gelu", FLOAT + HALF, "GELU", gelu), FLOAT + HALF)
    table["_to_copy"] = (_to_copy_kernel(), FLOAT + HALF + _INTS)
    table["_fused_dropout"] = (_fused_dropout_kernel(), FLOAT + HALF)
    table["sum"] = (_reduce_kernel("sum", "SUM"), FLOAT)
    table["mean"] = (_reduce_kernel("mean", "SUM", mean=True), FLOAT)
    for name, code in (("amax", "AMAX"), ("amin", "AMIN"), ("_max_all", "AMAX"), ("_min_all", "AMIN")):
        table[name] = (_reduce_kernel(name, code), FLOAT)
    from kiln_cpu import (
        kernels_conv,
        kernels_index,
        kernels_linalg,
        kernels_loss,
        kernels_nn,
        kernels_pool,
        kernels_scan,
        kernels_ternary,
    )

    modules = (kernels_nn, kernels_linalg, kernels_loss, kernels_conv, kernels_index, kernels_pool, kernels_scan)
    for module in (*modules, kernels_ternary):
        table.update(module.kernels())
    return table
