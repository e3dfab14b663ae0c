"""``kiln.testing.assert_close``: ``torch.testing.assert_close`` for kiln, same semantics, same messages.

The structure follows PyTorch's: the inputs are split into *pairs* (recursing through sequences and
mappings), each pair type decides whether it handles its inputs (None, booleans, Python/NumPy numbers,
tensor-likes), and the first mismatch raises with PyTorch's wording. Values are compared on the host:
tensors on any device are copied with ``.cpu()`` (after the device check, when it is on).
"""

from __future__ import annotations

import cmath
import collections.abc
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

import kiln

__all__ = ["assert_close", "default_tolerances"]

# torch.testing's defaults: {dtype: (rtol, atol)}; every other dtype compares exactly.
_PRECISIONS = {
    kiln.float16: (0.001, 1e-5),
    kiln.bfloat16: (0.016, 1e-5),
    kiln.float32: (1.3e-6, 1e-5),
    kiln.float64: (1e-7, 1e-7),
}
# Python number types and the dtype whose tolerances they use (as torch's NumberPair).
_NUMBER_DTYPES = {int: kiln.int64, float: kiln.float64, complex: None}
_COMPLEX_PRECISION = (1e-7, 1e-7)  # torch.complex128


class _Unsupported(Exception):
    """A pair type does not handle these inputs; the next one is tried."""


class _Mismatch(Exception):
    """One failed comparison: the exception type and message to raise, and where in the inputs it is."""

    def __init__(self, type_: type[Exception], msg: str, *, id: tuple = ()):
        super().__init__(msg)
        self.type = type_
        self.msg = msg
        self.id = id

    def to_error(self, msg: str | Callable[[str], str] | None = None) -> Exception:
        if not isinstance(msg, str):
            generated = self.msg
            if self.id:
                generated += f"\n\nThe failure occurred for item {''.join(str([item]) for item in self.id)}"
            msg = msg(generated) if callable(msg) else generated
        return self.type(msg)


def default_tolerances(*inputs) -> tuple[float, float]:
    """The loosest ``(rtol, atol)`` of the inputs' dtypes (tensors or dtypes), as torch.testing's table."""
    dtypes = [x.dtype if isinstance(x, kiln.Tensor) else x for x in inputs]
    pairs = [_PRECISIONS.get(d, (0.0, 0.0)) if d is not None else _COMPLEX_PRECISION for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _tolerances(*dtypes, rtol, atol, id) -> tuple[float, float]:
    if (rtol is None) ^ (atol is None):
        raise _Mismatch(
            ValueError,
            "Both 'rtol' and 'atol' must be either specified or omitted, "
            f"but got no {'rtol' if rtol is None else 'atol'}.",
            id=id,
        )
    if rtol is not None:
        return rtol, atol
    return default_tolerances(*dtypes)


def _mismatch_msg(*, identifier, extra, abs_diff, abs_idx, atol, rel_diff, rel_idx, rtol) -> str:
    equality = rtol == 0 and atol == 0

    def diff_line(kind: str, diff, idx, tol) -> str:
        line = (
            f"{kind.title()} difference: {diff}"
            if idx is None
            else f"Greatest {kind} difference: {diff} at index {idx}"
        )
        return line + ("" if equality else f" (up to {tol} allowed)") + "\n"

    msg = f"{identifier} are not {'equal' if equality else 'close'}!\n\n"
    if extra:
        msg += f"{extra.strip()}\n"
    msg += diff_line("absolute", abs_diff, abs_idx, atol)
    msg += diff_line("relative", rel_diff, rel_idx, rtol)
    return msg.strip()


def _scalar_msg(actual, expected, *, rtol: float, atol: float) -> str:
    abs_diff = abs(actual - expected)
    rel_diff = float("inf") if expected == 0 else abs_diff / abs(expected)
    return _mismatch_msg(
        identifier="Scalars",
        extra=f"Expected {expected} but got {actual}.",
        abs_diff=abs_diff,
        abs_idx=None,
        atol=atol,
        rel_diff=rel_diff,
        rel_idx=None,
        rtol=rtol,
    )


# ---------------------------------------------------------------------------------------- pairs


class _Pair:
    def __init__(self, actual, expected, *, id: tuple = (), **_options):
        self.actual = actual
        self.expected = expected
        self.id = id

    def _fail(self, type_: type[Exception], msg: str) -> NoReturn:
        raise _Mismatch(type_, msg, id=self.id)

    def compare(self) -> None:
        raise NotImplementedError


class _NonePair(_Pair):
    def __init__(self, actual, expected, **options):
        if not (actual is None or expected is None):
            raise _Unsupported
        super().__init__(actual, expected, **options)

    def compare(self) -> None:
        if not (self.actual is None and self.expected is None):
            self._fail(AssertionError, f"None mismatch: {self.actual} is not {self.expected}")


class _BooleanPair(_Pair):
    _TYPES = (bool, np.bool_)

    def __init__(self, actual, expected, **options):
        if not (isinstance(actual, self._TYPES) and isinstance(expected, self._TYPES)):
            raise _Unsupported
        super().__init__(bool(actual), bool(expected), **options)

    def compare(self) -> None:
        if self.actual is not self.expected:
            self._fail(AssertionError, f"Booleans mismatch: {self.actual} is not {self.expected}")


class _NumberPair(_Pair):
    _TYPES = (int, float, complex, np.number)

    def __init__(self, actual, expected, *, id=(), rtol=None, atol=None, equal_nan=False, check_dtype=False, **opts):
        if not (isinstance(actual, self._TYPES) and isinstance(expected, self._TYPES)):
            raise _Unsupported
        actual, expected = (x.item() if isinstance(x, np.number) else x for x in (actual, expected))
        super().__init__(actual, expected, id=id)
        dtypes = [
            _NUMBER_DTYPES[complex if isinstance(x, complex) else float if isinstance(x, float) else int]
            for x in (actual, expected)
        ]
        self.rtol, self.atol = _tolerances(*dtypes, rtol=rtol, atol=atol, id=id)
        self.equal_nan = equal_nan
        self.check_dtype = check_dtype

    def compare(self) -> None:
        a, e = self.actual, self.expected
        if self.check_dtype and type(a) is not type(e):
            self._fail(AssertionError, f"The (d)types do not match: {type(a)} != {type(e)}.")
        if a == e:
            return
        if self.equal_nan and cmath.isnan(a) and cmath.isnan(e):
            return
        abs_diff = abs(a - e)
        if cmath.isfinite(abs_diff) and abs_diff <= self.atol + self.rtol * abs(e):
            return
        self._fail(AssertionError, _scalar_msg(a, e, rtol=self.rtol, atol=self.atol))


class _TensorLikePair(_Pair):
    def __init__(
        self,
        actual,
        expected,
        *,
        id=(),
        allow_subclasses=True,
        rtol=None,
        atol=None,
        equal_nan=False,
        check_device=True,
        check_dtype=True,
        check_layout=True,
        check_stride=False,
        **_options,
    ):
        if not (isinstance(actual, type(expected)) or isinstance(expected, type(actual))):
            raise _Unsupported
        if not allow_subclasses and type(actual) is not type(expected):
            raise _Unsupported
        actual, expected = self._to_tensor(actual), self._to_tensor(expected)
        super().__init__(actual, expected, id=id)
        self.rtol, self.atol = _tolerances(actual.dtype, expected.dtype, rtol=rtol, atol=atol, id=id)
        self.equal_nan = equal_nan
        self.check_device = check_device
        self.check_dtype = check_dtype
        self.check_stride = check_stride

    @staticmethod
    def _to_tensor(x) -> kiln.Tensor:
        if isinstance(x, kiln.Tensor):
            return x
        try:
            return kiln.as_tensor(x)
        except Exception as exc:  # not tensor-like: the next pair type (or the final TypeError) decides
            raise _Unsupported from exc

    def compare(self) -> None:
        a, e = self.actual, self.expected
        self._compare_attributes(a, e)
        a, e = self._equalize(a, e)
        self._compare_values(a, e)

    def _compare_attributes(self, a: kiln.Tensor, e: kiln.Tensor) -> None:
        def mismatch(name: str, av, ev) -> NoReturn:
            self._fail(AssertionError, f"The values for attribute '{name}' do not match: {av} != {ev}.")

        if a.shape != e.shape:
            mismatch("shape", a.shape, e.shape)
        if self.check_stride and a.stride() != e.stride():
            mismatch("stride()", a.stride(), e.stride())
        if self.check_device and a.device != e.device:
            mismatch("device", a.device, e.device)
        if self.check_dtype and a.dtype != e.dtype:
            mismatch("dtype", a.dtype, e.dtype)

    @staticmethod
    def _equalize(a: kiln.Tensor, e: kiln.Tensor) -> tuple[kiln.Tensor, kiln.Tensor]:
        if a.device != e.device:
            a, e = a.cpu(), e.cpu()
        if a.dtype != e.dtype:
            common = kiln.promote_types(a.dtype, e.dtype)
            a, e = a.to(common), e.to(common)
        return a, e

    def _compare_values(self, a: kiln.Tensor, e: kiln.Tensor) -> None:
        an = a.detach().cpu().numpy()
        en = e.detach().cpu().numpy()
        floating = a.dtype.is_floating_point
        matches = _isclose(an, en, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan, floating=floating)
        if matches.all():
            return
        if an.ndim == 0:
            msg = _scalar_msg(a.item(), e.item(), rtol=self.rtol, atol=self.atol)
        else:
            msg = _tensor_msg(an, en, matches, floating=floating, rtol=self.rtol, atol=self.atol)
        self._fail(AssertionError, msg)


def _isclose(a: np.ndarray, e: np.ndarray, *, rtol: float, atol: float, equal_nan: bool, floating: bool) -> np.ndarray:
    """``torch.isclose``: equal, or (finite error and) ``|a - e| <= atol + rtol * |e|``, in the tensors' dtype."""
    with np.errstate(all="ignore"):
        close = a == e
        if floating:
            if equal_nan:
                close |= np.isnan(a) & np.isnan(e)
            if rtol or atol:
                err = np.abs(a - e)
                close |= np.isfinite(err) & (err <= atol + np.abs(rtol * e))
        elif rtol or atol:
            a64, e64 = a.astype(np.float64), e.astype(np.float64)
            close |= np.abs(a64 - e64) <= atol + np.abs(rtol * e64)
    return np.asarray(close, dtype=bool)


def _tensor_msg(a: np.ndarray, e: np.ndarray, matches: np.ndarray, *, floating: bool, rtol, atol) -> str:
    n = matches.size
    bad = n - int(matches.sum())
    extra = f"Mismatched elements: {bad} / {n} ({bad / n:.1%})"
    af, ef, mf = a.reshape(-1), e.reshape(-1), matches.reshape(-1)
    with np.errstate(all="ignore"):
        if floating:
            abs_diff = np.abs(af - ef)
            abs_diff[mf] = 0
            rel_diff = abs_diff / np.abs(ef)
        else:
            # integers (and bools) are upcast to int64; their relative difference is a default-dtype float
            abs_diff = np.abs(af.astype(np.int64) - ef.astype(np.int64))
            abs_diff[mf] = 0
            rel_diff = (abs_diff / np.abs(ef.astype(np.int64))).astype(np.float32)
        rel_diff[mf] = 0
    ai, ri = int(np.argmax(abs_diff)), int(np.argmax(rel_diff))
    return _mismatch_msg(
        identifier="Tensor-likes",
        extra=extra,
        abs_diff=abs_diff[ai].item(),
        abs_idx=tuple(int(i) for i in np.unravel_index(ai, a.shape)),
        atol=atol,
        rel_diff=rel_diff[ri].item(),
        rel_idx=tuple(int(i) for i in np.unravel_index(ri, a.shape)),
        rtol=rtol,
    )


_PAIR_TYPES = (_NonePair, _BooleanPair, _NumberPair, _TensorLikePair)


def _originate(actual, expected, *, id: tuple, options: dict) -> list[_Pair]:
    seq = collections.abc.Sequence
    if (
        isinstance(actual, seq)
        and not isinstance(actual, str)
        and isinstance(expected, seq)
        and not isinstance(expected, str)
    ):
        if len(actual) != len(expected):
            raise _Mismatch(
                AssertionError, f"The length of the sequences mismatch: {len(actual)} != {len(expected)}", id=id
            )
        pairs = []
        for i in range(len(actual)):
            pairs.extend(_originate(actual[i], expected[i], id=(*id, i), options=options))
        return pairs
    mapping = collections.abc.Mapping
    if isinstance(actual, mapping) and isinstance(expected, mapping):
        a_keys, e_keys = set(actual.keys()), set(expected.keys())
        if a_keys != e_keys:
            raise _Mismatch(
                AssertionError,
                "The keys of the mappings do not match:\n"
                f"Missing keys in the actual mapping: {sorted(e_keys - a_keys)}\n"
                f"Additional keys in the actual mapping: {sorted(a_keys - e_keys)}",
                id=id,
            )
        try:
            keys = sorted(a_keys)
        except TypeError:
            keys = list(a_keys)
        pairs = []
        for k in keys:
            pairs.extend(_originate(actual[k], expected[k], id=(*id, k), options=options))
        return pairs
    for pair_type in _PAIR_TYPES:
        try:
            return [pair_type(actual, expected, id=id, **options)]
        except _Unsupported:
            continue
    raise _Mismatch(
        TypeError, f"No comparison pair was able to handle inputs of type {type(actual)} and {type(expected)}.", id=id
    )


def assert_close(
    actual: Any,
    expected: Any,
    *,
    allow_subclasses: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    check_device: bool = True,
    check_dtype: bool = True,
    check_layout: bool = True,
    check_stride: bool = False,
    msg: str | Callable[[str], str] | None = None,
) -> None:
    """Assert that ``actual`` and ``expected`` are close (``torch.testing.assert_close``, for kiln).

    Tensors (on any device), NumPy arrays, Python and NumPy numbers, booleans and ``None``, nested in
    sequences and mappings, are compared pairwise. Tensors must match in shape, device (``check_device``;
    when off, both are copied to the CPU), dtype (``check_dtype``; when off, both are promoted to a
    common dtype) and, with ``check_stride``, strides; then values must satisfy
    ``|actual - expected| <= atol + rtol * |expected|``. Without ``rtol``/``atol`` (give both or
    neither) the defaults depend on the dtype: float16 ``(1e-3, 1e-5)``, bfloat16 ``(1.6e-2, 1e-5)``,
    float32 ``(1.3e-6, 1e-5)``, float64 ``(1e-7, 1e-7)``, all other dtypes exact. NaNs are equal only
    with ``equal_nan``. ``msg`` replaces the generated message (a callable receives it and returns
    the message to use).

    Raises ``AssertionError`` for a mismatch, ``ValueError`` for a tolerance given alone and
    ``TypeError`` for inputs no pair type handles — with PyTorch's messages.
    """
    __tracebackhide__ = True
    options = {
        "allow_subclasses": allow_subclasses,
        "rtol": rtol,
        "atol": atol,
        "equal_nan": equal_nan,
        "check_device": check_device,
        "check_dtype": check_dtype,
        "check_layout": check_layout,
        "check_stride": check_stride,
    }
    try:
        pairs = _originate(actual, expected, id=(), options=options)
    except _Mismatch as mismatch:
        raise mismatch.to_error() from None
    for pair in pairs:
        try:
            pair.compare()
        except _Mismatch as mismatch:
            raise mismatch.to_error(msg) from None
