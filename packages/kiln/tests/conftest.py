"""Shared helpers for kiln's differential test suite: PyTorch (CPU) is the oracle (architecture page, "Correctness and performance").

Every test builds the *same* values in kiln and in PyTorch, runs the same code on both (most helpers
take a function ``fn(lib, *args)`` that is called once with ``lib=torch`` and once with ``lib=kiln``,
which works because kiln mirrors PyTorch's names) and compares results, dtypes, shapes, gradients and
error messages.

The suite runs with ``--import-mode=importlib``, where test modules cannot import this conftest by
name. So this module also registers itself as ``kiln_testutil`` in ``sys.modules`` (pytest always
loads a directory's conftest before that directory's test modules); tests do
``import kiln_testutil as U``.

Hypothesis: the ``kiln-ci`` profile (default) is derandomized with a modest example count so CI is
reproducible and fast; ``KILN_HYPOTHESIS_PROFILE=kiln-thorough`` explores more.
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kiln
from kiln import _dtype

# ---------------------------------------------------------------------------------------- hypothesis

_SUPPRESS = [
    HealthCheck.too_slow,
    HealthCheck.function_scoped_fixture,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
]
settings.register_profile(
    "kiln-ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=_SUPPRESS,
)
settings.register_profile(
    "kiln-thorough", max_examples=300, deadline=None, database=None, print_blob=True, suppress_health_check=_SUPPRESS
)
settings.load_profile(os.environ.get("KILN_HYPOTHESIS_PROFILE", "kiln-ci"))

# ---------------------------------------------------------------------------------------- dtypes

ALL_DTYPES = _dtype.ALL_DTYPES  # the core's one list, in promotion order
TORCH_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)
K2T = dict(zip(ALL_DTYPES, TORCH_DTYPES))
T2K = dict(zip(TORCH_DTYPES, ALL_DTYPES))
FLOAT_DTYPES = (kiln.float32, kiln.float64)
HALF_DTYPES = (kiln.float16, kiln.bfloat16)
INT_DTYPES = (kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64)
NON_FLOAT_DTYPES = (kiln.bool,) + INT_DTYPES

# Tolerances per result dtype: torch.testing's defaults.
TOLERANCES = {
    kiln.float16: (1e-3, 1e-5),
    kiln.bfloat16: (1.6e-2, 1e-5),
    kiln.float32: (1.3e-6, 1e-5),
    kiln.float64: (1e-7, 1e-7),
}


def dtype_id(d) -> str:
    """A short pytest id for a kiln or torch dtype."""
    return str(d).split(".")[-1]


# ---------------------------------------------------------------------------------------- conversion


def np_to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor holding a copy of ``a`` (bfloat16 arrays from ml_dtypes included)."""
    a = np.array(a, order="C", copy=True)
    if a.dtype == ml_dtypes.bfloat16:
        src = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        src = torch.from_numpy(a)
    # a fresh contiguous torch allocation (version 0): from_numpy keeps NumPy's strides, odd for empty arrays
    return src.clone(memory_format=torch.contiguous_format)


def torch_to_np(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of a torch tensor's values (bfloat16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return np.array(t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16), copy=True)
    return np.array(t.numpy(), copy=True)


def kiln_to_np(k: kiln.Tensor) -> np.ndarray:
    """A NumPy copy of a kiln tensor's values."""
    return np.array(k.detach().numpy(), copy=True)


def to_torch(k: kiln.Tensor, requires_grad: bool | None = None) -> torch.Tensor:
    """A torch tensor with a kiln tensor's values and dtype (a copy; ``requires_grad`` copied by default)."""
    t = np_to_torch(kiln_to_np(k))
    assert t.dtype == K2T[k.dtype]
    rg = k.requires_grad if requires_grad is None else requires_grad
    return t.requires_grad_(rg) if rg else t


def to_kiln(t: torch.Tensor, requires_grad: bool | None = None) -> kiln.Tensor:
    """A kiln tensor with a torch tensor's values and dtype (a copy; ``requires_grad`` copied by default)."""
    rg = t.requires_grad if requires_grad is None else requires_grad
    return kiln.tensor(torch_to_np(t), dtype=T2K[t.dtype], requires_grad=bool(rg))


def both(a: np.ndarray, dtype=None, requires_grad: bool = False) -> tuple[kiln.Tensor, torch.Tensor]:
    """The same values as a (kiln, torch) pair of fresh contiguous leaves."""
    a = np.asarray(a)
    if dtype is not None:
        a = a.astype(dtype.numpy)
    k = kiln.tensor(a, dtype=kiln_dtype_of_np(a.dtype), requires_grad=requires_grad)
    t = np_to_torch(a)
    if requires_grad:
        t.requires_grad_(True)
    return k, t


def kiln_dtype_of_np(d: np.dtype):
    for k in ALL_DTYPES:
        if k.numpy == d:
            return k
    raise TypeError(d)


# ---------------------------------------------------------------------------------------- random data


def rand_array(shape, dtype, rng: np.random.Generator, *, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random values of ``dtype`` (a kiln dtype) in ``[low, high]`` (``[0, 10]`` for uint8)."""
    shape = tuple(shape)
    if dtype is kiln.bool:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INT_DTYPES:
        lo, hi = (0, 10) if dtype is kiln.uint8 else (int(np.floor(low)), int(np.ceil(high)))
        return np.asarray(rng.integers(lo, hi + 1, size=shape)).astype(dtype.numpy)
    return np.asarray(rng.uniform(low, high, size=shape)).astype(dtype.numpy)


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------- layouts

LAYOUTS = ("contiguous", "transposed", "strided", "expanded")


@dataclass
class Pair:
    """One operand in both libraries: ``k``/``t`` are what the op sees (possibly non-contiguous views
    of the leaves ``k_leaf``/``t_leaf``, which receive gradients); ``data`` holds the view's values."""

    k: kiln.Tensor
    t: torch.Tensor
    k_leaf: kiln.Tensor
    t_leaf: torch.Tensor
    data: np.ndarray
    layout: str

    def __repr__(self) -> str:  # hypothesis / pytest output
        return f"Pair({self.layout}, shape={tuple(self.t.shape)}, stride={self.t.stride()}, dtype={self.t.dtype})"


def _layout_view(lib_tensor, layout: str, shape: tuple):
    """Apply the layout's view op (same code for kiln and torch)."""
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        return lib_tensor.permute(*reversed(range(nd)))
    if layout == "strided":
        if nd == 0:
            return lib_tensor[1]
        key = tuple(slice(None, None, 2) for _ in shape[:-1]) + (slice(1, None, 2),)
        return lib_tensor[key]
    if layout == "expanded":
        return lib_tensor.expand(*shape) if nd else lib_tensor.expand(())
    return lib_tensor


def _layout_base(data_fn, layout: str, shape: tuple, rng) -> tuple[np.ndarray, np.ndarray]:
    """(base array for the leaf, the values the view will show)."""
    nd = len(shape)
    if layout == "transposed" and nd >= 2:
        data = data_fn(shape)
        return np.array(np.transpose(data), order="C", copy=True), data
    if layout == "strided":
        data = data_fn(shape)
        if nd == 0:
            base = data_fn((3,))
            base[1] = data
            return base, data
        base_shape = tuple(2 * s for s in shape[:-1]) + (2 * shape[-1] + 1,)
        base = data_fn(base_shape)
        key = tuple(slice(None, None, 2) for _ in shape[:-1]) + (slice(1, None, 2),)
        base[key] = data
        return base, data
    if layout == "expanded":
        base_shape = tuple(1 if i % 2 == 0 else s for i, s in enumerate(shape))
        base = data_fn(base_shape)
        return base, np.broadcast_to(base, shape).copy()
    data = data_fn(shape)
    return data, data


def make_pair(
    shape,
    dtype=kiln.float32,
    *,
    layout: str = "contiguous",
    seed: int = 0,
    rng: np.random.Generator | None = None,
    requires_grad: bool = False,
    low: float = -3.0,
    high: float = 3.0,
    values: np.ndarray | None = None,
    integral: bool = False,
) -> Pair:
    """The same operand in kiln and torch, laid out per ``layout`` (see :data:`LAYOUTS`).

    ``values``: use these values (of ``shape``) instead of random ones (any layout but ``expanded``).
    ``integral``: round random float values to integers (so that ties and equalities occur).
    """
    shape = tuple(shape)
    rng = rng if rng is not None else rng_for(seed)
    if values is not None:
        values = np.asarray(values).astype(dtype.numpy)
        assert values.shape == shape
        assert layout != "expanded", "explicit values cannot be expanded"

        def data_fn(s):
            if s == shape:
                return np.array(values, copy=True)
            return rand_array(s, dtype, rng, low=low, high=high)

    else:

        def data_fn(s):
            a = rand_array(s, dtype, rng, low=low, high=high)
            return np.round(a) if integral and dtype.is_floating_point else a

    base, data = _layout_base(data_fn, layout, shape, rng)
    k_leaf = kiln.tensor(base, dtype=dtype)
    t_leaf = np_to_torch(base)
    assert t_leaf.dtype == K2T[dtype]
    if requires_grad:
        k_leaf.requires_grad_(True)
        t_leaf.requires_grad_(True)
    k = _layout_view(k_leaf, layout, shape)
    t = _layout_view(t_leaf, layout, shape)
    assert tuple(t.shape) == shape
    return Pair(k, t, k_leaf, t_leaf, data, layout)


# ---------------------------------------------------------------------------------------- comparison


def _is_structseq(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "values") and hasattr(x, "indices")


def assert_close(
    k: Any,
    t: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    check_dtype: bool = True,
    check_stride: bool = False,
    msg: str = "",
) -> None:
    """``k`` (kiln result) equals ``t`` (torch result): type, shape, dtype, values (dtype tolerances).

    Tuples (and torch's ``return_types``) are compared element by element; ``None`` must match ``None``;
    Python scalars must have the same Python type.
    """
    if t is None:
        assert k is None, f"{msg}expected None, got {k!r}"
        return
    if isinstance(t, (tuple, list)):
        assert isinstance(k, (tuple, list)), f"{msg}expected a sequence, got {type(k).__name__}"
        assert len(k) == len(t), f"{msg}length {len(k)} != {len(t)}"
        if _is_structseq(t):
            assert _is_structseq(k), f"{msg}expected a (values, indices) named tuple, got {type(k).__name__}"
            assert_close(
                k.values,
                t.values,
                rtol=rtol,
                atol=atol,
                equal_nan=equal_nan,
                check_dtype=check_dtype,
                check_stride=check_stride,
                msg=f"{msg}.values: ",
            )
            assert_close(k.indices, t.indices, check_stride=check_stride, msg=f"{msg}.indices: ")
            return
        for i, (a, b) in enumerate(zip(k, t)):
            assert_close(
                a,
                b,
                rtol=rtol,
                atol=atol,
                equal_nan=equal_nan,
                check_dtype=check_dtype,
                check_stride=check_stride,
                msg=f"{msg}[{i}] ",
            )
        return
    if isinstance(t, torch.Tensor):
        assert isinstance(k, kiln.Tensor), f"{msg}expected a kiln.Tensor, got {type(k).__name__}: {k!r}"
        assert tuple(k.shape) == tuple(t.shape), f"{msg}shape {tuple(k.shape)} != torch's {tuple(t.shape)}"
        if check_dtype:
            assert k.dtype is T2K[t.dtype], f"{msg}dtype {k.dtype} != torch's {t.dtype}"
        if check_stride and t.numel() > 0:  # strides of empty tensors are an implementation detail
            assert tuple(k.stride()) == tuple(t.stride()), f"{msg}stride {k.stride()} != torch's {t.stride()}"
        ka, ta = kiln_to_np(k), torch_to_np(t)
        if t.dtype.is_floating_point:
            r, a = TOLERANCES[T2K[t.dtype]]
            r = r if rtol is None else rtol
            a = a if atol is None else atol
            np.testing.assert_allclose(
                ka.astype(np.float64), ta.astype(np.float64), rtol=r, atol=a, equal_nan=equal_nan, err_msg=msg
            )
        else:
            np.testing.assert_array_equal(ka.astype(ta.dtype) if not check_dtype else ka, ta, err_msg=msg)
        return
    if isinstance(t, (bool, int, float)):
        assert type(k) is type(t), f"{msg}python type {type(k).__name__} != torch's {type(t).__name__}"
        if isinstance(t, float):
            if np.isnan(t):
                assert np.isnan(k), f"{msg}{k} != nan"
            else:
                assert k == pytest.approx(t, rel=rtol or 1e-6, abs=atol or 1e-6), f"{msg}{k} != {t}"
        else:
            assert k == t, f"{msg}{k} != {t}"
        return
    assert k == t, f"{msg}{k!r} != {t!r}"


def _flat_outputs(out) -> list:
    if isinstance(out, (tuple, list)):
        r = []
        for o in out:
            r.extend(_flat_outputs(o))
        return r
    return [out]


def check_backward(
    k_out,
    t_out,
    pairs: Sequence,
    *,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Backpropagate the same random upstream gradient through the kiln and torch outputs and compare
    the gradients of every leaf in ``pairs`` (``Pair`` objects or ``(kiln_leaf, torch_leaf)`` tuples)."""
    k_outs, t_outs = _flat_outputs(k_out), _flat_outputs(t_out)
    assert len(k_outs) == len(t_outs)
    rng = rng_for(seed + 7919)
    kk, tt, kg, tg = [], [], [], []
    for i, (ko, to) in enumerate(zip(k_outs, t_outs)):
        if not isinstance(to, torch.Tensor):
            continue
        assert ko.requires_grad == to.requires_grad, (
            f"output {i}: requires_grad {ko.requires_grad} != torch's {to.requires_grad}"
        )
        if to.requires_grad:
            assert (ko.grad_fn is None) == (to.grad_fn is None), (
                f"output {i}: grad_fn {ko.grad_fn} vs torch's {to.grad_fn}"
            )
            g = rand_array(tuple(to.shape), T2K[to.dtype], rng)
            kk.append(ko)
            tt.append(to)
            kg.append(kiln.tensor(g, dtype=T2K[to.dtype]))
            tg.append(np_to_torch(g))
    if not tt:
        return
    torch.autograd.backward(tt, tg)
    kiln.autograd.backward(kk, kg)
    for j, p in enumerate(pairs):
        kl, tl = (p.k_leaf, p.t_leaf) if isinstance(p, Pair) else p
        if tl.requires_grad:
            assert_close(kl.grad, tl.grad, rtol=rtol, atol=atol, msg=f"grad of input {j}: ")


def check_op(
    fn: Callable,
    *args,
    grad: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
    grad_rtol: float | None = None,
    grad_atol: float | None = None,
    seed: int = 0,
    check_stride: bool = False,
):
    """Run ``fn(lib, *operands)`` with torch and with kiln on the same operands and compare forward
    results (and, with ``grad``, the gradients of every ``Pair`` leaf that requires grad).

    ``Pair`` arguments are unpacked to each library's tensor; other arguments are passed as they are.
    If torch raises, kiln must raise the same exception type. Returns ``(kiln_out, torch_out)``.
    """
    targs = [a.t if isinstance(a, Pair) else a for a in args]
    kargs = [a.k if isinstance(a, Pair) else a for a in args]
    try:
        t_out = fn(torch, *targs)
    except Exception as exc:  # noqa: BLE001 - the op is invalid for these operands: kiln must refuse too
        with pytest.raises(type(exc)):
            fn(kiln, *kargs)
        return None, None
    k_out = fn(kiln, *kargs)
    assert_close(k_out, t_out, rtol=rtol, atol=atol, check_stride=check_stride)
    if grad:
        check_backward(
            k_out, t_out, [a for a in args if isinstance(a, Pair)], seed=seed, rtol=grad_rtol, atol=grad_atol
        )
    return k_out, t_out


def mismatch(fn: Callable, *args, **kwargs) -> str | None:
    """:func:`check_op` as a value: None when kiln agrees with torch, else a description.

    For tests that sweep many cases (dtype pairs, scalars) and report every disagreement at once.
    """
    try:
        check_op(fn, *args, **kwargs)
    except (AssertionError, pytest.fail.Exception) as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    except Exception as exc:  # noqa: BLE001 - kiln raised where torch did not: reported, not swallowed
        return f"kiln raised {type(exc).__name__}: {exc}"
    return None


def report(mismatches: dict) -> None:
    """Fail listing every case in ``mismatches`` (case -> description) that is not None."""
    bad = {k: v for k, v in mismatches.items() if v is not None}
    if bad:
        lines = [f"{len(bad)} of {len(mismatches)} cases disagree with torch:"]
        lines += [
            f"  {k}: {v.splitlines()[0] if v else v}"
            + (" | " + " ".join(v.splitlines()[1:6]) if v and len(v.splitlines()) > 1 else "")
            for k, v in bad.items()
        ]
        pytest.fail("\n".join(lines), pytrace=False)


# ---------------------------------------------------------------------------------------- errors


def torch_error(torch_fn: Callable) -> BaseException:
    """The exception torch raises for ``torch_fn()`` (the premise of an error test)."""
    try:
        torch_fn()
    except Exception as exc:  # noqa: BLE001 - any exception is the expected outcome here
        return exc
    raise AssertionError("torch did not raise: the test's premise is wrong")


def kiln_message(torch_message: str) -> str:
    """torch's message as kiln should word it (``torch.`` → ``kiln.``)."""
    return torch_message.replace("torch.", "kiln.")


def assert_same_error(kiln_fn: Callable, torch_fn: Callable, *, message: str | None = None, exact: bool = False):
    """kiln raises torch's exception type with torch's message (contained in kiln's; ``exact``: equal).

    ``message`` overrides the torch message (when torch's needs adapting, e.g. a device name).
    """
    exc = torch_error(torch_fn)
    expected = kiln_message(str(exc)) if message is None else message
    if isinstance(exc, KeyError):
        expected = expected.strip("'\"")
    with pytest.raises(type(exc)) as info:
        kiln_fn()
    got = str(info.value)
    if exact:
        assert got == expected, f"kiln's message {got!r} != torch's {expected!r}"
    else:
        assert re.search(re.escape(expected), got), f"kiln's message {got!r} does not contain torch's {expected!r}"
    return info


# ---------------------------------------------------------------------------------------- strategies


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4):
    """Hypothesis strategy: tensor shapes (including 0-d and 0-size dims by default)."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(
    num_shapes: int = 2, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4
):
    """Hypothesis strategy: tuples of mutually broadcastable shapes of (possibly) different ranks."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    ).map(lambda r: r.input_shapes)


layouts = st.sampled_from(LAYOUTS)
seeds = st.integers(0, 2**31 - 1)
float_dtypes = st.sampled_from(FLOAT_DTYPES)


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _isolate_global_state():
    """Restore default dtypes, grad mode and anomaly mode of both libraries after every test."""
    kd, td = kiln.get_default_dtype(), torch.get_default_dtype()
    ka, ta = kiln.autograd.is_anomaly_enabled(), torch.is_anomaly_enabled()
    yield
    kiln.set_default_dtype(kd)
    torch.set_default_dtype(td)
    kiln.set_grad_enabled(True)
    torch.set_grad_enabled(True)
    kiln.autograd.set_detect_anomaly(ka)
    torch.autograd.set_detect_anomaly(ta)


@pytest.fixture
def alone_among_workers():
    """Hold a lock file that every test taking this fixture holds while it runs, across pytest-xdist's
    worker processes: the multiprocessing tests check that no shared-memory segment or error file in the
    machine-wide directories outlives them, which a test on another worker creating its own meanwhile
    would break."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "kiln_tests_multiprocessing.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def default_dtype():
    """Call with a kiln floating dtype to set it as the default in kiln and torch (restored after)."""

    def set_both(d):
        kiln.set_default_dtype(d)
        torch.set_default_dtype(K2T[d])

    return set_both


def check_all_dtype_pairs(fn: Callable) -> None:
    """``fn(lib, a, b)`` on every (dtype, dtype) pair of a (2, 3) and a broadcast (3,) operand: torch's result
    dtype, values and refusals. The second operand is nonzero (integer division by zero is tested apart)."""
    results = {}
    for i, da in enumerate(ALL_DTYPES):
        for j, db in enumerate(ALL_DTYPES):
            a = make_pair((2, 3), da, seed=10 * i + j, low=-4, high=4)
            b = make_pair((3,), db, seed=100 + 10 * i + j, low=1, high=4)
            results[f"{dtype_id(da)},{dtype_id(db)}"] = mismatch(fn, a, b, grad=False, rtol=1e-2, atol=1e-2)
    report(results)


# ---------------------------------------------------------------------------------------- export

_module = types.ModuleType("kiln_testutil", __doc__)
_module.__dict__.update({k: v for k, v in globals().items() if not k.startswith("__")})
sys.modules["kiln_testutil"] = _module
