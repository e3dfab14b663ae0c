"""kiln-compile's code generator for device ``"cuda"``: a fused group of pointwise ops (and a whole-tensor
``sum`` or ``mean`` after them) becomes one numba.cuda kernel.

kiln-compile hands over a ``FusedGroup`` (plain data: the iteration shape, the inputs' shapes and dtypes,
scalar expressions, the outputs to store, an optional reduction). :func:`kiln_cuda.codegen.fused_kernel`
writes the kernel: a grid-stride loop that reads every input through its strides and storage offset (so
views and broadcast inputs are read in place), computes the group's lines with the float32 or float64
libdevice function each call's argument needs, and stores the outputs. A reduction adds its value per
thread in float64, then per block in shared memory; a one-block kernel adds the blocks' sums in a fixed
order (the same result on every run, as PyTorch's CUDA sums). Kernels launch on the current stream.

Kernels are generated when first called, for the layout the call brings (which inputs are device arrays
and which are CPU scalars, such as an optimizer's step count; the number of dims left after coalescing),
and cached like every kiln-cuda kernel (a file per source text, numba.cuda's ``cache=True``).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln_cuda import _driver, codegen
from kiln_cuda.codegen import Operand
from kiln_cuda.streams import current_stream

__all__ = ["codegen_fused"]


def _span(t: kiln.Tensor) -> tuple[int, int]:
    """The device addresses ``[first, last]`` that ``t``'s elements lie between."""
    lo = hi = t.data_ptr()
    for n, st in zip(t.shape, t.stride()):
        reach = (n - 1) * st * t.element_size()
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi + t.element_size() - 1


def _target(view: kiln.Tensor, others: list[kiln.Tensor], shape: tuple) -> kiln.Tensor:
    """Where the kernel stores an output meant for ``view``: ``view`` itself, unless another input overlaps
    its memory in another layout (a thread could read an element another thread already stored): then a
    new tensor, copied into ``view`` after the kernel."""
    lo, hi = _span(view)
    for t in others:
        a, b = _span(t)
        if a <= hi and lo <= b:
            same = t.data_ptr() == view.data_ptr() and tuple(t.shape) == shape and t.stride() == view.stride()
            if not same:
                return kiln.empty(shape, dtype=view.dtype, device=view.device)
    return view


def _strides(t: kiln.Tensor, shape: tuple) -> tuple:
    """``t``'s element strides read as ``shape`` (0 along the dims it broadcasts over)."""
    lead = len(shape) - t.dim()
    return tuple(0 if i < lead or t.shape[i - lead] == 1 else t.stride(i - lead) for i in range(len(shape)))


class _Fused:
    """The kernel of one group: ``kernel(*inputs, out=None)`` as kiln-compile's ``FusedGroup`` contract says."""

    def __init__(self, group) -> None:
        self.group = group
        self.kernels: dict[tuple, object] = {}
        self.dtypes = [getattr(kiln, d) for _, d in group.outputs]

    def __call__(self, *tensors: kiln.Tensor, out=None):
        g = self.group
        shape, n = g.shape, math.prod(g.shape)
        device = next(t.device for t in (*tensors, *(out or ())) if t is not None and t.device.type == "cuda")
        given = list(out or [None] * len(g.outputs))
        outs = [
            kiln.empty(shape, dtype=d, device=device)
            if v is None
            else _target(v, [t for t in tensors if t is not v and t.device.type == "cuda"], shape)
            for d, v in zip(self.dtypes, given)
        ]
        result = None
        if g.reduction is not None:
            kind, _, dtype = g.reduction
            result = kiln.empty((1,) * len(shape) if g.keepdim else (), dtype=getattr(kiln, dtype), device=device)
        if n:
            self._launch(tensors, outs, result, device)
        elif result is not None:
            result.fill_(0.0 if kind == "sum" else math.nan)
        for o, v in zip(outs, given):
            if v is not None and o is not v:  # stored aside: an input overlapped the target
                v.copy_(o)
        results = [o if v is None else v for o, v in zip(outs, given)]
        return (*results, result) if result is not None else tuple(results)

    def _launch(self, tensors, outs, result, device) -> None:
        g = self.group
        shape, n = g.shape, math.prod(g.shape)
        ops, arrays = [], []
        for t, (_, dtype) in zip(tensors, g.inputs):
            compute = np.dtype("bool" if dtype == "bool" else dtype)
            if t.device.type == "cuda":
                ops.append(Operand(compute=compute, array=True, storage_dtype=np.dtype(t.dtype.numpy)))
                arrays.append(t)
            else:  # a CPU number (a 0-d tensor: a step count, a learning rate)
                ops.append(Operand(compute=compute, scalar=np.array(t.item()).astype(compute)[()]))
        cshape, cstrides = codegen.coalesce(shape, [_strides(t, shape) for t in arrays])
        key = (tuple(o.is_scalar for o in ops), len(cshape))
        kernel = self.kernels.get(key)
        if kernel is None:
            reduced = g.reduction[1] if g.reduction is not None else None
            kernel = self.kernels[key] = codegen.fused_kernel(g.lines, ops, g.outputs, reduced, len(cshape))
        blocks = _driver.blocks(n)
        partials = kiln.empty((blocks if result is not None else 1,), dtype=kiln.float64, device=device)
        args: list = [n, cshape]
        strides = iter(cstrides)
        for o, t in zip(ops, tensors):
            args += [o.scalar] if o.is_scalar else [t.untyped_storage().array, t.storage_offset(), next(strides)]
        for o in outs:
            args += [o.untyped_storage().array, o.storage_offset()]
        args.append(partials.untyped_storage().array)
        stream = current_stream(device.index)._raw
        codegen.launch(kernel, blocks, _driver.THREADS, stream, args)
        if result is not None:
            total = codegen.partial_sum_kernel(np.dtype(result.dtype.numpy))
            divisor = np.float64(1.0 if g.reduction[0] == "sum" else n)
            sums = partials.untyped_storage().array
            codegen.launch(
                total, 1, _driver.THREADS, stream, [blocks, sums, result.untyped_storage().array, 0, divisor]
            )


class _CodeGenerator:
    """What kiln-cuda registers through ``kiln_register_compilers``: ``codegen(group) -> kernel``."""

    device_type = "cuda"

    def __call__(self, group):
        """A kernel for ``group`` (a kiln.compile ``FusedGroup``), taking and returning cuda tensors."""
        return _Fused(group)


codegen_fused = _CodeGenerator()
