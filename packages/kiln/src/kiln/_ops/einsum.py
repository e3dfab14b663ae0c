"""``einsum``: the equation parser and an op with a NumPy reference kernel and a backward written as
einsums, so higher-order gradients work.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["einsum"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- einsum

_LETTERS = string.ascii_letters


def _parse_einsum(equation: str, shapes: Sequence[tuple]):
    """``equation`` in explicit form with ellipses replaced by letters: (input subscripts, output)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) > len(shapes):
        raise RuntimeError("einsum(): fewer operands were provided than specified in the equation")
    if len(terms) < len(shapes):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation")
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in _LETTERS if c not in used]
    ell_nd = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            ell_nd = max(ell_nd, len(shape) - (len(term) - 3))
    ell = "".join(spare[:ell_nd])
    ins = []
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        nlab = len(term) - 3 if "..." in term else len(term)
        if ("..." not in term and nlab != len(shape)) or ("..." in term and nlab > len(shape)):
            raise RuntimeError(
                f"einsum(): the number of subscripts in the equation ({nlab}) "
                + ("is more than" if "..." in term else "does not match")
                + f" the number of dimensions ({len(shape)}) for operand {i}"
                + ("" if "..." in term else " and no ellipsis was given")
            )
        if "..." in term:
            n = len(shape) - nlab
            term = term.replace("...", ell[ell_nd - n :])
        ins.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in ins:
            for c in t:
                if c not in ell:
                    counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes: dict[str, int] = {}
    for i, (t, shape) in enumerate(zip(ins, shapes)):
        for c, s in zip(t, shape):
            if c in sizes and sizes[c] != s and s != 1 and sizes[c] != 1:
                raise RuntimeError(
                    f"einsum(): subscript {c} has size {s} for operand {i} which does not broadcast with "
                    f"previously seen size {sizes[c]}"
                )
            sizes[c] = max(sizes.get(c, s), s)
    for c in out:
        if c not in sizes:
            raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation for any input operand")
    return ins, out, sizes


def _einsum_meta(equation, operands):
    if not isinstance(equation, str):
        raise TypeError(f"einsum(): argument 'equation' must be str, not {type(equation).__name__}")
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    for o in operands:
        if not isinstance(o, Tensor):
            raise TypeError(f"einsum(): operands must be Tensors, not {type(o).__name__}")
    d = operands[0]._dtype
    for o in operands[1:]:
        if o._dtype is not d:
            raise RuntimeError(f"expected scalar type {scalar_type_name(d)} but found {scalar_type_name(o._dtype)}")
    _, out, sizes = _parse_einsum(equation, [o._shape for o in operands])
    return Spec((tuple(sizes[c] for c in out), d, operands[0]._device))


def _einsum_ref(spec, equation, operands):
    ins, out, _ = _parse_einsum(equation, [a.shape for a in operands])
    compute = _compute_np(spec.dtype)
    r = np.einsum(",".join(ins) + "->" + out, *[a.astype(compute, copy=False) for a in operands])
    return np.asarray(r, compute)


def _einsum_backward(grad, equation, operands, operands_shape):
    from kiln._ops.creation import eye, ones

    ins, out, sizes = _parse_einsum(equation, list(operands_shape))
    used = set("".join(ins) + out)
    spare = [c for c in _LETTERS if c not in used]
    grads = []
    for i, term in enumerate(ins):
        # an operand is saved only while another one needs a gradient (so the one needing it may be None)
        others = [o for j, o in enumerate(operands) if j != i]
        if any(o is None for o in others) or (operands[i] is not None and not operands[i].requires_grad):
            grads.append(None)
            continue
        subs = [out] + [t for j, t in enumerate(ins) if j != i]
        ops = [grad, *others]
        present = set("".join(subs))
        target = ""
        seen = set()
        for c in term:
            if c in seen:  # a repeated subscript: a fresh letter tied to c by an identity matrix
                f = spare.pop()
                subs.append(c + f)
                ops.append(eye(sizes[c], dtype=grad.dtype, device=grad.device))
                target += f
                continue
            seen.add(c)
            if c not in present:  # summed in this operand alone: broadcast back
                subs.append(c)
                ops.append(ones(sizes[c], dtype=grad.dtype, device=grad.device))
                present.add(c)
            target += c
        g = einsum(",".join(subs) + "->" + target, *ops)
        shape = operands_shape[i]
        if tuple(g.shape) != tuple(shape):  # size-1 dims broadcast against others
            dims = tuple(k for k, s in enumerate(shape) if s == 1 and g.shape[k] != 1)
            g = g.sum(dims, keepdim=True)
        grads.append(g)
    return grads


@op(
    tags=("linalg",),
    meta=_einsum_meta,
    reference=_einsum_ref,
    backward=_einsum_backward,
    autocast="lower",
    name="einsum",
)
def _einsum(equation: str, operands: Sequence[Tensor]) -> Tensor:
    """Einstein summation over ``operands`` (``torch.einsum``)."""


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation: ``einsum("ij,jk->ik", a, b)`` (implicit output, ellipsis and repeated
    subscripts included); operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _einsum(equation, list(operands))
