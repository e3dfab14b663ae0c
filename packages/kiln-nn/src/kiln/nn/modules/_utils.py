"""Argument helpers shared by the layer modules: ``_single``/``_pair``/``_triple`` and the legacy reduction flags."""

from __future__ import annotations

import collections.abc
from itertools import repeat

__all__ = ["_single", "_pair", "_triple", "_ntuple", "_reverse_repeat_tuple", "_legacy_reduction"]


def _ntuple(n: int, name: str = "parse"):
    def parse(x):
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))

    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
_triple = _ntuple(3, "_triple")


def _reverse_repeat_tuple(t, n: int) -> tuple:
    """``(a, b)`` -> ``(b, b, a, a)`` for ``n=2``: per-dim padding in ``F.pad``'s last-dim-first order."""
    return tuple(x for x in reversed(t) for _ in range(n))


def _legacy_reduction(size_average, reduce, emit_warning: bool = True) -> str:
    """The ``reduction`` string that the deprecated ``size_average``/``reduce`` flags stand for."""
    import warnings

    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if size_average and reduce:
        ret = "mean"
    elif reduce:
        ret = "sum"
    else:
        ret = "none"
    if emit_warning:
        warnings.warn(
            f"size_average and reduce args will be deprecated, please use reduction='{ret}' instead.",
            stacklevel=3,
        )
    return ret
