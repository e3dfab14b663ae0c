"""What every family of kiln-cpu kernels (``kernels_*.py``) shares: the dtype groups, the lazy getter of a
jitted module (:func:`loops`), the work grain and thread-team ``parallel``, layout analysis (dense views,
dim merging, NumPy's result order), the strided-loop driver, and the float16/bfloat16-through-float32
wrapper (:func:`through_float32`).

Each kernel has the reference kernel's contract (``kernel(spec, *args)`` returning a CPU tensor) and
hands a call back to the reference kernel whenever it would not be faster or not be identical: small
outputs (:data:`kiln_cpu.config.min_numel`), operands whose dtype differs from the compute dtype (the
reference casts them), and layouts the Numba loops do not take (more than 4 dims after merging). This
module imports no kernel family and no Numba.
"""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array, reference_kernel
from kiln.backend import op as op_record
from kiln_cpu import _opcodes, _threads, config

FLOAT = (kiln.float32, kiln.float64)
ARITH = (kiln.float32, kiln.float64, kiln.int32, kiln.int64)
HALF = (kiln.float16, kiln.bfloat16)  # in the order of the Numba loops' codes _opcodes.F16, _opcodes.BF16
_F32 = np.dtype(np.float32)


def loops(module: str):
    """A getter of the Numba module ``kiln_cpu.<module>`` (its jitted loops), imported on the getter's first
    call: building the kernel table, ``import kiln`` and ``import kiln_cpu`` import no Numba."""
    name = f"kiln_cpu.{module}"

    def get():
        found = sys.modules.get(name)
        if found is not None and not getattr(found.__spec__, "_initializing", False):
            return found
        # not imported, or another thread is importing it (in sys.modules before its names are defined):
        # import_module waits for that import to finish
        return importlib.import_module(name)

    return get


def min_numel() -> int:
    """:data:`kiln_cpu.config.min_numel`, read on each call: the ``min_numel`` of the kernels made with
    ``kiln.backend.reference_kernel(name, fast=..., min_numel=...)``, below which NumPy runs."""
    return config.min_numel


def with_fallback(name: str, body):
    """A kernel for op ``name`` that runs ``body(spec, *args)`` and hands the call to the reference kernel
    when ``body`` returns None (not taken)."""
    kernel = reference_kernel(name, fast=body)
    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


_elementwise = loops("_jit_elementwise")

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


def _scalar(x, np_dtype: np.dtype, d: kiln.dtype | None = None):
    """A Python number as the reference uses it in compute dtype ``np_dtype`` (integers wrap; a float
    meeting a half-precision tensor ``d`` is rounded to that precision first)."""
    if np_dtype.kind in "iu":
        return np.array(x).astype(np_dtype)[()]
    if d in HALF and isinstance(x, float):
        with np.errstate(over="ignore"):  # beyond the half range: inf, as the reference
            return np_dtype.type(np.array(x, dtype=d.numpy))
    return np_dtype.type(x)


def half_kind(d: kiln.dtype) -> int:
    """The Numba loops' code for half-precision storage dtype ``d`` (``_opcodes.F16``/``BF16``), else 0."""
    if d is kiln.float16:
        return _opcodes.F16
    return _opcodes.BF16 if d is kiln.bfloat16 else 0


def bits(a: np.ndarray) -> np.ndarray:
    """A float16/bfloat16 array as its uint16 bits (what the Numba loops take), any other array as is."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind in "fV" else a


def _operand(x, shape: tuple) -> tuple:
    """(storage, offset, strides in elements broadcast to ``shape``) of a tensor or a NumPy scalar."""
    if isinstance(x, Tensor):
        buf, off, xs, xst = bits(x._storage), x._offset, x._shape, x._stride
    else:
        buf, off, xs, xst = np.array([x]), 0, (), ()
    pad = len(shape) - len(xs)
    strides = (0,) * pad + tuple(0 if n == 1 else s for n, s in zip(xs, xst))
    return buf, off, strides


def _run_strided(get_kernel, shape: tuple, operands: list, out_np: np.dtype, extra: tuple = (), order=None, into=None):
    """Run the strided loop ``get_kernel()`` as ``kernel(*(storage, offset, strides4) per operand, out,
    out_strides4, shape4, *extra, lo, hi)`` over tasks of up to ``_jit_elementwise._BLOCK`` innermost elements, into
    a new array of ``shape`` laid out as NumPy (and PyTorch) lay out a result of the operands (or in dim
    ``order``, outermost first, where given), or into the tensor ``into`` of that shape (an in-place
    kernel's ``self``, from :data:`kiln_cpu.config.min_numel` elements; the caller has checked that no
    operand overlaps it but in the same places); None (nothing run) if more than 4 dims remain after
    merging."""
    if into is not None and math.prod(shape) < config.min_numel:
        # writing the array it reads keeps a strided loop in its scalar form (LLVM's overlap check fails):
        # below the size where threads pay for that, NumPy's in-place ufunc or a copy is faster
        return None
    ops = [_operand(x, shape) for x in operands]
    if into is not None:
        buf, off, out_strides = _operand(into, shape)
        flat, out = buf[off:], into
    else:
        if order is None:
            order = numpy_order(shape, [o[2] for o in ops])
        dense = np.empty([shape[d] for d in order], out_np)
        flat, out = dense.reshape(-1), dense.transpose(np.argsort(order))
        out_strides = tuple(s // dense.itemsize for s in out.strides)
    if 0 not in shape:
        merged = _coalesce(shape, [out_strides] + [o[2] for o in ops])
        if merged is None:
            return None
        shape4, (so, *strides4) = merged
        args = []
        for (buf, off, _), st in zip(ops, strides4):
            args += [buf, off, st]
        block = _elementwise()._BLOCK
        tasks = shape4[0] * shape4[1] * shape4[2] * -(-shape4[3] // block)
        kernel_args = (*args, flat, so, shape4, *extra)
        parallel(get_kernel(), kernel_args, tasks, max(1, _GRAIN // min(shape4[3], block)))
    return out


def apart(x, into: Tensor) -> bool:
    """Whether an operand of an in-place loop over ``into`` is safe to read while the loop writes: not a
    tensor, ``into`` itself, a tensor that reads ``into``'s memory in the same places (the same storage,
    offset, shape and strides), or one whose memory lies elsewhere."""
    if not isinstance(x, Tensor) or x is into:
        return True
    if (
        x._storage is into._storage
        and x._offset == into._offset
        and x._stride == into._stride
        and x._shape == into._shape
    ):
        return True
    return not np.may_share_memory(x._storage, into._storage)


def inplace_kernel(name: str, kernel):
    """The in-place kernel (``add_``) of an elementwise op whose kernel carries its loops
    (``kernel.in_loops(spec, *args, into=None)``, which write into ``into`` when given), so ``add_`` gives
    what ``add`` gives. A call the core's NumPy in-place kernel makes in one ufunc pass writing into ``self``
    (``add_``/``sub_`` with alpha 1, ``mul_``: its ``plain_rest``) runs the loops where the op's kernel
    runs them (``kernel.floor``): below, NumPy's write costs less than the loops' call (``add_`` of 1K to
    64K float32 elements: 4-10 us against 7-13 us). Any other call (``add_(b, alpha=-lr)``: NumPy's two
    passes through a temporary took 75 us at 200K elements, the loops 32 us) runs loops that give the
    reference's bits (``kernel.exact``: all but the transcendentals' polynomials) from
    :data:`kiln_cpu.config.multipass_min_numel` elements, the others from ``kernel.floor``. Elsewhere, and
    where a tensor operand overlaps ``self`` in other places (:func:`apart`) or ``self`` is read-only, the
    NumPy in-place kernel where the core has one, else None (not taken)."""
    in_loops, floor = kernel.in_loops, kernel.floor
    reference = reference_kernel(name, inplace=True)
    one_pass = getattr(reference, "plain_rest", None)
    loops_floor = _exact_floor if getattr(kernel, "exact", True) else floor

    def inplace(spec, a, *args):
        n = math.prod(a._shape)
        if (
            n
            and n >= (floor() if one_pass is not None and args[1:] == one_pass else loops_floor())
            and a._numpy().flags.writeable
        ):
            for x in args:
                if not apart(x, a):
                    break
            else:
                done = in_loops(spec, a, *args, into=a)
                if done is not None:
                    return done
        return None if reference is None else reference(spec, a, *args)

    inplace.__name__ = f"kiln_cpu_{name}_"
    inplace.__doc__ = f"Numba in-place kernel for {name}_ (kiln-cpu)."
    return inplace


def _exact_floor() -> int:
    return min(config.min_numel, config.multipass_min_numel)


def inplace_table(table: dict) -> dict[str, tuple]:
    """The in-place kernels for kiln-cpu's kernel table (op name -> (kernel, dtypes)), for the ops with an
    in-place variant: a kernel that carries its loops (``kernel.in_loops``) gets :func:`inplace_kernel`;
    another (the index writes: its loops write into a copy) the core's NumPy in-place kernel, which gives
    the same values and writes the indexed elements alone. The comparisons' in-place results (bool) never
    have a float ``self``'s dtype: none."""
    out = {}
    for name, (kernel, dtypes) in table.items():
        if name in _opcodes.COMPARISONS:
            continue
        if getattr(kernel, "in_loops", None) is not None:
            if op_record(name).inplace:
                out[name] = (inplace_kernel(name, kernel), dtypes)
            continue
        reference = reference_kernel(name, inplace=True)
        if reference is not None:
            out[name] = (reference, dtypes)
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


# --------------------------------------------------------------------------------------- conversion

_INTS = (kiln.int32, kiln.int64)


def cast_flat(x: np.ndarray, out: np.ndarray, hin: int, hout: int) -> np.ndarray:
    """Convert the 1-d array ``x`` into ``out`` (same size) over the threads, as NumPy's ``astype``
    converts; ``hin``/``hout``: :func:`half_kind` of a half-precision side, whose arrays hold its uint16
    bits. Returns ``out``."""
    parallel(_elementwise().cast("flat", hin, hout), (x, out), x.size, _GRAIN)
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
    return from_array(out, kiln.float32)


def _rounded(t: Tensor, d: kiln.dtype) -> Tensor:
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
    operand reaches :data:`kiln_cpu.config.multipass_min_numel` elements (tiny half-precision calls are
    not worth their widening)."""
    opdef = op_record(name)
    reference = reference_kernel(opdef)
    multi = opdef.num_outputs > 1

    def wrapped(spec, *args):
        # the usual call, no half-precision result or operand, tested with no list or generator built (a
        # microsecond a call on the small losses, norms and pools this wraps)
        if not (any(s.dtype in HALF for s in spec) if multi else spec.dtype in HALF):
            for a in args:
                if isinstance(a, Tensor) and a._dtype in HALF:
                    break
            else:
                return kernel(spec, *args)
        specs = spec if multi else (spec,)
        halves = [s.dtype if s.dtype in HALF else None for s in specs]
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
        specs32 = [s if h is None else s.replace(dtype=kiln.float32) for s, h in zip(specs, halves)]
        out = kernel(tuple(specs32) if multi else specs32[0], *wide)
        outs = out if multi else (out,)
        outs = [o if h is None else _rounded(o, h) for o, h in zip(outs, halves)]
        return tuple(outs) if multi else outs[0]

    wrapped.__name__ = getattr(kernel, "__name__", f"kiln_cpu_{name}")
    wrapped.__doc__ = f"{kernel.__doc__} float16/bfloat16 through the float32 kernel."
    return wrapped
