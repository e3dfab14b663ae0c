"""Helpers shared by the layer modules (``_single``/``_pair``/``_triple``, the legacy reduction flags, input-rank
checks, optional parameters) and by the optimizers (``_zero_grad``)."""

from __future__ import annotations

import collections.abc
from itertools import repeat

from kiln import empty
from kiln.nn.parameter import Parameter

__all__ = [
    "_single",
    "_pair",
    "_triple",
    "_ntuple",
    "_reverse_repeat_tuple",
    "_legacy_reduction",
    "_check_input_dims",
    "_zero_grad",
]


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


def _check_input_dims(input, dims) -> None:
    """Raise torch's ``ValueError("expected 2D or 3D input (got 4D input)")`` unless ``input.dim()`` is in ``dims``."""
    if input.dim() not in dims:
        expected = " or ".join(f"{d}D" for d in dims)
        raise ValueError(f"expected {expected} input (got {input.dim()}D input)")


def _zero_grad(params, set_to_none: bool = True) -> None:
    """Reset the gradients of ``params`` (``Module.zero_grad``, ``Optimizer.zero_grad``): to ``None``, or to
    zeros detached from any graph."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()


def _optional_parameter(module, name: str, present: bool, shape, device=None, dtype=None) -> None:
    """Register an uninitialised ``Parameter`` of ``shape`` as ``module.<name>`` when ``present``, else ``None``
    (as torch does for an absent ``bias`` or a non-affine ``weight``)."""
    if present:
        setattr(module, name, Parameter(empty(shape, device=device, dtype=dtype)))
    else:
        module.register_parameter(name, None)
