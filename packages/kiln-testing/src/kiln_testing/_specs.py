"""How to call each op: the argument-spec table the conformance suite generates its inputs from.

Every op in the registry (``kiln.backend.ops()``) is called through its public function (``opdef.public``) with the
:class:`Case` objects its spec produces for one dtype: random, transposed, strided (a non-zero storage
offset included), broadcast (expanded, stride 0), 0-d and empty inputs, Python scalars, a 0-d CPU
operand, mixed dtypes, IEEE specials. A tensor argument is a :class:`T`: its values as a host array
plus a view recipe, so the *same* tensor can be built on the device under test and on the CPU.

An op missing from :data:`SPECS` gets a spec inferred from its signature when it has a familiar one
(unary ``(input, [options with defaults])``, binary ``(input, other)``, reduction ``(input, dim, keepdim)``); otherwise the
suite reports it as "no spec". kiln-testing's own tests fail when a core op has no spec, so this
table grows with the core.
"""

from __future__ import annotations

import dataclasses
import importlib
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln

__all__ = ["T", "Case", "OpSpec", "Ctx", "DEVICE", "SPECS", "spec_for", "INTERNAL_ONLY"]


class _DevicePlaceholder:
    """Stands for "the device this case runs on" in an op's arguments (creation and copy ops)."""

    def __repr__(self) -> str:
        return "DEVICE"


DEVICE = _DevicePlaceholder()

LAYOUTS = ("contiguous", "transposed", "strided", "expanded")


@dataclasses.dataclass(eq=False)
class T:
    """A tensor argument: the leaf's values (``base``, a host array) and the view taken of the leaf.

    ``on="cpu"`` keeps the tensor on the CPU even when the case runs on a device (a 0-d CPU operand,
    which PyTorch lets mix with any device). ``grad``: the leaf requires grad in autograd checks when
    its dtype is floating point.
    """

    base: np.ndarray
    dtype: kiln.dtype
    shape: tuple
    layout: str = "contiguous"
    on: str = "device"
    grad: bool = True

    def build(self, device, *, requires_grad: bool = False) -> tuple[kiln.Tensor, kiln.Tensor]:
        """(leaf, tensor): the leaf created on ``device`` (or the CPU) and the view the op receives."""
        dev = "cpu" if self.on == "cpu" else device
        leaf = kiln.tensor(self.base, dtype=self.dtype, device=dev)
        if requires_grad:
            leaf.requires_grad_(True)
        return leaf, _apply_layout(leaf, self.layout, self.shape)

    def __repr__(self) -> str:
        where = ", on cpu" if self.on == "cpu" else ""
        return f"T({self.layout} {self.shape} {str(self.dtype).removeprefix('kiln.')}{where})"


def _apply_layout(t: kiln.Tensor, layout: str, shape: tuple) -> kiln.Tensor:
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        return t.permute(*reversed(range(nd)))
    if layout == "strided":
        if nd == 0:
            return t[1]
        return t[tuple(slice(None, None, 2) for _ in shape[:-1]) + (slice(1, None, 2),)]
    if layout == "expanded":
        return t.expand(*shape) if nd else t
    return t


@dataclasses.dataclass
class Case:
    """One call of an op: positional ``args`` (with :class:`T` and :data:`DEVICE` placeholders) and ``kwargs``.

    ``values``: compare values (False for uninitialised results: only shape, dtype and device);
    ``grad``: also used by the autograd checks; ``inplace``: index of the argument the op writes
    into and returns (compared after the call instead of the result); ``also_written``: indices of
    further arguments it writes into (compared after the call too).
    """

    label: str
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    values: bool = True
    grad: bool = True
    inplace: int | None = None
    also_written: tuple[int, ...] = ()

    def tensors(self) -> list[T]:
        """Every tensor argument, those inside lists and tuples (``cat``'s) included."""
        found: list[T] = []

        def walk(a):
            if isinstance(a, T):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)

        for a in (*self.args, *self.kwargs.values()):
            walk(a)
        return found


class Ctx:
    """What a spec needs to make one dtype's cases: the dtype, the device's dtypes, a seeded generator."""

    def __init__(self, op_name: str, dtype: kiln.dtype, device_dtypes: tuple):
        self.dtype = dtype
        self.device_dtypes = tuple(device_dtypes)
        self.rng = np.random.default_rng(zlib.crc32(f"{op_name}/{dtype}".encode()))

    def values(self, shape: tuple, dtype, *, low: float, high: float, exclude_zero: bool) -> np.ndarray:
        rng = self.rng
        if dtype is kiln.bool:
            a = rng.random(shape) < 0.5
            return np.ones(shape, bool) if exclude_zero else a
        if not dtype.is_floating_point:
            lo, hi = int(np.floor(low)), int(np.ceil(high))
            if dtype is kiln.uint8:  # unsigned: the same width of range, from 0
                lo, hi = 0, max(hi - lo, 1)
            a = rng.integers(lo, hi + 1, size=shape)
            if exclude_zero:
                a = np.where(a == 0, 1, a)
            return a.astype(dtype.numpy)
        a = rng.uniform(low, high, size=shape)
        if exclude_zero:
            a = np.where(np.abs(a) < 0.25, 0.5, a)
        return a.astype(dtype.numpy)

    def t(
        self,
        shape: tuple,
        *,
        dtype: kiln.dtype | None = None,
        layout: str = "contiguous",
        low: float = -3.0,
        high: float = 3.0,
        exclude_zero: bool = False,
        on: str = "device",
        grad: bool = True,
    ) -> T:
        """A tensor argument of ``shape`` (the case's dtype by default) laid out per ``layout``."""
        dtype = dtype or self.dtype
        shape = tuple(shape)
        nd = len(shape)

        def data(s):
            return self.values(s, dtype, low=low, high=high, exclude_zero=exclude_zero)

        if layout == "transposed" and nd >= 2:
            base = np.ascontiguousarray(np.transpose(data(shape)))
        elif layout == "strided":
            base = data((3,)) if nd == 0 else data(tuple(2 * s for s in shape[:-1]) + (2 * shape[-1] + 1,))
        elif layout == "expanded":
            base = data(tuple(1 if i % 2 == 0 else s for i, s in enumerate(shape)))
        else:
            base = data(shape)
        return T(base=base, dtype=dtype, shape=shape, layout=layout, on=on, grad=grad)

    def specials(self, dtype: kiln.dtype | None = None) -> T:
        """IEEE special values (NaN, ±inf, ±0) among ordinary ones, for floating dtypes."""
        dtype = dtype or self.dtype
        values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, 2.0, -2.5], dtype=np.float64)
        return T(base=values.astype(dtype.numpy), dtype=dtype, shape=(10,), grad=False)

    def other_dtype(self) -> kiln.dtype | None:
        """A second dtype the device declares, for mixed-dtype cases (promotion on the device)."""
        for d in (kiln.float32, kiln.int64, kiln.float64, kiln.int32):
            if d is not self.dtype and d in self.device_dtypes:
                return d
        return None


@dataclasses.dataclass
class OpSpec:
    """How to call one op: ``cases(ctx)`` for a dtype; tolerances beyond the dtype defaults; whether
    its result is a view sharing the input's storage."""

    cases: Callable[[Ctx], list[Case]]
    rtol: float | None = None
    atol: float | None = None
    view: bool = False
    inferred: bool = False


# ---------------------------------------------------------------------------------------- families


def unary(low: float = -3.0, high: float = 3.0, *, variants: tuple[dict, ...] = ({},), **spec) -> OpSpec:
    """``f(input)`` on every layout, 0-d, empty, and IEEE specials for floating dtypes — once per keyword
    variant in ``variants``. ``low``/``high``: the domain the values are drawn from."""

    def cases(c: Ctx) -> list[Case]:
        def x(shape, **k):
            return c.t(shape, low=low, high=high, **k)

        base = [
            ("contiguous", (x((3, 4)),)),
            ("transposed", (x((3, 4), layout="transposed"),)),
            ("strided", (x((2, 3, 4), layout="strided"),)),
            ("expanded", (x((3, 4), layout="expanded"),)),
            ("0-d", (x(()),)),
            ("0-d-strided", (x((), layout="strided"),)),
            ("empty", (x((0, 3)),)),
        ]
        out = []
        for kw in variants:
            suffix = ",".join(f"{k}={v!r}" for k, v in kw.items())
            out += [Case(label + (f"[{suffix}]" if suffix else ""), args, dict(kw)) for label, args in base]
            if c.dtype.is_floating_point:
                out.append(Case("specials" + (f"[{suffix}]" if suffix else ""), (c.specials(),), dict(kw), grad=False))
        return out

    return OpSpec(cases, **spec)


def binary(
    low: float = -3.0,
    high: float = 3.0,
    *,
    other_low: float | None = None,
    other_high: float | None = None,
    nonzero_other: bool = False,
    scalars: tuple = (2, 1.5, True),
    tensor_only: bool = False,
    variants: tuple[dict, ...] = ({},),
    extra: Callable[[Ctx], list[Case]] | None = None,
    **spec,
) -> OpSpec:
    """``f(input, other)``: same shapes, strided, broadcast, expanded, 0-d, a 0-d (device or CPU)
    operand, empty, mixed dtypes and Python scalars — once per keyword variant in ``variants``."""
    olow = low if other_low is None else other_low
    ohigh = high if other_high is None else other_high

    def cases(c: Ctx) -> list[Case]:
        def a(shape, **k):
            return c.t(shape, low=low, high=high, **k)

        def b(shape, **k):
            return c.t(shape, low=olow, high=ohigh, exclude_zero=nonzero_other, **k)

        base = [
            ("same-shape", (a((3, 4)), b((3, 4)))),
            ("strided", (a((3, 4), layout="transposed"), b((3, 4), layout="strided"))),
            ("broadcast", (a((2, 1, 4)), b((3, 1)))),
            ("expanded", (a((3, 4), layout="expanded"), b((4,)))),
            ("0-d", (a(()), b(()))),
            ("0-d-operand", (a((3, 4)), b(()))),
            ("cpu-0-d-operand", (a((2, 3)), b((), on="cpu", grad=False))),
            ("empty", (a((0, 4)), b((4,)))),
        ]
        other = c.other_dtype()
        if other is not None:
            base.append((f"mixed-{str(other).removeprefix('kiln.')}", (a((3, 4)), b((3, 4), dtype=other))))
        if not tensor_only:
            base += [(f"scalar-{s!r}", (a((3, 4)), s)) for s in scalars]
        out = []
        for kw in variants:
            suffix = ",".join(f"{k}={v!r}" for k, v in kw.items())
            out += [Case(label + (f"[{suffix}]" if suffix else ""), args, dict(kw)) for label, args in base]
        if extra is not None:
            out += extra(c)
        return out

    return OpSpec(cases, **spec)


def reduction(variants: Callable[[int], list[dict]], **spec) -> OpSpec:
    """``f(input, ...)`` over all layouts, 0-d and empty inputs, with keyword ``variants(ndim)``."""

    def cases(c: Ctx) -> list[Case]:
        inputs = [
            ("contiguous", c.t((2, 3, 4))),
            ("transposed", c.t((3, 4), layout="transposed")),
            ("strided", c.t((2, 3, 4), layout="strided")),
            ("expanded", c.t((3, 4), layout="expanded")),
            ("0-d", c.t(())),
            ("empty", c.t((0, 3))),
        ]
        out = []
        for label, x in inputs:
            for kw in variants(len(x.shape)):
                suffix = ",".join(f"{k}={v!r}" for k, v in kw.items())
                out.append(Case(f"{label}[{suffix}]" if suffix else label, (x,), dict(kw)))
        if c.dtype.is_floating_point:
            out.append(Case("specials", (c.specials(),), dict(variants(1)[0]), grad=False))
        return out

    return OpSpec(cases, **spec)


def _dims_sum(nd: int) -> list[dict]:
    if nd == 0:
        return [{}, {"dim": 0}, {"dim": -1, "keepdim": True}]
    v = [{}, {"dim": 1}, {"dim": -1, "keepdim": True}]
    if nd >= 3:
        v.append({"dim": (0, 2)})
    return v


def _dims_required(nd: int) -> list[dict]:
    if nd == 0:
        return [{"dim": 0}, {"dim": -1, "keepdim": True}]
    return [{"dim": 1}, {"dim": -1, "keepdim": True}, {"dim": 0}]


def _scan_dims(nd: int) -> list[dict]:
    return [{"dim": 0}, {"dim": -1}] + ([{"dim": 1, "dtype": kiln.float64}] if nd >= 2 else [])


def _dims_optional_int(nd: int) -> list[dict]:
    return [{}] + _dims_required(nd)


def _sum_with_dtype(nd: int) -> list[dict]:
    return _dims_sum(nd) + [{"dtype": kiln.float64}]


def explicit(make: Callable[[Ctx], list[Case]], **spec) -> OpSpec:
    """An op whose cases are written out by hand."""
    return OpSpec(make, **spec)


# ---------------------------------------------------------------------------------------- hand-written


def _where(c: Ctx) -> list[Case]:
    def cond(shape, **k):
        return c.t(shape, dtype=kiln.bool, grad=False, **k)

    return [
        Case("same-shape", (cond((3, 4)), c.t((3, 4)), c.t((3, 4)))),
        Case("broadcast", (cond((3, 1)), c.t((3, 4)), c.t((4,)))),
        Case(
            "strided",
            (cond((3, 4), layout="strided"), c.t((3, 4), layout="transposed"), c.t((3, 4), layout="expanded")),
        ),
        Case("scalar-other", (cond((3, 4)), c.t((3, 4)), 0.0)),
        Case("scalar-input", (cond((3, 4)), 2, c.t((3, 4)))),
        Case("0-d", (cond(()), c.t(()), c.t(()))),
        Case("empty", (cond((0, 4)), c.t((0, 4)), c.t((4,)))),
    ]


def _bmm(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("plain", (x((2, 3, 4)), x((2, 4, 5)))),
        Case("strided", (x((2, 3, 4), layout="transposed"), x((2, 4, 5), layout="strided"))),
        Case("empty", (x((0, 3, 4)), x((0, 4, 5)))),
    ]


def _add_product(batched: bool):
    def make(c: Ctx) -> list[Case]:
        x = c.t
        b = (2,) if batched else ()
        return [
            Case("plain", (x(b + (3, 5)), x(b + (3, 4)), x(b + (4, 5)))),
            Case("broadcast-input", (x((5,)), x(b + (3, 4), layout="transposed"), x(b + (4, 5)))),
            Case("scaled", (x((1, 5)), x(b + (3, 4)), x(b + (4, 5), layout="strided")), {"beta": 0.5, "alpha": 2}),
            Case("beta-0", (x(b + (3, 5)), x(b + (3, 4)), x(b + (4, 5))), {"beta": 0}),
        ]

    return make


def _matmul(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("mm", (x((3, 4)), x((4, 5)))),
        Case("mm-strided", (x((3, 4), layout="transposed"), x((4, 5), layout="strided"))),
        Case("mm-expanded", (x((3, 4), layout="expanded"), x((4, 2)))),
        Case("batched-broadcast", (x((2, 3, 4)), x((4, 5)))),
        Case("batched", (x((2, 1, 3, 4)), x((3, 4, 2)))),
        Case("mv", (x((3, 4)), x((4,)))),
        Case("vm", (x((4,)), x((4, 5)))),
        Case("dot", (x((4,)), x((4,)))),
        Case("empty-rows", (x((0, 4)), x((4, 5)))),
        Case("empty-inner", (x((3, 0)), x((0, 5)))),
        Case("shape-mismatch", (x((3, 4)), x((5, 2)))),
    ]


def _view(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("2d", (x((3, 4)), (4, 3))),
        Case("flatten", (x((3, 4)), (-1,))),
        Case("3d", (x((2, 3, 4)), (6, 4))),
        Case("0-d", (x(()), (1,))),
        Case("empty", (x((0, 3)), (3, 0))),
        Case("strided-compatible", (x((3, 4), layout="strided"), (3, 2, 2))),
        Case("transposed-incompatible", (x((3, 4), layout="transposed"), (12,))),
    ]


def _permute(c: Ctx) -> list[Case]:
    return [
        Case("3d", (c.t((2, 3, 4)), (2, 0, 1))),
        Case("transposed", (c.t((3, 4), layout="transposed"), (1, 0))),
        Case("0-d", (c.t(()), ())),
    ]


def _transpose(c: Ctx) -> list[Case]:
    return [
        Case("3d", (c.t((2, 3, 4)), 0, 2)),
        Case("strided", (c.t((3, 4), layout="strided"), -1, 0)),
    ]


def _t(c: Ctx) -> list[Case]:
    return [Case("2d", (c.t((3, 4)),)), Case("1d", (c.t((5,)),)), Case("0-d", (c.t(()),))]


def _expand(c: Ctx) -> list[Case]:
    return [
        Case("column", (c.t((3, 1)), (3, 4))),
        Case("new-dims", (c.t((4,)), (2, 4))),
        Case("0-d", (c.t(()), (2, 2))),
        Case("strided", (c.t((3, 1), layout="strided"), (2, 3, 5))),
    ]


def _unsqueeze(c: Ctx) -> list[Case]:
    return [
        Case("front", (c.t((3, 4)), 0)),
        Case("back", (c.t((3, 4)), -1)),
        Case("transposed", (c.t((3, 4), layout="transposed"), 1)),
        Case("0-d", (c.t(()), 0)),
    ]


def _squeeze(c: Ctx) -> list[Case]:
    return [
        Case("all", (c.t((3, 1, 4)), None)),
        Case("dim", (c.t((3, 1, 4)), 1)),
        Case("dims", (c.t((1, 3, 1)), (0, 2))),
        Case("0-d", (c.t(()), None)),
    ]


def _index_view(c: Ctx) -> list[Case]:
    return [
        Case("int", (c.t((4, 5)), (1,))),
        Case("step", (c.t((4, 5)), (slice(None, None, 2),))),
        Case("ellipsis", (c.t((2, 3, 4)), (Ellipsis, 1))),
        Case("none", (c.t((4, 5)), (None, slice(1, 3)))),
        Case("transposed", (c.t((4, 5), layout="transposed"), (slice(1, None), -1))),
        Case("out-of-range", (c.t((4, 5)), (7,))),
    ]


def _index_backward(c: Ctx) -> list[Case]:
    return [
        Case("int", (c.t((5,)), (4, 5), (1,))),
        Case("step", (c.t((2, 5)), (4, 5), (slice(None, None, 2),))),
        Case("ellipsis", (c.t((2, 3)), (2, 3, 4), (Ellipsis, 1))),
    ]


def _as_strided(c: Ctx) -> list[Case]:
    return [
        Case("window", (c.t((4, 4)), (2, 2), (4, 1), 1)),
        Case("diagonal", (c.t((4, 4)), (4,), (5,), 0)),
        Case("overlapping", (c.t((4, 4)), (2, 3), (1, 1), 2)),
        Case("out-of-bounds", (c.t((2, 2)), (3, 3), (3, 1), 0)),
    ]


def _strided_scatter(c: Ctx) -> list[Case]:
    in_geom = ((3, 4), (4, 1), 0)
    return [
        Case("transposed-view", (c.t((2, 2)), in_geom, ((2, 2), (1, 4), 1))),
        Case("overlapping-view", (c.t((3, 3)), in_geom, ((3, 3), (1, 1), 0))),
    ]


def _strided_gather(c: Ctx) -> list[Case]:
    in_geom = ((3, 4), (4, 1), 0)
    return [
        Case("transposed-view", (c.t((3, 4)), in_geom, ((2, 2), (1, 4), 1))),
        Case("overlapping-view", (c.t((3, 4)), in_geom, ((3, 3), (1, 1), 0))),
    ]


def _strided_zero(c: Ctx) -> list[Case]:
    in_geom = ((3, 4), (4, 1), 0)
    return [
        Case("transposed-view", (c.t((3, 4)), in_geom, ((2, 2), (1, 4), 1))),
        Case("overlapping-view", (c.t((3, 4)), in_geom, ((3, 3), (1, 1), 0))),
    ]


def _clone(c: Ctx) -> list[Case]:
    return [
        Case("contiguous", (c.t((3, 4)),)),
        Case("transposed", (c.t((3, 4), layout="transposed"),)),
        Case("strided", (c.t((2, 3, 4), layout="strided"),)),
        Case("expanded", (c.t((3, 4), layout="expanded"),)),
        Case("0-d", (c.t(()),)),
        Case("empty", (c.t((0, 3)),)),
    ]


def _to_copy(c: Ctx) -> list[Case]:
    candidates = (c.dtype, kiln.float32, kiln.float64, kiln.int64, kiln.int32, kiln.bool, kiln.float16)
    targets = list(dict.fromkeys(d for d in candidates if d in c.device_dtypes))
    out = []
    for d in targets:
        name = str(d).removeprefix("kiln.")
        out.append(Case(f"to-{name}", (c.t((3, 4)), d, DEVICE)))
        out.append(Case(f"to-{name}-strided", (c.t((2, 3, 4), layout="strided"), d, DEVICE)))
    out.append(Case("0-d", (c.t(()), c.dtype, DEVICE)))
    out.append(Case("empty", (c.t((0, 3)), c.dtype, DEVICE)))
    return out


def _copy_from(c: Ctx) -> list[Case]:
    def dst(shape, **k):
        return c.t(shape, grad=False, **k)

    out = [
        Case("same", (dst((3, 4)), c.t((3, 4))), inplace=0),
        Case("into-strided", (dst((3, 4), layout="strided"), c.t((3, 4), layout="transposed")), inplace=0),
        Case("broadcast", (dst((3, 4)), c.t((4,))), inplace=0),
        Case("from-cpu", (dst((3, 4), layout="transposed"), c.t((3, 4), on="cpu")), inplace=0),
        Case("0-d", (dst(()), c.t(())), inplace=0),
        Case("empty", (dst((0, 3)), c.t((0, 3))), inplace=0),
    ]
    other = c.other_dtype()
    if other is not None:
        out.append(Case("cast", (dst((3, 4)), c.t((3, 4), dtype=other)), inplace=0))
    return out


def _empty(c: Ctx) -> list[Case]:
    return [
        Case("2d", ((3, 4), c.dtype, DEVICE), values=False),
        Case("0-d", ((), c.dtype, DEVICE), values=False),
        Case("empty", ((0, 5), c.dtype, DEVICE), values=False),
    ]


def _full(c: Ctx) -> list[Case]:
    fill = True if c.dtype is kiln.bool else 3 if not c.dtype.is_floating_point else 2.5
    return [
        Case("2d", ((3, 4), fill, c.dtype, DEVICE)),
        Case("0-d", ((), fill, c.dtype, DEVICE)),
        Case("empty", ((0, 5), fill, c.dtype, DEVICE)),
        Case("zero", ((2, 3), 0, c.dtype, DEVICE)),
    ]


def _clamp(c: Ctx) -> list[Case]:
    def bound(shape, value, **k):
        return c.t(shape, low=value, high=value + 1, grad=True, **k)

    x = c.t
    return [
        Case("both", (x((3, 4)), -1, 1)),
        Case("min-only", (x((3, 4), layout="transposed"), -0.5, None)),
        Case("max-only", (x((2, 3, 4), layout="strided"), None, 0.5)),
        Case("tensor-bounds", (x((3, 4)), bound((4,), -2), bound((3, 1), 0))),
        Case("expanded", (x((3, 4), layout="expanded"), -1, 2)),
        Case("0-d", (x(()), -1, 1)),
        Case("empty", (x((0, 3)), -1, 1)),
        Case("no-bounds", (x((3,)), None, None)),
    ]


def _clamp_one(name: str):
    def cases(c: Ctx) -> list[Case]:
        x = c.t
        return [
            Case("scalar", (x((3, 4)), 0.5)),
            Case("int-scalar", (x((3, 4), layout="transposed"), 1)),
            Case("tensor", (x((2, 3, 4), layout="strided"), x((3, 1)))),
            Case("0-d", (x(()), 0)),
            Case("empty", (x((0, 3)), 0)),
        ]

    cases.__name__ = f"_{name}"
    return cases


def _lerp(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("scalar-weight", (x((3, 4)), x((3, 4)), 0.3)),
        Case("tensor-weight", (x((3, 4), layout="transposed"), x((3, 4), layout="strided"), x((4,), low=0, high=1))),
        Case("broadcast", (x((2, 1, 4)), x((3, 1)), 0.75)),
        Case("0-d", (x(()), x(()), 0.5)),
        Case("empty", (x((0, 4)), x((4,)), 0.5)),
    ]


def _addc(divide: bool):
    def cases(c: Ctx) -> list[Case]:
        x = c.t

        def d(shape, **k):
            return c.t(shape, exclude_zero=divide, **k)

        return [
            Case("same-shape", (x((3, 4)), x((3, 4)), d((3, 4)))),
            Case("value", (x((3, 4)), x((3, 4), layout="strided"), d((3, 4), layout="transposed")), {"value": 0.5}),
            Case("int-value", (x((3, 4)), x((3, 4)), d((3, 4))), {"value": 2}),
            Case("broadcast", (x((2, 1, 4)), x((3, 1)), d((4,)))),
            Case("0-d", (x(()), x(()), d(()))),
            Case("empty", (x((0, 4)), x((4,)), d((4,)))),
        ]

    return cases


def _threshold_backward(c: Ctx) -> list[Case]:
    return [
        Case("same-shape", (c.t((3, 4)), c.t((3, 4)))),
        Case("strided", (c.t((3, 4), layout="transposed"), c.t((3, 4), layout="strided"))),
        Case("0-d", (c.t(()), c.t(()))),
        Case("empty", (c.t((0, 4)), c.t((0, 4)))),
    ]


def _div_by_zero(c: Ctx) -> list[Case]:
    # integer division by zero raises for the rounding modes (PyTorch: "ZeroDivisionError"); float gives inf/nan
    zeros = T(base=np.zeros(3, c.dtype.numpy), dtype=c.dtype, shape=(3,), grad=False)
    return [
        Case(f"zero-divisor[rounding_mode={m!r}]", (c.t((3,), grad=False), zeros), {"rounding_mode": m}, grad=False)
        for m in (None, "trunc", "floor")
    ]


def _cat(c: Ctx) -> list[Case]:
    other = c.other_dtype()
    cases = [
        Case("dim0", ([c.t((2, 3)), c.t((1, 3), layout="transposed")],)),
        Case("dim-1", ([c.t((2, 3), layout="strided"), c.t((2, 1)), c.t((2, 0))], -1)),
        Case("legacy-empty", ([c.t((0,)), c.t((2, 3)), c.t((0,))], 1)),
        Case("empty", ([c.t((0, 3)), c.t((0, 3))],)),
        Case("0-d", ([c.t(())],)),
    ]
    if other is not None:
        cases.append(Case("mixed-dtype", ([c.t((2, 3)), c.t((2, 3), dtype=other)], 1)))
    return cases


def _stack(c: Ctx) -> list[Case]:
    other = c.other_dtype()
    cases = [
        Case("dim0", ([c.t((2, 3)), c.t((2, 3), layout="transposed")],)),
        Case("dim-1", ([c.t((2, 3), layout="strided"), c.t((2, 3), layout="expanded")], -1)),
        Case("empty", ([c.t((0, 3)), c.t((0, 3))], 1)),
        Case("0-d", ([c.t(()), c.t(())],)),
    ]
    if other is not None:
        cases.append(Case("mixed-dtype", ([c.t((2, 3)), c.t((2, 3), dtype=other)], 1)))
    return cases


def _flip(c: Ctx) -> list[Case]:
    return [
        Case("dims", (c.t((3, 4)), (0, 1))),
        Case("transposed", (c.t((3, 4), layout="transposed"), (-1,))),
        Case("none", (c.t((3, 4)), ())),
        Case("empty", (c.t((0, 2)), (0,))),
        Case("repeated", (c.t((3, 4)), (0, 0))),
    ]


def _roll(c: Ctx) -> list[Case]:
    return [
        Case("flat", (c.t((3, 4)), 5)),
        Case("dims", (c.t((3, 4), layout="strided"), (1, -2), (0, 1))),
        Case("0-d", (c.t(()), 1)),
        Case("empty", (c.t((0, 2)), 1, 0)),
    ]


def _repeat(c: Ctx) -> list[Case]:
    return [
        Case("2d", (c.t((2, 3)), (2, 1))),
        Case("lead", (c.t((3,), layout="strided"), (2, 1, 2))),
        Case("0-d", (c.t(()), (3,))),
        Case("zero", (c.t((2, 3)), (0, 2))),
    ]


def _diagonal(c: Ctx) -> list[Case]:
    return [
        Case("main", (c.t((3, 4)),)),
        Case("offset", (c.t((3, 4), layout="transposed"), 1)),
        Case("dims", (c.t((2, 3, 4)), -1, 2, 0)),
        Case("empty", (c.t((3, 4)), 9)),
    ]


def _diagonal_backward(c: Ctx) -> list[Case]:
    return [
        Case("main", (c.t((3,)), (3, 4), 0, 0, 1)),
        Case("offset", (c.t((2, 2)), (2, 3, 4), -1, 2, 0)),
    ]


def _tri(c: Ctx) -> list[Case]:
    return [
        Case("main", (c.t((3, 4)),)),
        Case("batched", (c.t((2, 3, 3), layout="transposed"), -1)),
        Case("offset", (c.t((4, 3), layout="strided"), 1)),
        Case("empty", (c.t((0, 3)),)),
    ]


def _ix(values, dtype=None) -> T:
    a = np.asarray(values, dtype=np.int64)
    return T(base=a, dtype=dtype or kiln.int64, shape=a.shape, grad=False)


def _mask(values) -> T:
    a = np.asarray(values, dtype=bool)
    return T(base=a, dtype=kiln.bool, shape=a.shape, grad=False)


def _gather(c: Ctx) -> list[Case]:
    return [
        Case("dim1", (c.t((3, 4)), 1, _ix([[0, 3], [1, 1], [2, 0]]))),
        Case("dim0-transposed", (c.t((3, 4), layout="transposed"), 0, _ix([[2, 0, 1]], kiln.int32))),
        Case("empty", (c.t((3, 4)), 1, _ix(np.zeros((3, 0))))),
        Case("0-d", (c.t(()), 0, _ix(0))),
    ]


def _scatter(c: Ctx) -> list[Case]:
    return [
        Case("src", (c.t((3, 4)), 1, _ix([[0, 3], [1, 2], [2, 0]]), c.t((3, 2)))),
        Case("strided", (c.t((3, 4), layout="strided"), 0, _ix([[2, 0, 1]]), c.t((2, 3)))),
        Case("value", (c.t((3, 4)), 1, _ix([[0, 3], [1, 2], [2, 0]])), {"value": 1}),
        Case("empty", (c.t((3, 4)), 1, _ix(np.zeros((3, 0))), c.t((3, 0)))),
    ]


def _scatter_add(c: Ctx) -> list[Case]:
    return [
        Case("duplicates", (c.t((3, 4)), 1, _ix([[0, 0], [1, 1], [2, 0]]), c.t((3, 2)))),
        Case("transposed", (c.t((3, 4), layout="transposed"), 0, _ix([[2, 2, 1]]), c.t((2, 3)))),
        Case("0-d", (c.t(()), 0, _ix(0), c.t(()))),
    ]


def _index_select(c: Ctx) -> list[Case]:
    return [
        Case("dim1", (c.t((3, 4)), 1, _ix([3, 0, 3]))),
        Case("dim0-int32", (c.t((3, 4), layout="strided"), 0, _ix([1], kiln.int32))),
        Case("empty", (c.t((3, 4)), 0, _ix(np.zeros(0)))),
        Case("0-d", (c.t(()), 0, _ix(0))),
    ]


def _index_add(c: Ctx) -> list[Case]:
    return [
        Case("duplicates", (c.t((3, 4)), 1, _ix([3, 0, 3]), c.t((3, 3)))),
        Case("alpha", (c.t((3, 4), layout="transposed"), 0, _ix([2, 2]), c.t((2, 4))), {"alpha": 2}),
    ]


def _index_fill(c: Ctx) -> list[Case]:
    return [
        Case("dim1", (c.t((3, 4)), 1, _ix([3, -4]), 1)),
        Case("dim0", (c.t((3, 4), layout="strided"), 0, _ix([1]), 0)),
    ]


def _masked_fill(c: Ctx) -> list[Case]:
    m = [[True, False, False, True], [False, False, True, True], [True, True, False, False]]
    return [
        Case("scalar", (c.t((3, 4)), _mask(m), 1)),
        Case("broadcast", (c.t((3, 4), layout="transposed"), _mask(m[0]), 0)),
        Case("tensor-value", (c.t((3, 4)), _mask(m), c.t(()))),
        Case("empty", (c.t((0, 4)), _mask(np.zeros((0, 4))), 1)),
    ]


def _take(c: Ctx) -> list[Case]:
    return [
        Case("2d", (c.t((3, 4), layout="transposed"), _ix([[0, 11], [-1, 5]]))),
        Case("empty", (c.t((3, 4)), _ix(np.zeros(0)))),
        Case("0-d", (c.t(()), _ix([0, 0]))),
    ]


def _sort(c: Ctx) -> list[Case]:
    return [
        Case("last", (c.t((3, 4)),)),
        Case("dim0-desc", (c.t((3, 4), layout="strided"), 0, True)),
        Case("stable", (c.t((5,)), -1, False, True)),
        Case("empty", (c.t((0, 3)),)),
        Case("0-d", (c.t(()),)),
    ]


def _index_copy(c: Ctx) -> list[Case]:
    return [
        Case("dim1", (c.t((3, 4)), 1, _ix([3, 0]), c.t((3, 2)))),
        Case("dim0", (c.t((3, 4), layout="transposed"), 0, _ix([2]), c.t((1, 4)))),
    ]


def _nonzero(c: Ctx) -> list[Case]:
    return [
        Case("2d", (c.t((3, 4), layout="transposed"),), grad=False),
        Case("empty", (c.t((0, 2)),), grad=False),
        Case("0-d", (c.t(()),), grad=False),
    ]


def _masked_select(c: Ctx) -> list[Case]:
    m = [[True, False, False, True], [False, False, True, True], [True, True, False, False]]
    return [
        Case("2d", (c.t((3, 4)), _mask(m))),
        Case("broadcast", (c.t((3, 4), layout="strided"), _mask(m[0]))),
        Case("empty", (c.t((0, 4)), _mask(np.zeros((0, 4))))),
    ]


def _bincount(c: Ctx) -> list[Case]:
    return [
        Case("plain", (_ix([1, 3, 3, 0]),), grad=False),
        Case("weights", (_ix([1, 3, 3]), c.t((3,))), grad=False),
        Case("minlength", (_ix([2]), None, 6), grad=False),
    ]


def _searchsorted(c: Ctx) -> list[Case]:
    seq = T(base=np.arange(5).astype(c.dtype.numpy), dtype=c.dtype, shape=(5,), grad=False)
    return [
        Case("1d", (seq, c.t((2, 3))), grad=False),
        Case("right", (seq, c.t((4,))), {"right": True}, grad=False),
    ]


def _scatter_reduce(c: Ctx) -> list[Case]:
    idx = _ix([[0, 0, 2], [1, 3, 1], [2, 0, 0]])
    return [
        Case(f"{r}-{inc}", (c.t((3, 4)), 1, idx, c.t((3, 3)), r), {"include_self": inc}, grad=r != "prod")
        for r in ("sum", "prod", "mean", "amax", "amin")
        for inc in (True, False)
    ]


def _unique(c: Ctx) -> list[Case]:
    return [
        Case("plain", (c.t((3, 4), layout="transposed", low=-2, high=2),), grad=False),
        Case("consecutive", (c.t((6,), low=-1, high=1), True, True, True, True), grad=False),
        Case("empty", (c.t((0,)),), grad=False),
        Case("dim", (c.t((5, 3), layout="transposed", low=-1, high=1), True, True, True, False, 1), grad=False),
        Case("consecutive-dim", (c.t((5, 2), low=-1, high=1), True, True, True, True, 0), grad=False),
    ]


def _histc(c: Ctx) -> list[Case]:
    return [
        Case("auto", (c.t((3, 4), layout="transposed"), 5), grad=False),
        Case("range", (c.t((8,)), 4, -1.0, 1.0), grad=False),
    ]


def _index(c: Ctx) -> list[Case]:
    m = [[True, False, False, True], [False, False, True, True], [True, True, False, False]]
    return [
        Case("ints", (c.t((3, 4), layout="transposed"), [_ix([2, 0, -1]), _ix([1, 1, 3])])),
        Case("rows", (c.t((3, 4)), [_ix([[0], [2]])])),
        Case("mask", (c.t((3, 4), layout="strided"), [_mask(m)])),
    ]


def _index_put(c: Ctx) -> list[Case]:
    return [
        Case("set", (c.t((3, 4)), [_ix([2, 0]), _ix([1, 3])], c.t((2,)))),
        Case("accumulate", (c.t((3, 4), layout="transposed"), [_ix([1, 1])], c.t((4,)), True)),
        Case("mask", (c.t((3, 4)), [_mask([True, False, True])], c.t(()))),
    ]


def _masked_scatter(c: Ctx) -> list[Case]:
    m = [[True, False, False, True], [False, False, True, True], [True, True, False, False]]
    return [
        Case("2d", (c.t((3, 4)), _mask(m), c.t((8,)))),
        Case("broadcast", (c.t((3, 4), layout="transposed"), _mask(m[0]), c.t((2, 4)))),
    ]


# ---------------------------------------------------------------------------------------- the table


def _einsum(c: Ctx) -> list[Case]:
    x = c.t
    return [
        Case("mm", ("ij,jk->ik", [x((3, 4)), x((4, 5), layout="transposed")])),
        Case("implicit", ("ij,jk", [x((3, 4)), x((4, 5))])),
        Case("trace", ("ii", [x((3, 3))])),
        Case("diagonal", ("ii->i", [x((3, 3), layout="strided")])),
        Case("ellipsis", ("...ij,...jk->...ik", [x((2, 3, 4)), x((4, 5))])),
        Case("three", ("ab,bc,cd->ad", [x((2, 3)), x((3, 4)), x((4, 2))])),
        Case("empty", ("ij,jk->ik", [x((0, 4)), x((4, 5))])),
        Case("mismatch", ("ij,jk", [x((2, 3)), x((4, 2))])),
    ]


def _square(spd: bool, grad: bool = True):
    def make(c: Ctx) -> list[Case]:
        def m(batch, n=3):
            rng = np.random.default_rng(len(batch) + n)
            a = rng.standard_normal(batch + (n, n))
            a = a @ np.swapaxes(a, -1, -2) + n * np.eye(n) if spd else a + 3 * n * np.eye(n)
            d = c.dtype
            return T(base=a.astype(d.numpy), dtype=d, shape=a.shape)

        return [
            Case("matrix", (m(()),), grad=grad),
            Case("batched", (m((2,)),), grad=grad),
            Case("empty", (m((0,)),), grad=grad),
            Case("non-square", (c.t((3, 4)),), grad=False),
        ]

    return make


def _factor(option: str, values: tuple):
    def make(c: Ctx) -> list[Case]:
        x = c.t
        cases = [
            Case("tall", (x((4, 3)),), grad=False),
            Case("wide", (x((3, 4), layout="transposed"),), grad=False),
            Case("batched", (x((2, 3, 3)),), grad=False),
            Case("empty", (x((0, 3)),), grad=False),
        ]
        cases += [Case(f"{option}={v}", (x((4, 3)),), {option: v}, grad=False) for v in values]
        return cases

    return make


_POSITIVE = {"low": 0.25, "high": 4.0}


def _one_float32(c: Ctx, value: float) -> T:
    return c.t((), dtype=kiln.float32, low=value, high=value, grad=False)


def _amp_unscale(c: Ctx) -> list[Case]:
    def case(label, grad):
        return Case(
            label, (grad, _one_float32(c, 0.0), _one_float32(c, 0.25)), inplace=0, also_written=(1,), grad=False
        )

    g = c.t
    cases = [
        case("contiguous", g((3, 4), grad=False)),
        case("transposed", g((3, 4), layout="transposed", grad=False)),
        case("strided", g((2, 3, 4), layout="strided", grad=False)),
        case("0-d", g((), grad=False)),
        case("empty", g((0, 3), grad=False)),
    ]
    if c.dtype.is_floating_point:
        cases.append(case("inf-and-nan", c.specials()))
    return cases


def _amp_update_scale(c: Ctx) -> list[Case]:
    def case(label, tracker, found, interval):
        scale = _one_float32(c, 1024.0)
        args = (scale, c.t((), dtype=kiln.int32, low=tracker, high=tracker, grad=False), _one_float32(c, found))
        return Case(label, (*args, 2.0, 0.5, interval), inplace=0, also_written=(1,), grad=False)

    return [
        case("found-inf", 3, 1.0, 5),
        case("counts-a-good-step", 3, 0.0, 5),
        case("grows-at-the-interval", 4, 0.0, 5),
        case("interval-1", 0, 0.0, 1),
    ]


SPECS: dict[str, OpSpec] = {
    # gradient scaling (kiln-amp's GradScaler): in place, on the device
    "_amp_non_finite_check_and_unscale_": explicit(_amp_unscale),
    "_amp_update_scale_": explicit(_amp_update_scale),
    # views, creation and copies (device-generic in the core: every device gets them from its contract)
    "view": explicit(_view),
    "permute": explicit(_permute),
    "transpose": explicit(_transpose),
    "t": explicit(_t),
    "expand": explicit(_expand),
    "unsqueeze": explicit(_unsqueeze),
    "squeeze": explicit(_squeeze),
    "_index_view": explicit(_index_view),
    "as_strided": explicit(_as_strided),
    "diagonal": explicit(_diagonal),
    "_diagonal_backward": explicit(_diagonal_backward),
    "cat": explicit(_cat),
    "stack": explicit(_stack),
    "flip": explicit(_flip),
    "roll": explicit(_roll),
    "repeat": explicit(_repeat),
    "tril": explicit(_tri),
    "triu": explicit(_tri),
    "_index_backward": explicit(_index_backward),
    "clone": explicit(_clone),
    "_to_copy": explicit(_to_copy),
    "_copy_from": explicit(_copy_from),
    "_empty": explicit(_empty),
    "_full": explicit(_full),
    "_strided_scatter": explicit(_strided_scatter),
    "_strided_gather": explicit(_strided_gather),
    "_strided_zero": explicit(_strided_zero),
    # elementwise binary
    "add": binary(variants=({}, {"alpha": 2})),
    "sub": binary(variants=({}, {"alpha": 2})),
    "div": binary(
        nonzero_other=True,
        variants=({}, {"rounding_mode": "trunc"}, {"rounding_mode": "floor"}),
        extra=_div_by_zero,
    ),
    "pow": binary(low=0.25, high=2.5, other_low=0, other_high=3, scalars=(2, 0.5)),
    "eq": binary(low=-2, high=2),  # a narrow range, so equal elements occur
    "ne": binary(low=-2, high=2),
    "lt": binary(low=-2, high=2),
    "le": binary(low=-2, high=2),
    "gt": binary(low=-2, high=2),
    "ge": binary(low=-2, high=2),
    "bitwise_and": binary(scalars=(3, True)),
    "bitwise_or": binary(scalars=(3, True)),
    "bitwise_xor": binary(scalars=(3, True)),
    "maximum": binary(low=-2, high=2, tensor_only=True),
    "minimum": binary(low=-2, high=2, tensor_only=True),
    "where": explicit(_where),
    "_threshold_backward": explicit(_threshold_backward),
    # elementwise unary
    "exp": unary(low=-2.0, high=2.0),
    "log": unary(**_POSITIVE),
    "sqrt": unary(**_POSITIVE),
    "exp2": unary(low=-2.0, high=2.0),
    "expm1": unary(low=-2.0, high=2.0),
    "log2": unary(**_POSITIVE),
    "log10": unary(**_POSITIVE),
    "log1p": unary(low=-0.5, high=3.0),
    "rsqrt": unary(**_POSITIVE),
    "reciprocal": unary(**_POSITIVE),
    "tan": unary(low=-1.2, high=1.2),
    "asin": unary(low=-0.95, high=0.95),
    "acos": unary(low=-0.95, high=0.95),
    "acosh": unary(low=1.1, high=4.0),
    "atanh": unary(low=-0.95, high=0.95),
    "erfinv": unary(low=-0.95, high=0.95),
    "logit": unary(low=0.05, high=0.95, variants=({}, {"eps": 1e-6})),
    "round": unary(variants=({}, {"decimals": 1}, {"decimals": -1})),
    "nan_to_num": unary(variants=({}, {"nan": 1.5, "posinf": 10.0, "neginf": -10.0})),
    "fmod": binary(nonzero_other=True),
    "remainder": binary(nonzero_other=True),
    "floor_divide": binary(nonzero_other=True),
    "bitwise_left_shift": binary(low=0, high=3, scalars=(1, 2)),
    "bitwise_right_shift": binary(low=0, high=7, other_low=0, other_high=2, scalars=(1, 2)),
    "clamp": explicit(_clamp),
    "clamp_min": explicit(_clamp_one("clamp_min")),
    "clamp_max": explicit(_clamp_one("clamp_max")),
    "lerp": explicit(_lerp),
    "addcmul": explicit(_addc(divide=False)),
    "addcdiv": explicit(_addc(divide=True)),
    # linear algebra
    "matmul": explicit(_matmul),
    "bmm": explicit(_bmm),
    "addmm": explicit(_add_product(False)),
    "baddbmm": explicit(_add_product(True)),
    "einsum": explicit(_einsum),
    "inv": explicit(_square(False)),
    "det": explicit(_square(False)),
    "_slogdet": explicit(_square(False)),
    "cholesky": explicit(_square(True, grad=False)),
    "_eigh": explicit(_square(True, grad=False)),
    "_svd": explicit(_factor("full_matrices", (False,))),
    "_qr": explicit(_factor("mode", ("complete", "r"))),
    # reductions
    "sum": reduction(_sum_with_dtype),
    "_max_all": reduction(lambda nd: [{}]),
    "_min_all": reduction(lambda nd: [{}]),
    "prod": reduction(lambda nd: _dims_optional_int(nd) + [{"dtype": kiln.float64}]),
    "_var": reduction(lambda nd: _dims_sum(nd) + [{"correction": 0}]),
    "_std": reduction(lambda nd: _dims_sum(nd) + [{"correction": 0}]),
    "nansum": reduction(_sum_with_dtype),
    "count_nonzero": reduction(lambda nd: [{}, {"dim": 0}, {"dim": -1}]),
    "gather": explicit(_gather),
    "scatter": explicit(_scatter),
    "scatter_add": explicit(_scatter_add),
    "index_select": explicit(_index_select),
    "index_add": explicit(_index_add),
    "index_fill": explicit(_index_fill),
    "masked_fill": explicit(_masked_fill),
    "take": explicit(_take),
    "_sort": explicit(_sort),
    "index_copy": explicit(_index_copy),
    "_nonzero": explicit(_nonzero),
    "masked_select": explicit(_masked_select),
    "bincount": explicit(_bincount),
    "searchsorted": explicit(_searchsorted),
    "scatter_reduce": explicit(_scatter_reduce),
    "_unique": explicit(_unique),
    "histc": explicit(_histc),
    "_index": explicit(_index),
    "index_put": explicit(_index_put),
    "masked_scatter": explicit(_masked_scatter),
    "vector_norm": reduction(lambda nd: _dims_sum(nd) + [{"ord": 1}, {"ord": 0.5}, {"ord": float("inf"), "dim": -1}]),
}

# The nn primitives' specs live in one module per area (kiln_testing/_specs_nn_*.py, each a SPECS dict
# built with this module's helpers); merged here so that SPECS is the one table.
for _area in ("conv", "pool", "norm", "loss", "activation", "recurrent"):
    SPECS.update(importlib.import_module(f"kiln_testing._specs_nn_{_area}").SPECS)
SPECS.update(importlib.import_module("kiln_testing._specs_random").SPECS)  # samplers, unfold (_specs_random.py)
SPECS.update(importlib.import_module("kiln_testing._specs_special").SPECS)  # kiln.special (_specs_special.py)
SPECS.update(importlib.import_module("kiln_testing._specs_math").SPECS)  # math and linalg ops (_specs_math.py)

INTERNAL_ONLY: frozenset[str] = frozenset()
"""Ops that no spec can call on their own (none today): listed here, they are reported, never failed."""


def _annotation(p) -> str:
    return p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")


def _is_tensor(p) -> bool:
    """A tensor parameter (``Tensor``, ``Tensor | Number``), not a sequence of tensors."""
    ann = _annotation(p)
    return "Tensor" in ann and "Sequence" not in ann


def _reduction_dims(dim) -> Callable[[int], list[dict]]:
    """The ``dim`` variants of a reduction, from how its signature declares ``dim``."""
    ann = _annotation(dim)
    if "Dims" in ann:  # a dim or a tuple of dims
        if dim.default is dim.empty:
            return lambda nd: _dims_required(nd) + ([{"dim": (0, 2)}] if nd >= 3 else [])
        return _dims_sum
    if "None" in ann:  # one optional dim: None reduces all
        return _dims_optional_int
    return _dims_required


def infer_spec(opdef) -> OpSpec | None:
    """A spec from the op's tags and signature (see the module docstring), or None.

    * ``pointwise`` with one tensor input: :func:`unary`; with two (``input`` and a second tensor or
      number): :func:`binary`, ``tensor_only`` when the second one's annotation takes no ``Number``;
    * ``reduction`` over ``dim``/``keepdim``: :func:`reduction` with the dims the signature allows
      (a tuple of dims, one optional dim, one required dim); without ``dim``: the full reduction only;
    * ``scan`` with ``dim`` and ``dtype``: every dim, and an accumulation dtype;
    * an untagged op with a familiar signature: unary ``(input, [options with defaults])``, binary
      ``(input, other)``, reduction ``(input, dim, keepdim)``.
    """
    params = list(opdef.signature.parameters.values())
    tags = getattr(opdef, "tags", frozenset())
    # a reduction may return (values, indices); other families one tensor
    if not params or not _is_tensor(params[0]) or (opdef.num_outputs != 1 and "reduction" not in tags):
        return None
    required = [p for p in params if p.default is p.empty]
    names = [p.name for p in params]
    by_name = {p.name: p for p in params}
    spec = None
    if "pointwise" in tags:
        tensors = [p for p in required if _is_tensor(p)]
        if len(required) == 1:
            spec = unary()
        elif len(required) == 2 and len(tensors) == 2 and names[1] == "other":
            spec = binary(tensor_only="Number" not in _annotation(params[1]))
    elif "reduction" in tags and {p.name for p in required} <= {"input", "dim"}:
        if "dim" in by_name and "keepdim" in by_name and set(names) <= {"input", "dim", "keepdim", "dtype"}:
            spec = reduction(_reduction_dims(by_name["dim"]))
        elif names == ["input"]:
            spec = reduction(lambda nd: [{}])
    elif "scan" in tags and names[:2] == ["input", "dim"] and "dtype" in by_name and len(required) == 2:
        spec = reduction(_scan_dims)
    elif not tags & {"view", "creation", "random", "inplace", "shape", "linalg", "backward", "fused"}:
        # an untagged op: from the signature alone
        if len(required) == 1 and names[1:3] != ["dim", "keepdim"]:  # f(input, options with defaults)
            spec = unary()
        elif len(required) == 2 and names[1] == "other":
            spec = binary(tensor_only="Number" not in _annotation(params[1]))
        elif len(required) == 1 and names[1:3] == ["dim", "keepdim"]:
            spec = reduction(_dims_sum)
    return dataclasses.replace(spec, inferred=True) if spec is not None else None


def _from_tags(spec: OpSpec, opdef) -> OpSpec:
    """What the op record says about every spec: a ``view`` op's result shares its input's storage."""
    view = spec.view or "view" in opdef.tags
    return spec if view == spec.view else dataclasses.replace(spec, view=view)


def spec_for(opdef) -> OpSpec | None:
    """The op's spec: from :data:`SPECS`, else inferred from its tags and signature, else None."""
    spec = SPECS.get(opdef.name)
    if spec is None:
        spec = infer_spec(opdef)
    return None if spec is None else _from_tags(spec, opdef)


def resolve(value: Any, device) -> Any:
    """Replace :data:`DEVICE` by ``device`` (other values unchanged)."""
    return device if value is DEVICE else value
