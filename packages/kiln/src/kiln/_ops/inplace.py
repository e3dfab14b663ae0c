"""In-place variants (``add_``, ``mul_``, ``exp_``...) derived from the out-of-place ops.

One definition serves them all: :func:`kiln._ops.copy.inplace_variant` computes out of place, writes
into ``self`` and moves ``self``'s autograd history. ``needs_self`` marks ops whose backward reads
the old value of ``self`` (so autograd keeps a copy of it).
"""

from __future__ import annotations

from kiln._ops import binary_math as bm
from kiln._ops import clamp as cl
from kiln._ops import elementwise as ew
from kiln._ops import reduction as red
from kiln._ops import special as sp
from kiln._ops import ternary_math as tm
from kiln._ops import unary_math as um
from kiln._ops.copy import inplace_variant
from kiln._tensor import Tensor

# op -> whether its backward formula reads ``input`` (the value an in-place write destroys)
_INPLACE = {
    ew.add: False,
    ew.sub: False,
    ew.mul: True,
    ew.div: True,
    ew.pow: True,
    ew.neg: False,
    ew.abs: True,
    ew.sign: False,
    ew.exp: False,
    ew.log: True,
    ew.sqrt: False,
    ew.sin: True,
    ew.cos: True,
    ew.tanh: False,
    ew.sigmoid: False,
    ew.relu: False,
    ew.eq: False,
    ew.ne: False,
    ew.lt: False,
    ew.le: False,
    ew.gt: False,
    ew.ge: False,
    ew.bitwise_and: False,
    ew.bitwise_or: False,
    ew.bitwise_xor: False,
    ew.bitwise_not: False,
    ew.logical_not: False,
    red.maximum: True,
    red.minimum: True,
    um.exp2: False,
    um.expm1: False,
    um.log2: True,
    um.log10: True,
    um.log1p: True,
    um.rsqrt: False,
    um.reciprocal: False,
    um.square: True,
    um.sgn: False,
    um.tan: False,
    um.asin: True,
    um.acos: True,
    um.atan: True,
    um.sinh: True,
    um.cosh: True,
    um.asinh: True,
    um.acosh: True,
    um.atanh: True,
    sp.erf: True,
    sp.erfc: True,
    sp.erfinv: False,
    um.logit: True,
    um.floor: False,
    um.ceil: False,
    um.trunc: False,
    um.round: False,
    um.frac: False,
    um.nan_to_num: True,
    bm.atan2: True,
    bm.hypot: True,
    bm.copysign: True,
    bm.fmod: True,
    bm.remainder: True,
    bm.floor_divide: False,
    cl.clamp: True,
    cl.clamp_min: True,
    cl.clamp_max: True,
    tm.lerp: True,
    tm.addcmul: False,
    tm.addcdiv: False,
    bm.logical_and: False,
    bm.logical_or: False,
    bm.logical_xor: False,
    bm.bitwise_left_shift: False,
    bm.bitwise_right_shift: False,
}
_ALIASES = {
    "add_": ("__iadd__",),
    "sub_": ("__isub__",),
    "mul_": ("__imul__",),
    "div_": ("__itruediv__",),
    "pow_": ("__ipow__",),
    "bitwise_and_": ("__iand__",),
    "bitwise_or_": ("__ior__",),
    "bitwise_xor_": ("__ixor__",),
    "asin_": ("arcsin_",),
    "acos_": ("arccos_",),
    "atan_": ("arctan_",),
    "asinh_": ("arcsinh_",),
    "acosh_": ("arccosh_",),
    "atanh_": ("arctanh_",),
    "atan2_": ("arctan2_",),
    "trunc_": ("fix_",),
    "clamp_": ("clip_",),
    "remainder_": ("__imod__",),
    "floor_divide_": ("__ifloordiv__",),
    "bitwise_left_shift_": ("__ilshift__",),
    "bitwise_right_shift_": ("__irshift__",),
}


def install_inplace_methods() -> None:
    """Bind ``<op>_`` (and ``__i<op>__``) on ``Tensor`` for every op in the table."""
    for fn, needs_self in _INPLACE.items():
        name = f"{fn.op.name}_"
        method = inplace_variant(fn, name, f"In-place version of :func:`kiln.{fn.op.name}`.", needs_self)
        setattr(Tensor, name, method)
        for alias in _ALIASES.get(name, ()):
            setattr(Tensor, alias, method)
    Tensor.divide_ = Tensor.true_divide_ = Tensor.div_
    Tensor.multiply_ = Tensor.mul_
    Tensor.subtract_ = Tensor.sub_
