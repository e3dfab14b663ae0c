"""The Numba loops of kiln-cpu's index kernels (:mod:`kiln_cpu.kernels_index`), compiled lazily and cached.

One strided loop per mode moves elements between an *indexed* operand, addressed along one dim by the
values of an index array, and a *plain* operand, addressed by the loop position:

* ``READ``: ``plain[pos] = indexed[pos with dim d replaced by index[pos]]`` (gather, index_select,
  embedding, advanced indexing);
* ``WRITE``: ``indexed[... index[pos] ...] = plain[pos]`` (scatter, index_put);
* ``ADD``: ``indexed[... index[pos] ...] += plain[pos] * alpha`` (scatter_add, index_add, index_put
  with ``accumulate``).

The loop position runs over five dims ``(n0, n1, n2, n3, n4)``, the last one split into blocks: a task
is one ``(i0, i1, i2, block)``, so the caller decides what runs in parallel. Writes are only
parallel over dims other than the indexed one, and each task visits the indexed dim in increasing
order, so duplicate indices land in NumPy's ``np.add.at`` order (the reference's) and the last write
wins as in the reference. Copies (READ, WRITE) run on same-width integer views of the data, so one
specialisation serves float32 and int32 (float64 and int64): NaN payloads and -0.0 are copied as bits.

An index outside ``[0, n)`` (after adding ``n`` to negatives when ``wrap``) is counted in ``bad[0]``
and nothing is read or written for it; the caller hands the call to the reference, which raises.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kiln_cpu._jit_support import _SERIAL, _u

READ, WRITE, ADD = 0, 1, 2


def _make_index_loop(mode: int):
    """The strided loop of ``mode`` (a closure constant: each mode compiles its own loop)."""

    @njit(**_SERIAL)
    def loop(data, d_off, d_st, d_k, idx, i_off, i_st, plain, p_off, p_st, shape, n, wrap, alpha, blk, bad, lo, hi):
        """Tasks [lo, hi) of the iteration ``shape`` (5 dims, the last in blocks of ``blk``): ``data``
        (the indexed operand) at ``d_off + sum(i*d_st) + index*d_k``, ``idx`` and ``plain`` at their
        offsets plus ``sum(i*st)``."""
        _, n1, n2, n3, n4 = shape
        nb = (n4 + blk - 1) // blk
        un = _u(n)
        nbad = 0
        ds4, is4, ps4 = d_st[4], i_st[4], p_st[4]
        for t in range(lo, hi):
            b = t % nb
            r = t // nb
            j2 = r % n2
            r = r // n2
            j1 = r % n1
            j0 = r // n1
            e0 = b * blk
            e1 = min(n4, e0 + blk)
            db = d_off + j0 * d_st[0] + j1 * d_st[1] + j2 * d_st[2]
            ib = i_off + j0 * i_st[0] + j1 * i_st[1] + j2 * i_st[2]
            pb = p_off + j0 * p_st[0] + j1 * p_st[1] + j2 * p_st[2]
            for j3 in range(n3):
                dp = db + j3 * d_st[3]
                ip = ib + j3 * i_st[3]
                pp = pb + j3 * p_st[3]
                if is4 == 0:  # one index value for the whole run: a strided copy (or add) of a run
                    k = np.int64(idx[_u(ip)])
                    if wrap and k < 0:
                        k += n
                    if _u(k) >= un:
                        nbad += 1
                        continue
                    src = dp + k * d_k
                    if ds4 == 1 and ps4 == 1:
                        if mode == READ:
                            for j4 in range(e0, e1):
                                plain[_u(pp + j4)] = data[_u(src + j4)]
                        elif mode == WRITE:
                            for j4 in range(e0, e1):
                                data[_u(src + j4)] = plain[_u(pp + j4)]
                        else:
                            for j4 in range(e0, e1):
                                data[_u(src + j4)] += plain[_u(pp + j4)] * alpha
                    else:
                        if mode == READ:
                            for j4 in range(e0, e1):
                                plain[_u(pp + j4 * ps4)] = data[_u(src + j4 * ds4)]
                        elif mode == WRITE:
                            for j4 in range(e0, e1):
                                data[_u(src + j4 * ds4)] = plain[_u(pp + j4 * ps4)]
                        else:
                            for j4 in range(e0, e1):
                                data[_u(src + j4 * ds4)] += plain[_u(pp + j4 * ps4)] * alpha
                    continue
                for j4 in range(e0, e1):
                    k = np.int64(idx[_u(ip + j4 * is4)])
                    if wrap and k < 0:
                        k += n
                    ok = _u(k) < un
                    if mode == READ:
                        nbad += not ok
                        k = k if ok else 0  # read something harmless; the call is handed back anyway
                        plain[_u(pp + j4 * ps4)] = data[_u(dp + j4 * ds4 + k * d_k)]
                    elif ok:
                        if mode == WRITE:
                            data[_u(dp + j4 * ds4 + k * d_k)] = plain[_u(pp + j4 * ps4)]
                        else:
                            data[_u(dp + j4 * ds4 + k * d_k)] += plain[_u(pp + j4 * ps4)] * alpha
                    else:
                        nbad += 1
        if nbad:
            bad[0] = 1

    return loop


_LOOPS: dict[int, object] = {}


def index_loop(mode: int):
    """The jitted loop for ``mode`` (``READ``, ``WRITE`` or ``ADD``)."""
    fn = _LOOPS.get(mode)
    if fn is None:
        fn = _LOOPS[mode] = _make_index_loop(mode)
    return fn


_ZERO_BLOCK = 512  # elements whose bits are tested together before a block of the copy is skipped


@njit(**_SERIAL)
def copy_nonzero(src, dst, lo, hi):
    """``dst[i] = src[i]`` for the blocks ``[lo, hi)`` of ``_ZERO_BLOCK`` elements (integer views of the
    data): a block whose bits are all zero is not written, so ``dst`` must start as zeros. A zero-filled
    ``dst`` fresh from ``calloc`` then keeps its untouched pages, which a zero source (the gradient
    buffers of backward formulas) never faults in."""
    n = src.shape[0]
    for b in range(lo, hi):
        e0 = b * _ZERO_BLOCK
        e1 = min(n, e0 + _ZERO_BLOCK)
        acc = src[_u(e0)] ^ src[_u(e0)]
        for i in range(e0, e1):
            acc |= src[_u(i)]
        if acc != 0:
            for i in range(e0, e1):
                dst[_u(i)] = src[_u(i)]


@njit(**_SERIAL)
def mask_counts(mask, blk, counts, lo, hi):
    """``counts[b]`` = the True entries of the flat boolean ``mask`` in block ``b`` (``blk`` entries)."""
    n = mask.shape[0]
    for b in range(lo, hi):
        c = 0
        for i in range(b * blk, min(n, (b + 1) * blk)):
            c += np.int64(mask[_u(i)])
        counts[_u(b)] = c


@njit(**_SERIAL)
def mask_positions(mask, blk, starts, pos, lo, hi):
    """The positions of the True entries of the flat ``mask`` in increasing order (``np.flatnonzero``):
    block ``b`` writes its own from ``pos[starts[b]]`` on."""
    n = mask.shape[0]
    for b in range(lo, hi):
        w = starts[b]
        for i in range(b * blk, min(n, (b + 1) * blk)):
            if mask[_u(i)]:
                pos[_u(w)] = i
                w += 1
