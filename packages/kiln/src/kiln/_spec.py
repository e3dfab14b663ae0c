"""The kernel contract's first argument: :class:`Spec`, what an op's meta function worked out.

A meta function validates an op's arguments and returns a ``Spec`` for its result (a tuple of them
for ops with several outputs). Every kernel is called as ``kernel(spec, *args)`` and reads the spec's
fields by name, so no kernel re-validates or re-derives what the meta function already knows.

The base fields are ``shape``, ``dtype`` and ``device``. Op families add named extras through the
subclasses below (a reduction's normalised ``dims``, a comparison's ``compute_dtype``, a pooling
window's ``taps``...). A spec is a tuple underneath (``spec[0]`` is its shape), cheap to build and to
read, which matters on the eager hot path (see the architecture page).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, ClassVar, NamedTuple

try:  # CPython's C accessor of a tuple field, the one collections.namedtuple uses: cheaper than a property
    from _collections import _tuplegetter as _field
except ImportError:  # pragma: no cover - other Pythons

    def _field(index: int, doc: str) -> property:
        return property(itemgetter(index), doc=doc)


__all__ = [
    "Spec",
    "ComputeSpec",
    "ReductionSpec",
    "DimSpec",
    "IndexSpec",
    "PoolSpec",
    "ConvSpec",
    "WindowSpec",
    "FoldSpec",
    "NormSpec",
    "NormLayout",
    "StridedSpec",
    "SPEC_TYPES",
]


class Spec(tuple):
    """The result of one op output as its meta function computed it: ``shape``, ``dtype``, ``device``.

    Build one from a tuple of its fields in order, ``Spec((shape, dtype, device))`` (or with keywords,
    :meth:`make`); subclasses add named extras after the three base fields. Specs are immutable.
    """

    __slots__ = ()
    fields: ClassVar[tuple[str, ...]] = ("shape", "dtype", "device")
    """The field names, in tuple order."""

    shape = _field(0, "The output's shape, a tuple of ints.")
    dtype = _field(1, "The output's dtype (a :class:`kiln.dtype`).")
    device = _field(2, "The output's device (a :class:`kiln.device`).")

    @classmethod
    def make(cls, shape: tuple, dtype: Any, device: Any, **extras: Any) -> Spec:
        """A spec from its fields by name: ``ReductionSpec.make(shape, dtype, device, dims=(0,))``."""
        names = cls.fields[3:]
        unknown = set(extras) - set(names)
        missing = [n for n in names if n not in extras]
        if unknown or missing:
            raise TypeError(
                f"{cls.__name__}.make() takes the extras {list(names)}; missing {missing}, unexpected {sorted(unknown)}"
            )
        return cls((tuple(shape), dtype, device, *(extras[n] for n in names)))

    def replace(self, **fields: Any) -> Spec:
        """The same spec with some fields changed (``spec.replace(device=cpu)``)."""
        values = list(self)
        for name, value in fields.items():
            if name not in self.fields:
                raise TypeError(f"{type(self).__name__} has no field {name!r}; its fields are {list(self.fields)}")
            values[self.fields.index(name)] = value
        return type(self)(values)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(self.fields, self))
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        return (type(self), (tuple(self),))


def _family(name: str, doc: str, **extras: str) -> type[Spec]:
    """A :class:`Spec` subclass with the named extras (each documented) after the base fields."""
    namespace: dict[str, Any] = {"__slots__": (), "__doc__": doc, "fields": Spec.fields + tuple(extras)}
    for i, (field, field_doc) in enumerate(extras.items(), start=3):
        namespace[field] = _field(i, field_doc)
    cls = type(name, (Spec,), namespace)
    cls.__module__ = __name__
    return cls


ComputeSpec = _family(
    "ComputeSpec",
    "An elementwise op that computes in another dtype than it returns: comparisons and logical ops "
    "compute in the operands' promoted dtype and return bool.",
    compute_dtype="The dtype both operands are cast to before computing (PyTorch's promoted type).",
)

ReductionSpec = _family(
    "ReductionSpec",
    "A reduction or a statistic over some dims (sum, mean, amax, var, logsumexp, norm...).",
    dims="The reduced dims of the input, normalised: sorted, non-negative and unique (all dims for ``dim=None``).",
)

DimSpec = _family(
    "DimSpec",
    "An op along one dim: scans (cumsum), stack, softmax, sort, gather/scatter and index ops, and the "
    "reductions over one dim that also return indices (max/min/median with ``dim``, argmax, argmin).",
    dim="The dim the op works along, normalised to be non-negative; None where the op works on the "
    "flattened input (``argmax(dim=None)``, ``unique(dim=None)``).",
)

IndexSpec = _family(
    "IndexSpec",
    "An indexing op that broadcasts its indices or values to a shape the meta function computed.",
    index_shape="The broadcast shape of the indices (or of the values written).",
)

PoolSpec = _family(
    "PoolSpec",
    "A pooling op: the window of every output position over the input's pooled (trailing) dims.",
    taps="Per pooled dim, an int array of shape (output size, window) of input positions, -1 for "
    "padding; adaptive pools have windows of varying length, padded with -1.",
    divisor="For average pools: the divisor of each output position (an array broadcast over the "
    "pooled output dims, or an int), following ``count_include_pad``/``divisor_override``; None for "
    "max pools.",
)

ConvSpec = _family(
    "ConvSpec",
    "A convolution (or transposed convolution); every parameter expanded to one int per spatial dim.",
    stride="Stride per spatial dim.",
    padding="Padding per spatial dim (both sides).",
    dilation="Dilation per spatial dim.",
    output_padding="Output padding per spatial dim (transposed convolutions; zeros otherwise).",
)

WindowSpec = _family(
    "WindowSpec",
    "``unfold`` (im2col): sliding blocks over the spatial dims.",
    kernel_size="Block size per spatial dim.",
    dilation="Dilation per spatial dim.",
    padding="Padding per spatial dim.",
    stride="Stride per spatial dim.",
)

FoldSpec = _family(
    "FoldSpec",
    "``fold`` (col2im): sliding blocks summed back into an image.",
    kernel_size="Block size per spatial dim.",
    dilation="Dilation per spatial dim.",
    padding="Padding per spatial dim.",
    stride="Stride per spatial dim.",
    blocks="Number of blocks per spatial dim.",
    output_size="The image's spatial size.",
)


class NormLayout(NamedTuple):
    """How one normalization sees its input: statistics over ``red`` of the input viewed as
    ``stats_shape``; affine parameters viewed as ``param_view`` (broadcast against the input), their
    gradients summed over the input dims ``param_red``; ``kind``: "batch", "layer" or "group"."""

    stats_shape: tuple
    red: tuple
    param_view: tuple
    param_red: tuple
    kind: str = "batch"


NormSpec = _family(
    "NormSpec",
    "A normalization (batch, instance, layer, group norm) forward or backward.",
    layout="A :class:`NormLayout`: the statistics' dims and the affine parameters' view.",
)

StridedSpec = _family(
    "StridedSpec",
    "A view with explicit strides (``as_strided``, ``view``, ``select``...): the result shares storage.",
    stride="The view's strides, in elements.",
    offset="The view's storage offset, in elements.",
)

SPEC_TYPES: tuple[type[Spec], ...] = (
    Spec,
    ComputeSpec,
    ReductionSpec,
    DimSpec,
    IndexSpec,
    PoolSpec,
    ConvSpec,
    WindowSpec,
    FoldSpec,
    NormSpec,
    StridedSpec,
)
"""Every spec type, base first (documented on the architecture page)."""
