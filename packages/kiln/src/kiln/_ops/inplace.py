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


# ---------------------------------------------------------------------------------------- top-level forms

TOP_LEVEL = (
    "abs_",
    "acos_",
    "acosh_",
    "addmv_",
    "arccos_",
    "arccosh_",
    "arcsin_",
    "arcsinh_",
    "arctan_",
    "arctanh_",
    "asin_",
    "asinh_",
    "atan_",
    "atanh_",
    "ceil_",
    "clamp_",
    "clamp_max_",
    "clamp_min_",
    "clip_",
    "cos_",
    "cosh_",
    "deg2rad_",
    "erf_",
    "erfc_",
    "exp2_",
    "exp_",
    "expm1_",
    "fix_",
    "floor_",
    "frac_",
    "gcd_",
    "i0_",
    "lcm_",
    "ldexp_",
    "log10_",
    "log1p_",
    "log2_",
    "log_",
    "logit_",
    "nan_to_num_",
    "neg_",
    "negative_",
    "rad2deg_",
    "reciprocal_",
    "relu_",
    "round_",
    "rsqrt_",
    "sigmoid_",
    "sin_",
    "sinc_",
    "sinh_",
    "sqrt_",
    "square_",
    "tan_",
    "tanh_",
    "trunc_",
    "xlogy_",
)
"""The in-place functions ``kiln`` exports at its top level, as ``torch`` does (``kiln.exp_(t)`` is
``t.exp_()``): each is made from the ``Tensor`` method of that name, with the out-of-place function's
signature."""


def _top_level_inplace(name: str):
    """``kiln.<name>``: calls ``Tensor.<name>`` (looked up per call: the methods derived from op records are
    bound after this module is imported), with the signature of ``Tensor.<name without _>``."""
    import inspect

    def fn(*args, **kwargs):
        return getattr(Tensor, name)(*args, **kwargs)

    base = name[:-1]
    fn.__name__ = fn.__qualname__ = name
    sig = inspect.signature(getattr(Tensor, base))  # the op's, less out= (the result goes into input)
    fn.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "out"])
    fn.__doc__ = f"In-place version of :func:`kiln.{base}`: writes the result into ``input`` and returns it."
    return fn


for _name in TOP_LEVEL:
    globals()[_name] = _top_level_inplace(_name)
