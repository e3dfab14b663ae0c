"""Factory functions of ``kiln._ops.factories`` and ``kiln._ops.windows`` against PyTorch: ``logspace``,
``range`` (deprecated: it warns), ``empty_strided``/``Tensor.new_empty_strided``, ``scalar_tensor``,
``tril_indices``/``triu_indices``, the five window functions, the legacy ``Tensor.new``; and the default
device (``get_default_device``/``set_default_device``), honoured by the factory functions, on an
in-process device plugin whose storage is not a NumPy array."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import inspect
import threading
import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln import _plugins


def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.range's deprecation, tested on its own
        return fn()


def _check(fn, **kw):
    """``fn(lib)`` in both libraries: torch's refusal (type and message) or the same values and dtype."""
    try:
        t = _quiet(lambda: fn(torch))
    except Exception:  # noqa: BLE001 - the case is invalid: kiln must refuse it with torch's error
        U.assert_same_error(lambda: _quiet(lambda: fn(kiln)), lambda: _quiet(lambda: fn(torch)))
        return
    k = _quiet(lambda: fn(kiln))
    U.assert_close(k, t, **kw)
    assert k.requires_grad == t.requires_grad


RANGES = [
    lambda L: L.logspace(0, 3, 4),
    lambda L: L.logspace(0, 3, 4, dtype=L.int64),
    lambda L: L.logspace(-1, 1, 3, dtype=L.int64),
    lambda L: L.logspace(0, 3, 4, base=2),
    lambda L: L.logspace(0, 3, 4, 2),
    lambda L: L.logspace(1, -1, 5, base=0.5, dtype=L.float64),
    lambda L: L.logspace(0, 3, 0),
    lambda L: L.logspace(0, 3, 1),
    lambda L: L.logspace(0, 3, -1),
    lambda L: L.logspace(L.tensor(0.0), 3, 4),
    lambda L: L.logspace(0, 3, 4, dtype=L.float64),
    lambda L: L.logspace(0, 3, 4, dtype=L.float16),
    lambda L: L.logspace(0, 3, 4, requires_grad=True),
    lambda L: L.logspace(0, 3, 4, dtype=L.bool),
    lambda L: L.logspace(0, 400, 3, dtype=L.float32),
    lambda L: L.range(1, 4),
    lambda L: L.range(1, 4, 0.5),
    lambda L: L.range(1, 4, dtype=L.int64),
    lambda L: L.range(4, 1, -1),
    lambda L: L.range(0, 1, 0.3),
    lambda L: L.range(1.0, 1.0),
    lambda L: L.range(-2.5, 2.5, 1.25, dtype=L.float64),
    lambda L: L.range(0, 3, requires_grad=True),
    lambda L: L.range(4, 1),
    lambda L: L.range(1, 4, 0),
    lambda L: L.range(1, 4, -1),
    lambda L: L.range(0, float("inf")),
    lambda L: L.range(0, 3, dtype=L.bool),
    lambda L: L.range(3),
    lambda L: L.scalar_tensor(1),
    lambda L: L.scalar_tensor(True),
    lambda L: L.scalar_tensor(1.5, dtype=L.float64),
    lambda L: L.scalar_tensor(1, dtype=L.int64),
    lambda L: L.scalar_tensor(1.5, requires_grad=True),
    lambda L: L.scalar_tensor(L.tensor(2)),
    lambda L: L.scalar_tensor(s=3),
    lambda L: L.scalar_tensor("a"),
    lambda L: L.tril_indices(3, 3),
    lambda L: L.tril_indices(3, 4, 1),
    lambda L: L.tril_indices(4, 3, -1),
    lambda L: L.tril_indices(3, 4, -5),
    lambda L: L.tril_indices(3, 4, 10),
    lambda L: L.tril_indices(0, 4),
    lambda L: L.tril_indices(3, 0),
    lambda L: L.tril_indices(-1, 4),
    lambda L: L.tril_indices(3, -4),
    lambda L: L.tril_indices(3, 3, dtype=L.int32),
    lambda L: L.tril_indices(3, 3, dtype=L.float32),
    lambda L: L.tril_indices(3, 3, dtype=L.bool),
    lambda L: L.triu_indices(3, 4, 1),
    lambda L: L.triu_indices(3, 4, -1),
    lambda L: L.triu_indices(4, 3, 2),
    lambda L: L.triu_indices(3, 4, -10),
    lambda L: L.triu_indices(3, 3, dtype=L.int16),
    lambda L: L.triu_indices(3, 3, dtype=L.float64),
]


@pytest.mark.parametrize("i", range(len(RANGES)))
def test_ranges_scalars_and_indices_match_torch(i):
    _check(RANGES[i])


def test_range_warns_as_torch():
    for lib in (kiln, torch):
        with pytest.warns(UserWarning, match=r"\.range is deprecated and will be removed in a future release"):
            lib.range(0, 2)


WINDOWS = ("bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window")


@pytest.mark.parametrize("length", [0, 1, 2, 5, 8, 33])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("name", WINDOWS)
def test_windows_match_torch(name, periodic, length):
    # torch computes in the requested dtype, kiln in float64 rounded once: an ulp apart in 16 bits
    for dtype, atol in ((kiln.float32, 1e-6), (kiln.float64, 1e-12), (kiln.float16, 2e-3), (kiln.bfloat16, 1.6e-2)):
        _check(lambda L: getattr(L, name)(length, periodic, dtype=getattr(L, dtype.name)), atol=atol)
    _check(lambda L: getattr(L, name)(length, periodic, requires_grad=True), atol=1e-6)


def test_window_parameters_and_errors_match_torch():
    for fn in (
        lambda L: L.hamming_window(7, True, 0.5),
        lambda L: L.hamming_window(7, False, 0.5, 0.4),
        lambda L: L.kaiser_window(7, False, 5.0),
        lambda L: L.kaiser_window(6, True, 0.0),
        lambda L: L.hann_window(-1),
        lambda L: L.bartlett_window(-2),
        lambda L: L.hann_window(5, dtype=L.int64),
        lambda L: L.kaiser_window(5, dtype=L.int32),
        lambda L: L.blackman_window(5, dtype=L.bool),
        lambda L: L.hann_window(5.0),
    ):
        _check(fn, atol=1e-6)


def test_window_default_dtype(default_dtype):
    default_dtype(kiln.float64)
    _check(lambda L: L.hann_window(6))


# ---------------------------------------------------------------------------------------- strided, new


@pytest.mark.parametrize(
    "size, stride",
    [((2, 3), (1, 2)), ((2, 3), (3, 1)), ((2, 3), (0, 0)), ((0, 3), (3, 1)), ((), ()), ((4,), (2,)), ((2, 2), (1, 1))],
)
def test_empty_strided_geometry_matches_torch(size, stride):
    for dtype in (None, kiln.float64, kiln.int32):
        kd, td = (None, None) if dtype is None else (dtype, U.K2T[dtype])
        k, t = kiln.empty_strided(size, stride, dtype=kd), torch.empty_strided(size, stride, dtype=td)
        assert (tuple(k.shape), k.stride(), k.dtype) == (tuple(t.shape), t.stride(), U.T2K[t.dtype])
        assert k.untyped_storage().size * k.element_size() == t.untyped_storage().size()
        n = kiln.zeros(1, dtype=kiln.int8).new_empty_strided(size, stride)
        m = torch.zeros(1, dtype=torch.int8).new_empty_strided(size, stride)
        assert (tuple(n.shape), n.stride(), n.dtype) == (tuple(m.shape), m.stride(), U.T2K[m.dtype])
    e = kiln.empty_strided(size, stride, requires_grad=True)
    assert e.requires_grad and e.is_leaf
    if k.numel():
        k.fill_(3)  # writable through its strides
        assert set(k.numpy().ravel().tolist()) == {3.0}


def test_empty_strided_errors_match_torch():
    for fn in (
        lambda L: L.empty_strided((2, 3), (1,)),
        lambda L: L.empty_strided((2, 3), (1, -2)),
        lambda L: L.empty_strided((2, -3), (1, 2)),
        lambda L: L.empty_strided((2, 3), (1, 2), dtype=L.int64, requires_grad=True),
        lambda L: L.zeros(2).new_empty_strided((2, 3), (1,)),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))
    e = kiln.zeros(1, dtype=kiln.int8).new_empty_strided((2, 3), (1, 2), dtype=kiln.float32, requires_grad=True)
    assert e.dtype is kiln.float32 and e.requires_grad


@pytest.mark.parametrize("dtype", (kiln.int32, kiln.float64, kiln.bool), ids=U.dtype_id)
def test_tensor_new_matches_torch(dtype):
    kx, tx = kiln.ones(2, dtype=dtype), torch.ones(2, dtype=U.K2T[dtype])
    for args in ((2, 3), ((2, 3),), (), (torch.Size([4]),), ([1, 0],), ([[1, 2]],)):
        kargs = tuple(kiln.Size(a) if isinstance(a, torch.Size) else a for a in args)
        k, t = kx.new(*kargs), tx.new(*args)
        assert (tuple(k.shape), k.dtype) == (tuple(t.shape), U.T2K[t.dtype])
        if args and isinstance(args[0], list):
            U.assert_close(k, t)
    alias = kx.new(kx)
    assert alias.data_ptr() == kx.data_ptr() and alias is not kx
    assert kx.new(2, device="cpu").device == kiln.device("cpu")
    U.assert_same_error(
        lambda: kx.new(kiln.ones(2, dtype=kiln.int8)),
        lambda: tx.new(torch.ones(2, dtype=torch.int8)),
        message="expected",
    )
    with pytest.raises(TypeError):
        kx.new([1, 2], dtype=kiln.float32)
    with pytest.raises(TypeError):
        tx.new([1, 2], dtype=torch.float32)


# ---------------------------------------------------------------------------------------- the default device


class _Storage:
    def __init__(self, a: np.ndarray):
        self.a = np.array(a, copy=True)

    def __len__(self):
        return len(self.a)


class _BoxPlugin:
    """A device whose memory is a NumPy array in a box (not a NumPy array itself)."""

    def kiln_register_devices(self, register):
        def write(storage, start, array):
            flat = np.ascontiguousarray(array).reshape(-1)
            storage.a[start : start + flat.size] = flat

        register(
            "boxdev",
            empty=lambda numel, dtype, index=None: _Storage(np.zeros(numel, dtype.numpy)),
            to_host=lambda s: s.a.copy(),
            from_host=lambda a, index=None: _Storage(a),
            write=write,
            device_count=lambda: 1,
        )


@pytest.fixture
def boxdev(monkeypatch):
    monkeypatch.delenv("KILN_CPU_FALLBACK", raising=False)
    _plugins.register_plugin(_BoxPlugin(), name="box-plugin")
    yield kiln.device("boxdev", 0)
    kiln.set_default_device(None)
    _plugins.unregister_plugin("box-plugin")


def test_default_device_is_the_cpu():
    assert kiln.get_default_device() == kiln.device("cpu")
    assert str(kiln.get_default_device()) == str(torch.get_default_device())


def test_default_device_is_honoured_by_factories(boxdev):
    kiln.set_default_device("boxdev")
    assert kiln.get_default_device() == boxdev
    made = {
        "zeros": kiln.zeros(2),
        "ones": kiln.ones(2),
        "empty": kiln.empty(2),
        "full": kiln.full((2,), 3.0),
        "tensor": kiln.tensor([1.0, 2.0]),
        "arange": kiln.arange(3),
        "linspace": kiln.linspace(0, 1, 3),
        "eye": kiln.eye(2),
        "rand": kiln.rand(2),
        "randn": kiln.randn(2),
        "randint": kiln.randint(0, 3, (2,)),
        "randperm": kiln.randperm(3),
        "normal": kiln.normal(0.0, 1.0, (2,)),
        "logspace": kiln.logspace(0, 1, 2),
        "empty_strided": kiln.empty_strided((2, 2), (1, 2)),
        "scalar_tensor": kiln.scalar_tensor(1.0),
        "tril_indices": kiln.tril_indices(2, 2),
        "hann_window": kiln.hann_window(3),
        "range": _quiet(lambda: kiln.range(0, 2)),
    }
    for name, t in made.items():
        assert t.device == boxdev, name
    assert kiln.zeros(2, device="cpu").device == kiln.device("cpu")  # an explicit device wins
    assert kiln.from_numpy(np.zeros(2)).device == kiln.device("cpu")  # shares memory: not affected
    cpu = kiln.ones(2, device="cpu")
    assert kiln.zeros_like(cpu).device == cpu.device  # _like functions follow their input
    assert kiln.tensor([1.5]).tolist() == [1.5]  # the values arrived
    seen = []
    worker = threading.Thread(target=lambda: seen.append(kiln.get_default_device()))
    worker.start()
    worker.join()
    assert seen == [kiln.device("cpu")]  # per thread, as PyTorch's
    kiln.set_default_device(None)
    assert kiln.zeros(1).device == kiln.device("cpu")


def test_default_device_errors():
    with pytest.raises(RuntimeError, match="not registered"):
        kiln.set_default_device("nodev")
    with pytest.raises(RuntimeError):
        kiln.set_default_device("cpu:x")
    assert kiln.get_default_device() == kiln.device("cpu")


def test_samplers_draw_on_a_device(boxdev):
    kiln.manual_seed(3)
    x = kiln.zeros(4, device=boxdev).normal_(2.0, 0.5)
    kiln.manual_seed(3)
    assert x.device == boxdev and x.tolist() == kiln.zeros(4).normal_(2.0, 0.5).tolist()  # the same stream
    assert kiln.zeros(3, device=boxdev).uniform_(1.0, 2.0).device == boxdev
    assert kiln.zeros(3, device=boxdev, dtype=kiln.int64).random_(5).device == boxdev
    mean, half, four = (kiln.full((3,), v, device=boxdev) for v in (0.0, 0.5, 4.0))
    for t in (kiln.normal(mean, 1.0), kiln.bernoulli(half), kiln.poisson(four)):
        assert t.device == boxdev and t.shape == (3,)
    assert kiln.binomial(four, half).device == boxdev
    assert kiln.arange(6.0, device=boxdev).unfold(0, 2, 2).tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_new_and_empty_strided_on_a_device(boxdev):
    x = kiln.ones(3, device=boxdev)
    assert x.new(2, 3).device == boxdev and x.new([1, 2]).tolist() == [1.0, 2.0]
    s = x.new_empty_strided((2, 3), (1, 2))
    assert s.device == boxdev and s.stride() == (1, 2)
    s.fill_(2.0)
    assert s.tolist() == [[2.0] * 3] * 2


# ---------------------------------------------------------------------------------------- signatures


def _kinds(fn) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_match_torch():
    for name in ("get_default_device", "set_default_device"):
        assert [(n, k) for n, k, _ in _kinds(getattr(kiln, name))] == [
            (n, k) for n, k, _ in _kinds(getattr(torch, name))
        ]
    documented = {  # torch's documented signatures, positional parameters and keyword-only ones
        "logspace": (["start", "end", "steps", "base"], ["out", "dtype", "layout", "device", "requires_grad"]),
        "range": (["start", "end", "step"], ["out", "dtype", "layout", "device", "requires_grad"]),
        "empty_strided": (["size", "stride"], ["dtype", "layout", "device", "requires_grad", "pin_memory"]),
        "scalar_tensor": (["s"], ["dtype", "layout", "device", "pin_memory", "requires_grad"]),
        "tril_indices": (["row", "col", "offset"], ["dtype", "device", "layout"]),
        "triu_indices": (["row", "col", "offset"], ["dtype", "device", "layout"]),
        "hann_window": (["window_length", "periodic"], ["dtype", "layout", "device", "requires_grad"]),
        "bartlett_window": (["window_length", "periodic"], ["dtype", "layout", "device", "requires_grad"]),
        "blackman_window": (["window_length", "periodic"], ["dtype", "layout", "device", "requires_grad"]),
        "hamming_window": (  # torch documents pin_memory for its first overload
            ["window_length", "periodic", "alpha", "beta"],
            ["dtype", "layout", "device", "requires_grad", "pin_memory"],
        ),
        "kaiser_window": (["window_length", "periodic", "beta"], ["dtype", "layout", "device", "requires_grad"]),
    }
    for name, (positional, keyword) in documented.items():
        params = _kinds(getattr(kiln, name))
        assert [n for n, k, _ in params if k == "POSITIONAL_OR_KEYWORD"] == positional, name
        assert [n for n, k, _ in params if k == "KEYWORD_ONLY"] == keyword, name
    assert dict((n, d) for n, _, d in _kinds(kiln.logspace))["base"] == 10.0
    assert dict((n, d) for n, _, d in _kinds(kiln.hamming_window))["alpha"] == 0.54
    assert dict((n, d) for n, _, d in _kinds(kiln.kaiser_window))["beta"] == 12.0
    assert dict((n, d) for n, _, d in _kinds(kiln.tril_indices))["dtype"] is kiln.int64
