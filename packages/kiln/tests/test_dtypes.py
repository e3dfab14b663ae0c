"""dtypes against PyTorch: promote_types over every pair, result_type with tensors/0-d tensors/scalars,
the default dtype (get/set, and what it changes), conversions, half-precision round trips."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import itertools

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

PAIRS = list(itertools.product(U.ALL_DTYPES, U.ALL_DTYPES))


def test_promote_types_all_pairs():
    bad = []
    for a, b in PAIRS:
        got = kiln.promote_types(a, b)
        want = U.T2K[torch.promote_types(U.K2T[a], U.K2T[b])]
        if got is not want:
            bad.append(f"promote_types({a}, {b}) = {got}, torch says {want}")
    assert not bad, "\n".join(bad)


def _operand(kind, dtype, lib):
    """A tensor (1-d or 0-d) of ``dtype`` in ``lib``."""
    d = dtype if lib is kiln else U.K2T[dtype]
    if kind == "dim":
        return lib.ones(2, dtype=d)
    return lib.ones((), dtype=d)


@pytest.mark.parametrize("kinds", [("dim", "dim"), ("dim", "0d"), ("0d", "dim"), ("0d", "0d")])
def test_result_type_tensors(kinds):
    bad = []
    for a, b in PAIRS:
        got = kiln.result_type(_operand(kinds[0], a, kiln), _operand(kinds[1], b, kiln))
        want = U.T2K[torch.result_type(_operand(kinds[0], a, torch), _operand(kinds[1], b, torch))]
        if got is not want:
            bad.append(f"result_type({kinds[0]} {a}, {kinds[1]} {b}) = {got}, torch says {want}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("scalar", [1, -1, 2.5, True, 0], ids=repr)
@pytest.mark.parametrize("kind", ["dim", "0d"])
def test_result_type_with_scalars(scalar, kind):
    bad = []
    for d in U.ALL_DTYPES:
        for order in ("tensor, scalar", "scalar, tensor"):
            kt, tt = _operand(kind, d, kiln), _operand(kind, d, torch)
            if order == "tensor, scalar":
                got, want = kiln.result_type(kt, scalar), torch.result_type(tt, scalar)
            else:
                got, want = kiln.result_type(scalar, kt), torch.result_type(scalar, tt)
            if got is not U.T2K[want]:
                bad.append(f"result_type({order}) with {kind} {d} and {scalar!r} = {got}, torch says {want}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("default", [kiln.float64, kiln.float16, kiln.bfloat16, kiln.float32], ids=U.dtype_id)
def test_default_dtype_effects(default, default_dtype):
    default_dtype(default)
    assert kiln.get_default_dtype() is default
    cases = [
        lambda L: L.tensor([1.0, 2.0]),
        lambda L: L.tensor(2.5),
        lambda L: L.tensor([1, 2]) * 2.5,
        lambda L: L.tensor([1, 2]) / L.tensor([2, 2]),
        lambda L: L.tensor([3, 4]) / 2,
        lambda L: L.zeros(2),
        lambda L: L.ones(2, 3),
        lambda L: L.full((2,), 1.5),
        lambda L: L.full((2,), 1),
        lambda L: L.arange(0.0, 1.0, 0.25),
        lambda L: L.arange(3),
        lambda L: L.linspace(0, 1, 3),
        lambda L: L.eye(2),
        lambda L: L.tensor([1, 2]).exp(),
        lambda L: L.tensor([True]).sqrt(),
        lambda L: L.tensor([1.0], dtype=L.float32) + 2.5,
        lambda L: L.tensor([1.5], dtype=L.float16) * 2.0,
        lambda L: L.tensor(1) + 0.5,
        lambda L: L.tensor([1, 2]).sum(),
        lambda L: L.where(L.tensor([True, False]), 1.0, 0.0),
    ]
    bad = {}
    for i, fn in enumerate(cases):
        bad[f"case {i}"] = U.mismatch(lambda L, fn=fn: fn(L), grad=False, rtol=1e-2, atol=1e-2)
    U.report(bad)
    assert kiln.rand(2).dtype is default
    assert kiln.randn(2).dtype is default


def test_set_default_dtype_rejects_non_float():
    for d in (kiln.int64, kiln.bool, kiln.uint8):
        U.assert_same_error(lambda: kiln.set_default_dtype(d), lambda: torch.set_default_dtype(U.K2T[d]))
    assert kiln.get_default_dtype() is kiln.float32


def test_default_dtype_fixture_restored():
    """The suite's autouse fixture restores the default dtype (this runs after the tests above)."""
    assert kiln.get_default_dtype() is kiln.float32
    assert torch.get_default_dtype() is torch.float32


@pytest.mark.parametrize("d", U.ALL_DTYPES, ids=U.dtype_id)
def test_dtype_attributes(d):
    t = U.K2T[d]
    assert d.is_floating_point == t.is_floating_point
    assert d.is_signed == t.is_signed
    assert d.itemsize == t.itemsize
    assert d.is_complex == t.is_complex
    assert repr(d) == repr(t).replace("torch.", "kiln.")
    assert str(d) == str(t).replace("torch.", "kiln.")
    x = kiln.zeros(2, dtype=d)
    assert x.element_size() == torch.zeros(2, dtype=t).element_size()
    assert x.is_floating_point() == torch.zeros(2, dtype=t).is_floating_point()


def test_dtype_aliases():
    for name in ("half", "float", "double", "long", "int", "short"):
        assert getattr(kiln, name) is U.T2K[getattr(torch, name)], name


@pytest.mark.parametrize("src", U.ALL_DTYPES, ids=U.dtype_id)
def test_conversions_between_all_dtypes(src):
    vals = np.array([0, 1, 2, 3, 7, 100, 0, 1], dtype=np.float64)
    if src.is_floating_point:
        vals = vals + np.array([0.0, 0.25, 0.5, 0.75, 0.1, 0.9, 0.0, 0.0])
    if src is kiln.bool:
        vals = vals > 1
    x = U.make_pair((8,), src, values=vals)
    bad = {}
    for dst in U.ALL_DTYPES:
        bad[f"{src}->{dst}"] = U.mismatch(lambda L, a, dst=dst: a.to(dst if L is kiln else U.K2T[dst]), x, grad=False)
        method = {
            kiln.float32: "float",
            kiln.float64: "double",
            kiln.float16: "half",
            kiln.bfloat16: "bfloat16",
            kiln.int64: "long",
            kiln.int32: "int",
            kiln.int16: "short",
            kiln.int8: "char",
            kiln.uint8: "byte",
            kiln.bool: "bool",
        }[dst]
        bad[f"{src}.{method}()"] = U.mismatch(lambda L, a, m=method: getattr(a, m)(), x, grad=False)
    U.report(bad)


def test_to_returns_self_when_nothing_changes():
    k = kiln.ones(3)
    t = torch.ones(3)
    assert (k.to(kiln.float32) is k) == (t.to(torch.float32) is t)
    assert (k.to("cpu") is k) == (t.to("cpu") is t)
    assert (k.to(kiln.float32, copy=True) is k) == (t.to(torch.float32, copy=True) is t)
    assert (k.float() is k) == (t.float() is t)


def test_to_dtype_backward():
    x = U.make_pair((3,), kiln.float32, seed=1, requires_grad=True)
    U.check_op(lambda L, a: a.to(L.float64) * 2, x)
    U.check_op(lambda L, a: a.double().half().float(), x, rtol=1e-3, atol=1e-3)
    k, _ = U.check_op(lambda L, a: a.to(L.int64), x, grad=False)
    assert k.requires_grad is False


HALF_VALUES = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1 / 3,
    65504.0,
    65520.0,
    1e5,
    6e-8,
    1e-8,
    3e38,
    1e-40,
    float("inf"),
    float("-inf"),
    float("nan"),
    1.00390625,
    1.005859375,
    2049.0,
    2051.0,
    257.5,
]


@pytest.mark.parametrize("half", U.HALF_DTYPES, ids=U.dtype_id)
def test_half_round_trips(half):
    """Rounding of Python floats, float32 and float64 tensors to half types, and back, equals torch's."""
    th = U.K2T[half]
    U.assert_close(kiln.tensor(HALF_VALUES, dtype=half), torch.tensor(HALF_VALUES, dtype=th), rtol=0, atol=0)
    for src in (kiln.float32, kiln.float64):
        k = kiln.tensor(HALF_VALUES, dtype=src).to(half)
        t = torch.tensor(HALF_VALUES, dtype=U.K2T[src]).to(th)
        U.assert_close(k, t, rtol=0, atol=0)
        U.assert_close(k.to(src), t.to(U.K2T[src]), rtol=0, atol=0)
    k = kiln.tensor(HALF_VALUES, dtype=half)
    t = torch.tensor(HALF_VALUES, dtype=th)
    kl, tl = k.tolist(), t.tolist()
    assert all((np.isnan(a) and np.isnan(b)) or a == b for a, b in zip(kl, tl)), (kl, tl)
    assert all(type(v) is float for v in kl)
    assert [float(v) for v in k.float().numpy()] == [float(v) for v in t.float().numpy()] or np.array_equal(
        k.float().numpy(), t.float().numpy(), equal_nan=True
    )


@pytest.mark.parametrize("half", U.HALF_DTYPES, ids=U.dtype_id)
def test_half_arithmetic_rounds_like_torch(half):
    """Half-precision ops compute in float32 and round once (torch's CPU kernels)."""
    a = U.make_pair((64,), half, seed=3)
    b = U.make_pair((64,), half, seed=4, low=0.5, high=2)
    for fn in (
        lambda L, x, y: x + y,
        lambda L, x, y: x * y,
        lambda L, x, y: x / y,
        lambda L, x, y: x.exp(),
        lambda L, x, y: x.sigmoid(),
        lambda L, x, y: x.sum(),
        lambda L, x, y: x - 0.1,
    ):
        U.check_op(fn, a, b, grad=False, rtol=0, atol=0)
