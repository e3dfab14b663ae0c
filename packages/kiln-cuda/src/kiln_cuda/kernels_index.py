"""Index, scatter, scan and strided-gradient kernels, all built on the pointwise generator's indirect
operands (:class:`kiln_cuda.kernels.Read` with ``gathers``, ``launch_pointwise(scatter=...)``) and the scan
generator.

Index values are checked on the device (their min and max, one small copy to the host) before a kernel
reads through them; on a bad index the op's reference kernel is run on host copies, so the error is
exactly the CPU's (type and wording).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
import kiln.backend as kb
from kiln_cuda import _driver, codegen
from kiln_cuda.codegen import Operand
from kiln_cuda.kernels import Read, _compute, _np, _stream_of, launch_pointwise, new_output

__all__ = ["KERNELS"]

I64 = np.dtype(np.int64)
# dtypes cuda.atomic.add serves; other results accumulate in a wider scratch tensor
_ATOMIC = {kiln.float32, kiln.float64, kiln.int32, kiln.int64}


def _accumulate_dtype(dtype):
    if dtype in _ATOMIC:
        return dtype
    return kiln.float32 if dtype.is_floating_point else kiln.int64


def _1d(t: kiln.Tensor) -> kiln.Tensor:
    return t.reshape(1) if t.ndim == 0 else t


def _host(x):
    if isinstance(x, kiln.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    return x


def _on_cpu(spec):
    if isinstance(spec, kb.Spec):
        return spec.replace(device=kiln.device("cpu"))
    return tuple(s.replace(device=kiln.device("cpu")) for s in spec)


def _index_ok(index: kiln.Tensor, low: int, high: int) -> bool:
    """Whether every value of ``index`` lies in ``[low, high)`` (checked on the device)."""
    if index.numel() == 0:
        return True
    lo, hi = kiln.stack([index.amin(), index.amax()]).tolist()
    return low <= lo and hi < high


def _reference_raises(name: str, spec, *args):
    """Run the op's reference kernel on host copies: it raises the CPU's error for the bad index."""
    kb.reference_kernel(name)(_on_cpu(spec), *_host(args))
    raise RuntimeError(f"{name}: an index is out of range")  # the reference accepted it: never silent


def _copy(src: kiln.Tensor, dtype=None) -> kiln.Tensor:
    """A contiguous copy of ``src`` on its device (in ``dtype`` when given)."""
    out = kiln.empty(tuple(src.shape), dtype=dtype or src.dtype, device=src.device)
    return launch_pointwise("x0", [(src, _compute(out.dtype))], out)


def _along(t: kiln.Tensor, ndim: int, dim: int) -> tuple:
    """Strides that walk a 1-D ``t`` along ``dim`` of an ``ndim``-d launch (0 elsewhere)."""
    return tuple(t.stride(0) if d == dim and t.ndim else 0 for d in range(ndim))


def _without(strides, dim: int) -> tuple:
    return tuple(0 if d == dim else s for d, s in enumerate(strides))


# ---------------------------------------------------------------------------------------- gather / scatter


def gather(spec, input, dim, index, sparse_grad=False):
    """``out[..i..] = input[..index[..i..]..]`` along ``dim``."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    d = spec.dim
    a, idx, o = _1d(input), _1d(index), _1d(out)
    size = a.shape[d]
    if not _index_ok(idx, 0, size):
        _reference_raises("gather", spec, input, dim, index)
    read = Read(a, _compute(spec.dtype), _without(a.stride(), d), ((0, a.stride(d), size),))
    launch_pointwise("x1", [(idx, I64), read], o)
    return out


def _scatter(name: str, accumulate: bool):
    def kernel(spec, input, dim, index, src=None, value=None):
        d = spec.dim
        acc_dtype = _accumulate_dtype(spec.dtype) if accumulate else spec.dtype
        out = _copy(input, acc_dtype)
        idx = _1d(index)
        if idx.numel():
            o = _1d(out)
            size = o.shape[d]
            if not _index_ok(idx, 0, size):
                _reference_raises(name, spec, input, dim, index, *((src,) if value is None else (src, value)))
            source = src if src is not None else value
            c = _compute(acc_dtype)
            operand = Read(_1d(source), c, _1d(source).stride()) if isinstance(source, kiln.Tensor) else (source, c)
            launch_pointwise(
                "x1",
                [(idx, I64), operand],
                o,
                shape=tuple(idx.shape),
                out_strides=_without(o.stride(), d),
                scatter=((0, o.stride(d), size),),
                accumulate=accumulate,
            )
        return out if acc_dtype == spec.dtype else _copy(out, spec.dtype)

    kernel.__name__ = name
    return kernel


def index_select(spec, input, dim, index):
    """The slices of ``input`` along ``dim`` at ``index`` (negative indices count from the end)."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    a, o = _1d(input), _1d(out)
    d = dim % a.ndim
    size = a.shape[d]
    if not _index_ok(index, -size, size):
        _reference_raises("index_select", spec, input, dim, index)
    idx = Read(_1d(index), I64, _along(_1d(index), o.ndim, d))
    read = Read(a, _compute(spec.dtype), _without(a.stride(), d), ((0, a.stride(d), size),))
    launch_pointwise("x1", [idx, read], o)
    return out


def _index_write(name: str, accumulate: bool):
    """index_add / index_copy / index_fill: ``out = input`` then the slices at ``index`` written or added."""

    def kernel(spec, input, dim, index, source, *, alpha=1):
        acc_dtype = _accumulate_dtype(spec.dtype) if accumulate else spec.dtype
        out = _copy(input, acc_dtype)
        o = _1d(out)
        d = dim % o.ndim
        size = o.shape[d]
        if index.numel():
            if not _index_ok(index, -size, size):
                args = (input, dim, index, source) + ((alpha,) if name == "index_add" else ())
                _reference_raises(name, spec, *args)
            c = _compute(acc_dtype)
            if isinstance(source, kiln.Tensor):
                s = _1d(source)
                shape, value = tuple(s.shape), Read(s, c, s.stride())
            else:  # index_fill: a value over the selected slices
                shape, value = tuple(n if k != d else _1d(index).shape[0] for k, n in enumerate(o.shape)), (source, c)
            inputs = [Read(_1d(index), I64, _along(_1d(index), len(shape), d)), value]
            expr = "x1"
            if accumulate and alpha != 1:
                inputs.append((alpha, c))
                expr = "x1 * x2"
            launch_pointwise(
                expr,
                inputs,
                o,
                shape=shape,
                out_strides=_without(o.stride(), d),
                scatter=((0, o.stride(d), size),),
                accumulate=accumulate,
            )
        return out if acc_dtype == spec.dtype else _copy(out, spec.dtype)

    kernel.__name__ = name
    return kernel


_index_add = _index_write("index_add", True)
_index_copy = _index_write("index_copy", False)
_index_fill_write = _index_write("index_fill", False)


def index_add(spec, input, dim, index, source, alpha=1):
    """``input`` with ``alpha * source``'s slices added at ``index`` along ``dim``."""
    return _index_add(spec, input, dim, index, source, alpha=alpha)


def index_copy(spec, input, dim, index, source):
    """``input`` with ``source``'s slices written at ``index`` along ``dim``."""
    return _index_copy(spec, input, dim, index, source)


def index_fill(spec, input, dim, index, value):
    """``input`` with the slices at ``index`` along ``dim`` set to ``value``."""
    if isinstance(value, kiln.Tensor):
        value = value.item()
    return _index_fill_write(spec, input, dim, index, value)


# ---------------------------------------------------------------------------------------- advanced indexing


def _advanced(input: kiln.Tensor, indices) -> tuple:
    """How ``input[indices]`` walks memory: (result shape, input strides over it, [(index tensor, its strides
    over the result, input stride, size)]). Boolean masks become their nonzero positions first."""
    items = []
    d = 0
    for i in indices:
        if i is None:
            items.append((d, None))
            d += 1
        elif i.dtype in (kiln.bool, kiln.uint8):
            for col in (
                kiln.nonzero(i).unbind(1) if i.ndim else [kiln.zeros(int(i.item()), dtype=kiln.int64, device=i.device)]
            ):
                items.append((d, col))
                d += 1
        else:
            items.append((d, i))
            d += 1
    rest = list(range(d, input.ndim))
    idx = [(dd, t) for dd, t in items if t is not None]
    bshape = tuple(np.broadcast_shapes(*[tuple(t.shape) for _, t in idx])) if idx else ()
    places = [k for k, (_, t) in enumerate(items) if t is not None]
    adjacent = places == list(range(places[0], places[-1] + 1)) if places else True
    kept = [dd for dd, t in items if t is None] + rest
    if adjacent and places:
        before = [dd for dd, t in items[: places[0]]]
        after = [dd for dd, t in items[places[-1] + 1 :]] + rest
        layout = [("dim", x) for x in before] + [("b", k) for k in range(len(bshape))] + [("dim", x) for x in after]
    else:
        layout = [("b", k) for k in range(len(bshape))] + [("dim", x) for x in kept]
    shape = tuple(input.shape[x] if kind == "dim" else bshape[x] for kind, x in layout)
    in_strides = tuple(input.stride(x) if kind == "dim" else 0 for kind, x in layout)
    terms = []
    for dd, t in idx:
        lead = len(bshape) - t.ndim
        st = []
        for kind, x in layout:
            if kind == "b" and x >= lead and t.shape[x - lead] != 1:
                st.append(t.stride(x - lead))
            else:
                st.append(0)
        terms.append((t, tuple(st), input.stride(dd), input.shape[dd]))
    return shape, in_strides, terms


def _index(spec, input, indices):
    """``input[indices]`` (advanced indexing from dim 0; ``None`` keeps a dim whole)."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    shape, in_strides, terms = _advanced(input, indices)
    for t, _, _, size in terms:
        if not _index_ok(t, -size, size):
            _reference_raises("_index", spec, input, indices)
    reads = [Read(t, I64, st) for t, st, _, _ in terms]
    k = len(reads)
    reads.append(Read(input, _compute(spec.dtype), in_strides, [(j, s, n) for j, (_, _, s, n) in enumerate(terms)]))
    launch_pointwise(f"x{k}", reads, out.reshape(shape) if tuple(out.shape) != shape else out)
    return out


def index_put(spec, input, indices, values, accumulate=False):
    """``input`` with ``values`` written (``accumulate``: added) at ``input[indices]``."""
    acc_dtype = _accumulate_dtype(spec.dtype) if accumulate else spec.dtype
    out = _copy(input, acc_dtype)
    shape, out_strides, terms = _advanced(out, indices)
    if math.prod(shape):
        for t, _, _, size in terms:
            if not _index_ok(t, -size, size):
                _reference_raises("index_put", spec, input, indices, values, accumulate)
        reads = [Read(t, I64, st) for t, st, _, _ in terms]
        k = len(reads)
        vals = values.expand(shape) if tuple(values.shape) != shape else values
        reads.append(Read(vals, _compute(acc_dtype), vals.stride()))
        launch_pointwise(
            f"x{k}",
            reads,
            out,
            shape=shape,
            out_strides=out_strides,
            scatter=tuple((j, s, n) for j, (_, _, s, n) in enumerate(terms)),
            accumulate=accumulate,
        )
    return out if acc_dtype == spec.dtype else _copy(out, spec.dtype)


# ---------------------------------------------------------------------------------------- masks


def _ranks(mask: kiln.Tensor, shape: tuple, count: int) -> kiln.Tensor:
    """For each position of ``shape`` (``mask`` broadcast to it): its rank among the selected positions, in
    row-major order (a running count on the device), or ``count`` where the mask is not set."""
    m = mask.expand(shape) if tuple(mask.shape) != shape else mask
    flags = launch_pointwise(
        "I64(x0 != C0(0))", [(m, _compute(m.dtype))], kiln.empty(shape, dtype=kiln.int64, device=mask.device)
    )
    running = kiln.cumsum(flags.reshape(-1), 0).reshape(shape)
    return launch_pointwise(
        "x1 - 1 if x0 != 0 else x2",
        [(flags, I64), (running, I64), (count, I64)],
        kiln.empty(shape, dtype=kiln.int64, device=mask.device),
    )


def _nonzero(spec, input):
    """The indices of the nonzero entries, one row each, in row-major order."""
    out = new_output(spec)
    count, nd = spec.shape
    if count == 0 or nd == 0:
        return out
    shape = tuple(input.shape)
    ranks = _ranks(input, shape, count)
    buf = kiln.empty((count + 1, nd), dtype=kiln.int64, device=input.device)  # row ``count``: the unselected
    for k in range(nd):
        coord = kiln.arange(shape[k], device=input.device)
        launch_pointwise(
            "x1",
            [Read(ranks, I64, ranks.stride()), Read(coord, I64, _along(coord, nd, k))],
            buf[:, k],
            shape=shape,
            out_strides=(0,) * nd,
            scatter=((0, nd, count + 1),),
        )
    return launch_pointwise("x0", [(buf[:count], I64)], out)


def masked_select(spec, input, mask):
    """The elements of ``input`` where ``mask`` is set (both broadcast), as a 1-D tensor."""
    out = new_output(spec)
    count = spec.shape[0]
    if count == 0:
        return out
    shape = tuple(spec.index_shape)
    ranks = _ranks(mask, shape, count)
    a = input.expand(shape) if tuple(input.shape) != shape else input
    buf = kiln.empty(count + 1, dtype=spec.dtype, device=input.device)
    launch_pointwise(
        "x1",
        [Read(ranks, I64, ranks.stride()), Read(a, _compute(spec.dtype), a.stride())],
        buf,
        shape=shape,
        out_strides=(0,) * len(shape),
        scatter=((0, 1, count + 1),),
    )
    return launch_pointwise("x0", [(buf[:count], _compute(spec.dtype))], out)


def masked_scatter(spec, input, mask, source):
    """``input`` (broadcast with ``mask``) with the set positions taking ``source``'s elements in order."""
    shape = tuple(spec.shape)
    out = new_output(spec)
    if out.numel() == 0:
        return out
    c = _compute(spec.dtype)
    count = int(
        launch_pointwise(
            "I64(x0 != C0(0))", [(mask, _compute(mask.dtype))], kiln.empty(shape, dtype=kiln.int64, device=mask.device)
        )
        .sum()
        .item()
    )
    a = input.expand(shape) if tuple(input.shape) != shape else input
    if count == 0:
        return launch_pointwise("x0", [(a, c)], out)
    ranks = _ranks(mask, shape, 0)  # unselected positions read element 0 (and keep the input's value)
    flat = source.reshape(-1)
    m = mask.expand(shape) if tuple(mask.shape) != shape else mask
    reads = [
        Read(ranks, I64, ranks.stride()),
        Read(m, np.bool_, m.stride()),
        Read(a, c, a.stride()),
        Read(flat, c, (0,) * len(shape), ((0, flat.stride(0), flat.shape[0]),)),
    ]
    return launch_pointwise("x3 if x1 else x2", reads, out)


# ---------------------------------------------------------------------------------------- scans


def _scan(kind: str, spec, input, dim) -> tuple:
    several = kind in ("cummax", "cummin")  # (values, indices)
    vspec = spec[0] if several else spec
    out = new_output(vspec)
    outi = new_output(spec[1]) if several else None
    if out.numel() == 0:
        return (out, outi) if several else out
    a, o = _1d(input), _1d(out)
    d = dim % a.ndim
    length = a.shape[d]
    lines = [k for k in range(a.ndim) if k != d]
    lshape = tuple(a.shape[k] for k in lines) or (1,)
    lin = tuple(a.stride(k) for k in lines) or (0,)
    lout = tuple(o.stride(k) for k in lines) or (0,)
    lshape, (lin, lout) = codegen.coalesce(lshape, [lin, lout])
    if kind in ("cumsum", "cumprod"):
        acc = np.dtype(
            np.float64 if vspec.dtype == kiln.float64 else np.float32 if vspec.dtype.is_floating_point else np.int64
        )
    else:
        acc = _compute(input.dtype)
    op = Operand(compute=acc, array=a.untyped_storage().array, storage_dtype=_np(a.dtype))
    kernel = codegen.scan_kernel(
        kind, op, acc, _np(vspec.dtype), len(lshape), "float64" if acc == np.float64 else "float32"
    )
    nlines = math.prod(lshape)
    oarr = o.untyped_storage().array
    iarr = _1d(outi).untyped_storage().array if several else oarr
    args = (
        nlines,
        length,
        lshape,
        lin,
        lout,
        op.array,
        a.storage_offset(),
        a.stride(d),
        oarr,
        o.storage_offset(),
        o.stride(d),
        iarr,
    )
    codegen.launch(kernel, _driver.blocks(nlines), _driver.THREADS, _stream_of(out)._raw, args)
    return (out, outi) if several else out


def _scan_kernel(kind: str):
    def kernel(spec, input, dim, dtype=None):
        return _scan(kind, spec, input, dim)

    kernel.__name__ = kind
    return kernel


# ---------------------------------------------------------------------------------------- sort


def _sort(spec, input, dim=-1, descending=False, stable=False):
    """Values and positions sorted along ``dim`` (always stable; NaN above every number)."""
    vspec, ispec = spec
    out, outi = new_output(vspec), new_output(ispec)
    if out.numel() == 0:
        return out, outi
    a = _1d(input)
    d = vspec.dim % a.ndim if input.ndim else 0
    length = a.shape[d]
    others = [k for k in range(a.ndim) if k != d]
    lshape = tuple(a.shape[k] for k in others) or (1,)
    lin = tuple(a.stride(k) for k in others) or (0,)
    nlines = math.prod(lshape)
    lshape, (lin,) = codegen.coalesce(lshape, [lin])
    acc = _compute(input.dtype) if input.dtype != kiln.bool else np.dtype(np.uint8)
    acc_dtype = {np.dtype(k.numpy): k for k in kb.ALL_DTYPES}[acc]
    vals = kiln.empty((nlines, length), dtype=acc_dtype, device=input.device)
    idx = kiln.empty((nlines, length), dtype=kiln.int64, device=input.device)
    tv, ti = kiln.empty_like(vals), kiln.empty_like(idx)
    op = Operand(compute=acc, array=a.untyped_storage().array, storage_dtype=_np(a.dtype))
    kernel = codegen.sort_kernel(op, acc, len(lshape), bool(descending), "float64" if acc == np.float64 else "float32")
    args = (
        nlines,
        length,
        lshape,
        lin,
        op.array,
        a.storage_offset(),
        a.stride(d),
        *(t.untyped_storage().array for t in (vals, idx, tv, ti)),
    )
    codegen.launch(kernel, _driver.blocks(nlines), _driver.THREADS, _stream_of(out)._raw, args)
    shape = tuple(a.shape[k] for k in others) + (length,)
    o, oi = _1d(out).movedim(d, -1), _1d(outi).movedim(d, -1)
    launch_pointwise("x0", [(vals.reshape(shape), _compute(vspec.dtype))], o)
    launch_pointwise("x0", [(idx.reshape(shape), I64)], oi)
    return out, outi


def _lower_median(x: kiln.Tensor, d: int) -> tuple:
    """(values, positions), keepdim, of the lower median along ``d``: the ``(n - 1) // 2``-th of a stable sort,
    or the first NaN where a line has one (PyTorch's choice)."""
    k = (x.shape[d] - 1) // 2
    with kiln.no_grad():
        idx = kiln.sort(x, dim=d, stable=True).indices.narrow(d, k, 1)
        if x.dtype.is_floating_point:
            nan = x != x
            idx = kiln.where(nan.any(d, keepdim=True), nan.to(kiln.uint8).argmax(d, keepdim=True), idx)
        return x.gather(d, idx), idx


def _median_dim(spec, input, dim, keepdim=False):
    """The lower median along ``dim`` and its position."""
    vspec, ispec = spec
    out, outi = new_output(vspec), new_output(ispec)
    if out.numel() == 0 or input.numel() == 0:
        return out, outi
    x = _1d(input)
    values, idx = _lower_median(x, vspec.dim % x.ndim if input.ndim else 0)
    launch_pointwise("x0", [(values.reshape(vspec.shape), _compute(vspec.dtype))], out)
    launch_pointwise("x0", [(idx.reshape(ispec.shape), I64)], outi)
    return out, outi


def _median_all(spec, input):
    """The lower median of all elements (NaN for an empty tensor)."""
    out = new_output(spec)
    if input.numel() == 0:
        return launch_pointwise("x0", [(float("nan"), _compute(spec.dtype))], out)
    values, _ = _lower_median(input.reshape(-1), 0)
    return launch_pointwise("x0", [(values.reshape(()), _compute(spec.dtype))], out)


# ---------------------------------------------------------------------------------------- strided gradients


def _scratch(grad: kiln.Tensor, input_geometry, view_geometry) -> kiln.Tensor:
    def end(shape, stride, offset):
        return offset + (sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if all(shape) else 0)

    n = max(end(*input_geometry), end(*view_geometry))
    dtype = kiln.float64 if grad.dtype.itemsize >= 8 else kiln.float32
    return kiln.zeros(n, dtype=dtype, device=grad.device)


def _geometry(buf: kiln.Tensor, geometry) -> kiln.Tensor:
    shape, stride, offset = geometry
    return buf.as_strided(tuple(shape), tuple(stride), offset)


def _strided_gather(spec, grad, input_geometry, view_geometry):
    """The elements ``view_geometry`` selects from ``grad`` laid out by ``input_geometry``."""
    buf = _scratch(grad, input_geometry, view_geometry)
    launch_pointwise("x0", [(grad, _compute(buf.dtype))], _geometry(buf, input_geometry))
    return _copy(_geometry(buf, view_geometry), spec.dtype)


def _strided_scatter(spec, grad, input_geometry, view_geometry):
    """``grad`` laid out by ``view_geometry``, summed back into ``input_geometry``."""
    buf = _scratch(grad, input_geometry, view_geometry)
    launch_pointwise("x0", [(grad, _compute(buf.dtype))], _geometry(buf, view_geometry), accumulate=True)
    return _copy(_geometry(buf, input_geometry), spec.dtype)


def _strided_zero(spec, grad, input_geometry, view_geometry):
    """``grad`` (laid out by ``input_geometry``) with the elements ``view_geometry`` selects set to zero."""
    buf = _scratch(grad, input_geometry, view_geometry)
    launch_pointwise("x0", [(grad, _compute(buf.dtype))], _geometry(buf, input_geometry))
    launch_pointwise("x0", [(0, _compute(buf.dtype))], _geometry(buf, view_geometry))
    return _copy(_geometry(buf, input_geometry), spec.dtype)


# ---------------------------------------------------------------------------------------- nn helpers


def _fused_dropout(spec, input, uniform, p):
    """Dropout from a tensor of uniform draws: ``noise = (u < 1 - p) / (1 - p)``, ``out = input * noise``."""
    out_spec, noise_spec = spec
    c = _compute(out_spec.dtype)
    keep = 1.0 - p
    noise = launch_pointwise(
        "C2(x0 < x1) / x2",
        [(uniform, _compute(uniform.dtype)), (keep, _compute(uniform.dtype)), (keep, c)],
        new_output(noise_spec),
    )
    out = launch_pointwise("x0 * x1", [(input, c), (noise, c)], new_output(out_spec))
    return out, noise


def _argmax_scatter(spec, src, indices, plane):
    """Pooling's backward: ``src`` added at ``indices`` (per row, within a plane of ``plane`` elements)."""
    acc = _accumulate_dtype(spec.dtype)
    out = kiln.zeros(tuple(spec.shape), dtype=acc, device=spec.device)
    if src.numel():
        rows = math.prod(src.shape[:-1])
        g = src.reshape(rows, src.shape[-1])
        i = indices.reshape(rows, src.shape[-1])
        launch_pointwise(
            "x1",
            [Read(i, I64, i.stride()), Read(g, _compute(acc), g.stride())],
            out,
            shape=(rows, src.shape[-1]),
            out_strides=(plane, 0),
            scatter=((0, 1, plane),),
            accumulate=True,
        )
    return out if acc == spec.dtype else _copy(out, spec.dtype)


# ---------------------------------------------------------------------------------------- the table

ALL = None
KERNELS: dict[str, tuple] = {
    "gather": (gather, ALL),
    "scatter": (_scatter("scatter", False), ALL),
    "scatter_add": (_scatter("scatter_add", True), ALL),
    "index_select": (index_select, ALL),
    "index_add": (index_add, ALL),
    "index_copy": (index_copy, ALL),
    "index_fill": (index_fill, ALL),
    "_index": (_index, ALL),
    "index_put": (index_put, ALL),
    "_nonzero": (_nonzero, ALL),
    "masked_select": (masked_select, ALL),
    "masked_scatter": (masked_scatter, ALL),
    "_sort": (_sort, ALL),
    "_median_dim": (_median_dim, ALL),
    "_median_all": (_median_all, ALL),
    "cumsum": (_scan_kernel("cumsum"), ALL),
    "cumprod": (_scan_kernel("cumprod"), ALL),
    "logcumsumexp": (_scan_kernel("logcumsumexp"), (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)),
    "_cummax": (_scan_kernel("cummax"), ALL),
    "_cummin": (_scan_kernel("cummin"), ALL),
    "_strided_gather": (_strided_gather, ALL),
    "_strided_scatter": (_strided_scatter, ALL),
    "_strided_zero": (_strided_zero, ALL),
    "_fused_dropout": (_fused_dropout, ALL),
    "_argmax_scatter": (_argmax_scatter, ALL),
}
