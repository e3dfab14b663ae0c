"""In-place variants (``add_``, ``mul_``, ``exp_``...) derived from the out-of-place ops' records.

One definition serves them all: :func:`kiln._ops.copy.inplace_variant` computes out of place, writes
into ``self`` and moves ``self``'s autograd history. Which ops have a variant is the op record's
``inplace`` field; its method names come from the op's ``methods`` (``OpDef.inplace_methods``), and
whether autograd keeps a copy of ``self``'s old value from its backward formula
(``OpDef.inplace_saves_self``). No list of ops is kept here.
"""

from __future__ import annotations

from kiln._dispatch import OPS
from kiln._ops.copy import inplace_variant
from kiln._tensor import Tensor


def install_inplace_methods() -> None:
    """Bind the in-place methods (``<op>_``, ``__i<op>__`` and the aliases' ``_`` forms) of every op whose
    record says it has an in-place variant."""
    for opdef in OPS.values():
        if not opdef.inplace:
            continue
        doc = f"In-place version of :func:`kiln.{opdef.name}`."
        method = inplace_variant(opdef.public, f"{opdef.name}_", doc, opdef.inplace_saves_self)
        for name in opdef.inplace_methods:
            setattr(Tensor, name, method)
