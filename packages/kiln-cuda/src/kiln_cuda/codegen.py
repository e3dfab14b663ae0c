"""Kernel generators: one for pointwise ops, one for reductions, one for matrix products.

A kernel is generated from a short description — for a pointwise op, an expression over ``x0, x1...``
(the operands, already cast to the compute dtype) — specialised to the operands' storage dtypes and the
number of dims left after coalescing, written as Python source to a file under the kernel cache
(``KILN_CUDA_CACHE``, default ``~/.cache/kiln/cuda``), imported and jitted with numba.cuda's
``cache=True``. A file keeps tracebacks readable and lets Numba cache the machine code on disk; its name
is the hash of its text, so a kernel is compiled once per machine. Under the simulator the same source runs
as Python (:mod:`kiln_cuda._kernel_env`).

Operands are read in place through their strides and storage offset (never copied first); broadcast dims
have stride 0. Dims that every operand walks contiguously are merged first, so most kernels index a 1-D
range whatever the tensors' rank.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from kiln.backend import generated_module
from kiln_cuda import _driver
from kiln_cuda._kernel_env import HELPER_NAMES, HELPERS

__all__ = [
    "pointwise_kernel",
    "operand_reads",
    "reduction_kernel",
    "matmul_kernel",
    "cache_dir",
    "coalesce",
    "Operand",
    "launch",
    "start_recording",
    "recorded",
    "replay",
]


# ------------------------------------------------------------------------------------------------ recording
# Under the simulator the kernels run as Python, which accepts code numba.cuda would reject. So kiln-cuda's
# tests record every (generator call, argument types) the simulator launched and compile each one again for
# a real GPU (compile_ptx, no GPU needed): test_ptx.py.

_recording: set | None = None
_SIM_SWITCH_INTERVAL = 1e-4  # seconds (measured: 3.5 s per small CNN step, 9 s at the default)
_made_by: dict[int, tuple] = {}  # id(kernel) -> (generator name, its arguments as plain data)


def start_recording() -> None:
    """Record every launch from now on (:func:`recorded` returns them)."""
    global _recording
    _recording = set()


def recorded() -> list[tuple]:
    """The launches recorded so far: (generator name, generator arguments, argument type specs)."""
    return sorted(_recording or (), key=repr)


def _describe(x):
    if isinstance(x, Operand):
        return (
            "operand",
            x.compute.name,
            None if x.storage_dtype is None else x.storage_dtype.name,
            x.is_scalar,
            tuple(j for j, _, _ in x.gathers),
        )
    if isinstance(x, np.dtype):
        return ("dtype", x.name)
    if isinstance(x, list):
        return ("list", tuple(_describe(v) for v in x))
    return x


def _type_spec(a):
    if isinstance(a, tuple):
        return ("tuple", len(a))
    if isinstance(a, (bool, np.bool_)):
        return ("scalar", "bool")
    if isinstance(a, int):
        return ("scalar", "int64")
    if isinstance(a, np.generic):
        return ("scalar", a.dtype.name)
    return ("array", np.dtype(a.dtype).name)


def launch(kernel, grid, block, stream, args) -> None:
    """Launch a generated kernel on ``stream`` (recording it when :func:`start_recording` was called)."""
    if _recording is not None:
        _recording.add((*_made_by[id(kernel)], tuple(_type_spec(a) for a in args)))
    if not _driver.SIM:
        kernel[grid, block, stream](*args)
        return
    # The simulator runs a block's threads as Python threads while its own thread polls them: with the
    # interpreter's default 5 ms switch interval every hand-over of the GIL waits on that poll. A short
    # interval during the launch makes simulated kernels several times faster.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(_SIM_SWITCH_INTERVAL)
    try:
        kernel[grid, block, stream](*args)
    finally:
        sys.setswitchinterval(interval)


def _remember(name: str, args: tuple, kernel):
    _made_by.setdefault(id(kernel), (name, tuple(_describe(a) for a in args)))
    return kernel


def replay(name: str, described: tuple, types: tuple, cc: tuple[int, int] = (7, 5)) -> str:
    """PTX for a recorded launch: the generator rerun from its described arguments (on the GPU path, outside
    the simulator) and the kernel compiled for compute capability ``cc`` with the recorded argument types."""
    import numba
    from numba import types as nt

    def undescribe(d):
        if isinstance(d, (tuple, list)) and d and d[0] == "operand":
            _, compute, storage, is_scalar, gathers = d
            return Operand(
                compute=np.dtype(compute),
                array=None if is_scalar else True,
                scalar=0 if is_scalar else None,
                storage_dtype=None if storage is None else _np_dtype(storage),
                gathers=[(j, 0, 0) for j in gathers],
            )
        if isinstance(d, (tuple, list)) and d and d[0] == "dtype":
            return _np_dtype(d[1])
        if isinstance(d, (tuple, list)) and d and d[0] == "list":
            return [undescribe(v) for v in d[1]]
        return d

    from kiln_cuda.memory import storage_dtype

    def numba_type(spec):
        kind, what = spec
        if kind == "tuple":
            return nt.UniTuple(nt.int64, what)
        if kind == "array":
            return nt.Array(numba.from_dtype(storage_dtype(_np_dtype(what))), 1, "A")
        return nt.boolean if what == "bool" else numba.from_dtype(_np_dtype(what))

    import kiln_cuda.fusion  # noqa: F401 - adds the fused-group generators to _GENERATORS

    kernel = _GENERATORS[name](*[undescribe(d) for d in described])
    ptx, _ = _driver.cuda().compile_ptx(kernel.py_func, tuple(numba_type(t) for t in types), cc=cc)
    return ptx


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def cache_dir() -> Path:
    """Where generated kernel sources live (``KILN_CUDA_CACHE``, default ``~/.cache/kiln/cuda``)."""
    root = os.environ.get("KILN_CUDA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kiln", "cuda")
    return Path(root) / ("sim" if _driver.SIM else "gpu")


def _load(source: str, float_dtype: str):
    """The ``kernel`` of a generated module (written once per text, imported once per process)."""
    text = (
        "# Generated by kiln-cuda (kiln_cuda.codegen); the file name is the hash of this text.\n"
        "import numpy as np\n\n"
        "from kiln_cuda._kernel_env import bind\n\n"
        f"bind(globals(), {float_dtype!r})\n"
        + HELPERS
        + "\n"
        + "".join(f"{h} = device_jit({h})\n" for h in HELPER_NAMES)
        + "\n\n"
        + source
        + "\n\nkernel = jit(kernel)\n"
    )
    return generated_module(text, cache_dir(), "kiln_cuda_generated").kernel


# ------------------------------------------------------------------------------------------------ operands


class Operand:
    """One input of a generated kernel: a device array read through (offset, strides), or a scalar.

    ``gathers`` makes the read indirect: for each ``(j, stride, size)`` the value of operand ``j`` (an index,
    negative ones counting from ``size``) times ``stride`` is added to the position — gather, index_select
    and advanced indexing are pointwise kernels with such an operand.
    """

    __slots__ = ("array", "offset", "strides", "scalar", "storage_dtype", "compute", "gathers")

    def __init__(
        self, *, compute: np.dtype, array=None, offset=0, strides=(), scalar=None, storage_dtype=None, gathers=()
    ):
        self.array, self.offset, self.strides = array, offset, tuple(strides)
        self.scalar, self.storage_dtype, self.compute = scalar, storage_dtype, np.dtype(compute)
        self.gathers = tuple(gathers)

    @property
    def is_scalar(self) -> bool:
        """Whether the operand is a value passed to the kernel rather than an array it reads."""
        return self.array is None


def coalesce(shape, strides_list):
    """Drop size-1 dims and merge neighbours every operand walks contiguously: (shape, [strides...])."""
    dims = [(n, [s[i] for s in strides_list]) for i, n in enumerate(shape) if n != 1]
    if not dims:
        return (1,), [(0,) for _ in strides_list]
    merged = [dims[-1]]
    for n, st in reversed(dims[:-1]):
        n0, st0 = merged[-1]
        if all(a == b * n0 for a, b in zip(st, st0)):
            merged[-1] = (n * n0, st0)
        else:
            merged.append((n, st))
    merged.reverse()
    return tuple(n for n, _ in merged), [tuple(st[k] for _, st in merged) for k in range(len(strides_list))]


def _load_expr(name: str, op: Operand, index: str) -> str:
    raw = f"{name}[{index}]"
    if op.storage_dtype is not None and op.storage_dtype.name == "bfloat16":
        raw = f"bf16_load({raw})"
    return raw


def _store_expr(expr: str, out_dtype: np.dtype) -> str:
    if out_dtype.name == "bfloat16":
        return f"bf16_store({expr})"
    return f"OT({expr})"


def _casters(ops: list[Operand], out_dtype: np.dtype) -> str:
    lines = [f"C{k} = caster({o.compute.name!r})" for k, o in enumerate(ops)]
    lines.append(f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})")
    return "\n".join(lines) + "\n\n"


def _unravel(index: str, shape: str, nd: int, positions: list[tuple[str, str, str]]) -> list[str]:
    """Kernel lines that turn flat ``index`` into a position per operand: for each ``(var, base, strides)``,
    ``var = base + sum(coordinate[d] * strides[d])`` over the ``nd`` dims of ``shape`` (row-major)."""
    return [
        f"r = {index}",
        *[f"{var} = {base}" for var, base, _ in positions],
        f"for d in range({nd - 1}, -1, -1):",
        f"    sz = {shape}[d]",
        "    c = r % sz",
        "    r = r // sz",
        *[f"    {var} += c * {strides}[d]" for var, _, strides in positions],
    ]


def _shared(lines: list[str]) -> str:
    """A kernel's shared-array declarations (indented for its body). The simulator finds a block's shared
    array by the line declaring it, with a check-then-create that two threads can both pass: under it the
    declarations hold a lock, so every thread of a block gets the same arrays."""
    if _driver.SIM:
        return "    with shared_lock:\n" + "".join(f"        {ln}\n" for ln in lines)
    return "".join(f"    {ln}\n" for ln in lines)


def _body(lines: list[str], indent: int) -> str:
    pad = " " * indent
    if _driver.SIM:  # the simulator computes on NumPy scalars: wrap like the GPU, without warnings
        return f"{pad}with errstate(all='ignore'):\n" + "".join(f"{pad}    {ln}\n" for ln in lines)
    return "".join(f"{pad}{ln}\n" for ln in lines)


# ------------------------------------------------------------------------------------------------ pointwise


def _index_term(j: int, stride: str, size: str) -> str:
    return f"(x{j} + {size} if x{j} < 0 else x{j}) * {stride}"


def operand_reads(ops: list[Operand]) -> tuple[list[str], list[tuple[str, str, str]], list[str]]:
    """What a kernel needs to read ``ops`` as ``x0, x1...`` (cast by ``C0, C1...``): its parameters (per
    operand: ``v{k}``, a value, or ``a{k}, o{k}, s{k}``, an array with its offset and strides, then a
    ``(stride, size)`` pair per gather term), the positions :func:`_unravel` computes (``p{k}``), and the
    load lines, indirect reads last (their index operands are loaded first)."""
    params, positions, loads, late = [], [], [], []
    for k, o in enumerate(ops):
        if o.is_scalar:
            params.append(f"v{k}")
            loads.append(f"x{k} = C{k}(v{k})")
        else:
            params += [f"a{k}", f"o{k}", f"s{k}"]
            positions.append((f"p{k}", f"o{k}", f"s{k}"))
            where = f"p{k}"
            for t, (j, _, _) in enumerate(o.gathers):
                params += [f"gs{k}_{t}", f"gn{k}_{t}"]
                where += " + " + _index_term(j, f"gs{k}_{t}", f"gn{k}_{t}")
            (late if o.gathers else loads).append(f"x{k} = C{k}({_load_expr(f'a{k}', o, where)})")
    return params, positions, loads + late


def pointwise_kernel(
    expr: str,
    ops: list[Operand],
    out_dtype: np.dtype,
    ndim: int,
    float_dtype: str,
    scatter: tuple = (),
    accumulate: bool = False,
):
    """A kernel ``kernel(n, shape, out, out_offset, out_strides, <per operand: array, offset, strides |
    value, then (stride, size) per gather term>, <(stride, size) per scatter term>)`` writing ``expr`` (over
    ``x0, x1...``) at each of the ``n`` positions of ``shape``.

    ``scatter`` lists index operands whose values move the write (times a stride, as an operand's
    ``gathers`` move a read): scatter, index_copy and index_put are such kernels; with ``accumulate`` the
    write is an atomic add (scatter_add, index_add, index_put(accumulate=True)).
    """
    params, positions, loads = operand_reads(ops)
    params[:0] = ["n", "shape", "out", "oo", "ostr"]
    positions.insert(0, ("po", "oo", "ostr"))
    target = "po"
    for t, j in enumerate(scatter):
        params += [f"ss{t}", f"sn{t}"]
        target += " + " + _index_term(j, f"ss{t}", f"sn{t}")
    value = _store_expr(expr, out_dtype)
    store = f"cuda.atomic.add(out, {target}, {value})" if accumulate else f"out[{target}] = {value}"
    inner = [
        *_unravel("i", "shape", ndim, positions),
        *loads,
        store,
        "i += step",
    ]
    src = (
        _casters(ops, out_dtype)
        + f"def kernel({', '.join(params)}):\n"
        + "    i = cuda.grid(1)\n"
        + "    step = cuda.gridsize(1)\n"
        + "    while i < n:\n"
        + _body(inner, 8)
    )
    return _remember(
        "pointwise_kernel",
        (expr, ops, out_dtype, ndim, float_dtype, tuple(scatter), accumulate),
        _load(src, float_dtype),
    )


# ------------------------------------------------------------------------------------------------ reductions

# kind -> (init expression, combine statement over acc and v)
REDUCTIONS = {
    "sum": ("ACC(0)", "acc = acc + v"),
    "prod": ("ACC(1)", "acc = acc * v"),
    "amax": ("v0", "acc = max_nan(acc, v)"),
    "amin": ("v0", "acc = min_nan(acc, v)"),
}


def reduction_kernel(
    kind: str, op: Operand, acc_dtype: np.dtype, out_dtype: np.dtype, kdim: int, rdim: int, float_dtype: str
):
    """A kernel ``kernel(nout, nr, kshape, kstride, rshape, rstride, a, off, out)``: block ``b`` reduces
    output ``b`` (and every ``gridDim``-th after it), its threads each folding a strided share of the ``nr``
    reduced elements, then a tree in shared memory. ``kind`` is a :data:`REDUCTIONS` key, or ``argmax`` /
    ``argmin`` (NaN counts as the largest, ties go to the first index, as PyTorch)."""
    arg = kind in ("argmax", "argmin")
    load = f"ACC({_load_expr('a', op, 'p')})"

    if arg:
        better = "bv > av" if kind == "argmax" else "bv < av"
        src_combine = (
            "def better(av, ai, bv, bi):\n"
            "    if av != av:\n"
            "        return bv != bv and bi < ai\n"
            "    if bv != bv:\n"
            "        return True\n"
            f"    return {better} or (bv == av and bi < ai)\n\n\n"
            "better = device_jit(better)\n\n\n"
        )
        init = ["acc = ACC(0)", "acci = I64(-1)"]
        fold = [
            "if acci < 0:",
            "    acc = v",
            "    acci = j",
            "elif better(acc, acci, v, j):",
            "    acc = v",
            "    acci = j",
        ]
        share = ["sh[tid] = acc", "shi[tid] = acci"]
        tree = [
            "if tid < s:",
            "    if shi[tid] < 0 or (shi[tid + s] >= 0 and better(sh[tid], shi[tid], sh[tid + s], shi[tid + s])):",
            "        sh[tid] = sh[tid + s]",
            "        shi[tid] = shi[tid + s]",
        ]
        result = "out[o] = shi[0]"
        shared = ["sh = cuda.shared.array(THREADS, ACC_NB)", "shi = cuda.shared.array(THREADS, I64_NB)"]
    else:
        init_expr, combine = REDUCTIONS[kind]
        src_combine = ""
        if init_expr == "v0":  # max/min: start from the output's first element
            init = ["acc = ACC(0)", "have = False"]
            fold = ["if not have:", "    acc = v", "    have = True", "else:", f"    {combine}"]
            share = ["sh[tid] = acc", "shi[tid] = I64(1 if have else 0)"]
            tree = [
                "if tid < s and shi[tid + s] != 0:",
                "    if shi[tid] == 0:",
                "        sh[tid] = sh[tid + s]",
                "        shi[tid] = I64(1)",
                "    else:",
                "        acc = sh[tid]",
                "        v = sh[tid + s]",
                f"        {combine}",
                "        sh[tid] = acc",
            ]
            shared = ["sh = cuda.shared.array(THREADS, ACC_NB)", "shi = cuda.shared.array(THREADS, I64_NB)"]
        else:
            init = [f"acc = {init_expr}"]
            fold = [combine]
            share = ["sh[tid] = acc"]
            tree = ["if tid < s:", "    acc = sh[tid]", "    v = sh[tid + s]", f"    {combine}", "    sh[tid] = acc"]
            shared = ["sh = cuda.shared.array(THREADS, ACC_NB)"]
        result = f"out[o] = {_store_expr('sh[0]', out_dtype)}"
    loop = [
        *_unravel("o", "kshape", kdim, [("p", "off", "kstride")]),
        "base = p",
        *init,
        "j = I64(tid)",
        "while j < nr:",
        *[f"    {ln}" for ln in _unravel("j", "rshape", rdim, [("p", "base", "rstride")])],
        f"    v = {load}",
        *[f"    {ln}" for ln in fold],
        "    j += nthreads",
        *share,
        "cuda.syncthreads()",
        "s = nthreads // 2",
        "while s > 0:",
        *[f"    {ln}" for ln in tree],
        "    cuda.syncthreads()",
        "    s = s // 2",
        "if tid == 0:",
        f"    {result}",
        "cuda.syncthreads()",
        "o += cuda.gridDim.x",
    ]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n"
        f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})\n"
        f"THREADS = {_driver.THREADS}\n"  # the shared arrays' size: launches use at most this many threads
        f"ACC_NB = np.{'bool_' if acc_dtype == np.bool_ else acc_dtype.name}\n"
        "I64_NB = np.int64\n\n\n"
        + src_combine
        + "def kernel(nout, nr, kshape, kstride, rshape, rstride, a, off, out):\n"
        + _shared(shared)
        + "    tid = cuda.threadIdx.x\n"
        + "    nthreads = cuda.blockDim.x\n"
        + "    o = cuda.blockIdx.x\n"
        + "    while o < nout:\n"
        + _body(loop, 8)
    )
    return _remember(
        "reduction_kernel", (kind, op, acc_dtype, out_dtype, kdim, rdim, float_dtype), _load(src, float_dtype)
    )


# ------------------------------------------------------------------------------------------------ matmul


def matmul_kernel(a: Operand, b: Operand, acc_dtype: np.dtype, out_dtype: np.dtype, bdim: int, float_dtype: str):
    """A tiled kernel ``kernel(M, N, K, nb, bshape, abstr, bbstr, a, ao, as0, as1, b, bo, bs0, bs1, out)``:
    block (x, y, z) computes TILE x TILE tiles of the product of batch z, staging tiles of both operands in
    shared memory, and strides over tiles and batches by the grid's size (every thread of a block runs the
    same loops, so its barriers are safe)."""
    la = f"ACC({_load_expr('a', a, 'ao + row * as0 + k * as1 + pa')})"
    lb = f"ACC({_load_expr('b', b, 'bo + k * bs0 + col * bs1 + pb')})"
    tile = [
        "row = ty0 * TILE + ty",
        "col = tx0 * TILE + tx",
        "acc = ACC(0)",
        "for t in range((K + TILE - 1) // TILE):",
        "    k = t * TILE + tx",
        f"    sa[ty, tx] = {la} if (row < M and k < K) else ACC(0)",
        "    k = t * TILE + ty",
        f"    sb[ty, tx] = {lb} if (k < K and col < N) else ACC(0)",
        "    cuda.syncthreads()",
        "    for kk in range(TILE):",
        "        acc += sa[ty, kk] * sb[kk, tx]",
        "    cuda.syncthreads()",
        "if row < M and col < N:",
        f"    out[z * M * N + row * N + col] = {_store_expr('acc', out_dtype)}",
        "tx0 += cuda.gridDim.x",
    ]
    loop = [
        *_unravel("z", "bshape", bdim, [("pa", "I64(0)", "abstr"), ("pb", "I64(0)", "bbstr")]),
        "ty0 = cuda.blockIdx.y",
        "while ty0 * TILE < M:",
        "    tx0 = cuda.blockIdx.x",
        "    while tx0 * TILE < N:",
        *[f"        {ln}" for ln in tile],
        "    ty0 += cuda.gridDim.y",
        "z += cuda.gridDim.z",
    ]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n"
        f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})\n"
        f"TILE = {_driver.TILE}\n"
        f"ACC_NB = np.{acc_dtype.name}\n\n\n"
        "def kernel(M, N, K, nb, bshape, abstr, bbstr, a, ao, as0, as1, b, bo, bs0, bs1, out):\n"
        + _shared(["sa = cuda.shared.array((TILE, TILE), ACC_NB)", "sb = cuda.shared.array((TILE, TILE), ACC_NB)"])
        + "    tx = cuda.threadIdx.x\n"
        "    ty = cuda.threadIdx.y\n"
        "    z = cuda.blockIdx.z\n"
        "    while z < nb:\n" + _body(loop, 8)
    )
    return _remember("matmul_kernel", (a, b, acc_dtype, out_dtype, bdim, float_dtype), _load(src, float_dtype))


def dot_kernel(a: Operand, b: Operand, acc_dtype: np.dtype, out_dtype: np.dtype, bdim: int, float_dtype: str):
    """The untiled matrix product (one thread per output element, a dot product each), with
    :func:`matmul_kernel`'s arguments: what the simulator runs for all but small products, where the tiled
    kernel's barriers would cost it milliseconds each (the GPU always runs the tiled one)."""
    la = f"ACC({_load_expr('a', a, 'ao + row * as0 + k * as1 + pa')})"
    lb = f"ACC({_load_expr('b', b, 'bo + k * bs0 + col * bs1 + pb')})"
    loop = [
        "z = i // (M * N)",
        "row = (i // N) % M",
        "col = i % N",
        *_unravel("z", "bshape", bdim, [("pa", "I64(0)", "abstr"), ("pb", "I64(0)", "bbstr")]),
        "acc = ACC(0)",
        "for k in range(K):",
        f"    acc += {la} * {lb}",
        f"out[i] = {_store_expr('acc', out_dtype)}",
        "i += cuda.gridsize(1)",
    ]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n"
        f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})\n\n\n"
        "def kernel(M, N, K, nb, bshape, abstr, bbstr, a, ao, as0, as1, b, bo, bs0, bs1, out):\n"
        "    i = cuda.grid(1)\n"
        "    while i < M * N * nb:\n" + _body(loop, 8)
    )
    return _remember("dot_kernel", (a, b, acc_dtype, out_dtype, bdim, float_dtype), _load(src, float_dtype))


# ------------------------------------------------------------------------------------------------ scans

# kind -> the running fold over acc and v (cummax/cummin also keep the index of the running extreme:
# PyTorch's rule, a NaN or a value >= (<=) the running one takes over, and after a NaN only NaNs do)
SCANS = {
    "cumsum": ("ACC(0)", "acc = acc + v"),
    "cumprod": ("ACC(1)", "acc = acc * v"),
    "logcumsumexp": ("ACC(-INF)", "acc = logaddexp_f(acc, v)"),
    "cummax": ("v", "if v != v or (acc == acc and v >= acc):\n    acc = v\n    acci = t"),
    "cummin": ("v", "if v != v or (acc == acc and v <= acc):\n    acc = v\n    acci = t"),
}


def scan_kernel(kind: str, op: Operand, acc_dtype: np.dtype, out_dtype: np.dtype, ldim: int, float_dtype: str):
    """A kernel ``kernel(nlines, length, lshape, lin, lout, a, off, sa, out, oo, so, outi)``: one thread per
    line (every position of the other dims), walking its ``length`` elements in order and writing the running
    fold; ``cummax``/``cummin`` also write the running index into ``outi``."""
    init, fold = SCANS[kind]
    arg = kind in ("cummax", "cummin")
    walk = _unravel("line", "lshape", ldim, [("p", "off", "lin"), ("q", "oo", "lout")])
    body = [
        *walk,
        f"acc = {'ACC(0)' if arg else init}",
        "acci = I64(0)",
        "for t in range(length):",
        f"    v = ACC({_load_expr('a', op, 'p + t * sa')})",
        *(["    if t == 0:", "        acc = v", "        acci = I64(0)", "    else:"] if arg else []),
        *[("        " if arg else "    ") + ln for ln in fold.split("\n")],
        f"    out[q + t * so] = {_store_expr('acc', out_dtype)}",
        *(["    outi[q + t * so] = acci"] if arg else []),
        "line += cuda.gridsize(1)",
    ]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n"
        f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})\n\n\n"
        "def kernel(nlines, length, lshape, lin, lout, a, off, sa, out, oo, so, outi):\n"
        "    line = cuda.grid(1)\n"
        "    while line < nlines:\n" + _body(body, 8)
    )
    return _remember("scan_kernel", (kind, op, acc_dtype, out_dtype, ldim, float_dtype), _load(src, float_dtype))


# ------------------------------------------------------------------------------------------------ pooling


def pool_kernel(op: Operand, acc_dtype: np.dtype, out_dtype: np.dtype, nd: int, adaptive: bool, float_dtype: str):
    """A max-pooling kernel ``kernel(total, oshape, ishape, ks, ss, ps, ds, a, off, plane, out, outi)`` over
    ``nd`` spatial dims: one thread per output element walks its window (strided, padded and dilated, or
    with ``adaptive`` PyTorch's ``[floor(i*n/o), ceil((i+1)*n/o))``) and writes the maximum and its flat
    position in the plane. PyTorch's rules: the first maximum wins, a NaN always takes over (the last NaN
    wins), padding never counts."""
    walk = ["r = i"] + [
        ln for k in range(nd - 1, -1, -1) for ln in (f"o{k} = r % oshape[{k}]", f"r = r // oshape[{k}]")
    ]
    walk += ["base = off + r * plane", "best = ACC(0)", "bi = I64(-1)"]
    loops, pad = [], ""
    for k in range(nd):
        if adaptive:
            loops += [
                f"{pad}lo{k} = (o{k} * ishape[{k}]) // oshape[{k}]",
                f"{pad}hi{k} = -((-(o{k} + 1) * ishape[{k}]) // oshape[{k}])",
                f"{pad}for q{k} in range(lo{k}, hi{k}):",
            ]
        else:
            loops += [
                f"{pad}for k{k} in range(ks[{k}]):",
                f"{pad}    q{k} = o{k} * ss[{k}] - ps[{k}] + k{k} * ds[{k}]",
                f"{pad}    if q{k} < 0 or q{k} >= ishape[{k}]:",
                f"{pad}        continue",
            ]
        pad += "    "
    flat = " + ".join(
        f"q{k} * " + " * ".join(f"ishape[{j}]" for j in range(k + 1, nd)) if k < nd - 1 else f"q{k}" for k in range(nd)
    )
    loops += [
        f"{pad}f = {flat}",
        f"{pad}v = ACC({_load_expr('a', op, 'base + f')})",
        f"{pad}if bi < 0 or v > best or v != v:",
        f"{pad}    best = v",
        f"{pad}    bi = f",
    ]
    body = [*walk, *loops, f"out[i] = {_store_expr('best', out_dtype)}", "outi[i] = bi", "i += step"]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n"
        f"OT = caster({('float32' if out_dtype.name == 'bfloat16' else out_dtype.name)!r})\n\n\n"
        "def kernel(total, oshape, ishape, ks, ss, ps, ds, a, off, plane, out, outi):\n"
        "    i = cuda.grid(1)\n"
        "    step = cuda.gridsize(1)\n"
        "    while i < total:\n" + _body(body, 8)
    )
    return _remember("pool_kernel", (op, acc_dtype, out_dtype, nd, adaptive, float_dtype), _load(src, float_dtype))


# ------------------------------------------------------------------------------------------------ sort


def sort_kernel(op: Operand, acc_dtype: np.dtype, ldim: int, descending: bool, float_dtype: str):
    """A stable sort along one dim, ``kernel(nlines, L, lshape, lin, a, off, sa, v, ix, tv, ti)``: one thread
    per line copies it into row ``line`` of ``v`` (values, ``acc_dtype``) and ``ix`` (positions) and runs a
    bottom-up merge sort there, ``tv``/``ti`` its scratch rows; the result ends in ``v``/``ix``. NaN sorts
    above every number (last ascending, first descending), equal elements keep their order, as PyTorch's
    stable sort."""
    before = "(x > y or (x != x and y == y))" if descending else "(x < y or (y != y and x == x))"  # x strictly before y
    body = [
        *_unravel("line", "lshape", ldim, [("p", "off", "lin")]),
        "row = line * L",
        "for t in range(L):",
        f"    v[row + t] = ACC({_load_expr('a', op, 'p + t * sa')})",
        "    ix[row + t] = t",
        "width = I64(1)",
        "flip = False",
        "while width < L:",
        "    lo = I64(0)",
        "    while lo < L:",
        "        mid = min(lo + width, L)",
        "        hi = min(lo + 2 * width, L)",
        "        i = lo",
        "        j = mid",
        "        for k in range(lo, hi):",
        "            if flip:",
        "                take = j >= hi",
        "                if not take and i < mid:",
        "                    x = tv[row + j]",
        "                    y = tv[row + i]",
        f"                    take = not {before}",
        "                if take:",
        "                    v[row + k] = tv[row + i]",
        "                    ix[row + k] = ti[row + i]",
        "                    i += 1",
        "                else:",
        "                    v[row + k] = tv[row + j]",
        "                    ix[row + k] = ti[row + j]",
        "                    j += 1",
        "            else:",
        "                take = j >= hi",
        "                if not take and i < mid:",
        "                    x = v[row + j]",
        "                    y = v[row + i]",
        f"                    take = not {before}",
        "                if take:",
        "                    tv[row + k] = v[row + i]",
        "                    ti[row + k] = ix[row + i]",
        "                    i += 1",
        "                else:",
        "                    tv[row + k] = v[row + j]",
        "                    ti[row + k] = ix[row + j]",
        "                    j += 1",
        "        lo += 2 * width",
        "    flip = not flip",
        "    width *= 2",
        "if flip:",
        "    for t in range(L):",
        "        v[row + t] = tv[row + t]",
        "        ix[row + t] = ti[row + t]",
        "line += cuda.gridsize(1)",
    ]
    src = (
        f"ACC = caster({acc_dtype.name!r})\n\n\n"
        "def kernel(nlines, L, lshape, lin, a, off, sa, v, ix, tv, ti):\n"
        "    line = cuda.grid(1)\n"
        "    while line < nlines:\n" + _body(body, 8)
    )
    return _remember("sort_kernel", (op, acc_dtype, ldim, descending, float_dtype), _load(src, float_dtype))


_GENERATORS = {
    "sort_kernel": sort_kernel,
    "pointwise_kernel": pointwise_kernel,
    "reduction_kernel": reduction_kernel,
    "matmul_kernel": matmul_kernel,
    "dot_kernel": dot_kernel,
    "scan_kernel": scan_kernel,
    "pool_kernel": pool_kernel,
}  # kiln_cuda.fusion adds its generators of fused-group kernels
