"""The device contract, through an in-process device plugin whose storage is not a NumPy array.

``toydev`` keeps elements in a ``bytearray`` and provides only an ``add`` kernel; everything else
must come from the contract (creation, copies) or the opt-in CPU fallback.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from kiln import _plugins


class ByteStorage:
    """Device memory of the toy device: raw bytes plus the element dtype."""

    def __init__(self, data: bytes, np_dtype):
        self.buf = bytearray(data)
        self.np_dtype = np.dtype(np_dtype)

    def __len__(self):
        return len(self.buf) // self.np_dtype.itemsize


class ToyPlugin:
    def __init__(self):
        self.add_calls = 0

    def kiln_register_devices(self, register):
        register(
            "toydev",
            empty=lambda numel, dtype, index=None: ByteStorage(bytes(numel * dtype.itemsize), dtype.numpy),
            to_host=lambda s: np.frombuffer(bytes(s.buf), dtype=s.np_dtype).copy(),
            from_host=lambda a, index=None: ByteStorage(np.ascontiguousarray(a).tobytes(), a.dtype),
            write=_write,
            device_count=lambda: 2,
        )

    def kiln_register_kernels(self, register):
        def add(spec, a, b, alpha=1):
            self.add_calls += 1
            from kiln._ops.copy import from_host, host_array

            host = host_array(a) + (host_array(b) if isinstance(b, kiln.Tensor) else b) * alpha
            return from_host(np.asarray(host), spec[1], spec[2])

        register("add", "toydev", add, dtypes=(kiln.float32, kiln.float64))


def _write(storage, start, array):
    isz = storage.np_dtype.itemsize
    data = np.ascontiguousarray(array, dtype=storage.np_dtype).tobytes()
    storage.buf[start * isz : start * isz + len(data)] = data


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.delenv("KILN_CPU_FALLBACK", raising=False)
    plugin = ToyPlugin()
    _plugins.register_plugin(plugin, name="toy-plugin")
    yield plugin
    _plugins.unregister_plugin("toy-plugin")


def test_creation_and_round_trip(toy):
    t = kiln.tensor([[1.5, 2.0], [3.0, 4.0]], device="toydev")
    assert t.device == kiln.device("toydev:0")
    assert isinstance(t.untyped_storage(), ByteStorage)
    assert t.cpu().tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert kiln.zeros(3, device="toydev:1").device.index == 1
    assert kiln.ones(2, 2, dtype=kiln.int32, device="toydev").tolist() == [[1, 1], [1, 1]]
    assert repr(kiln.ones(2, device="toydev")) == "tensor([1., 1.], device='toydev:0')"


def test_registered_kernel_runs_and_views_stay_on_device(toy):
    t = kiln.arange(6.0, device="toydev").view(2, 3)
    u = t.t() + 1
    assert toy.add_calls == 1
    assert u.device.type == "toydev"
    assert u.cpu().tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]


def test_missing_kernel_names_op_device_plugin_and_way_out(toy):
    t = kiln.ones(3, device="toydev")
    with pytest.raises(NotImplementedError) as info:
        t * 2
    msg = str(info.value)
    assert "'mul'" in msg and "toydev" in msg and "toy-plugin" in msg and "KILN_CPU_FALLBACK=1" in msg


def test_cpu_fallback_warns_once_and_counts(toy, monkeypatch):
    monkeypatch.setenv("KILN_CPU_FALLBACK", "1")
    t = kiln.tensor([1.0, 2.0, 3.0], device="toydev")
    before = _plugins.fallback_counts().get(("mul", "toydev"), 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r1 = t * 2
        r2 = t * 3
    assert [str(w.message) for w in caught if "'mul'" in str(w.message)].__len__() == 1
    assert r1.device.type == "toydev" and r2.cpu().tolist() == [3.0, 6.0, 9.0]
    assert _plugins.fallback_counts()[("mul", "toydev")] == before + 2


def test_autograd_through_device(toy, monkeypatch):
    monkeypatch.setenv("KILN_CPU_FALLBACK", "1")
    x = kiln.tensor([1.0, -2.0, 3.0], device="toydev", requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = ((x + x) * x).sum()
        y.backward()
    assert x.grad.device.type == "toydev"
    assert x.grad.cpu().tolist() == [4.0, -8.0, 12.0]


def test_in_place_write_through_on_device(toy, monkeypatch):
    monkeypatch.setenv("KILN_CPU_FALLBACK", "1")
    t = kiln.zeros(2, 3, device="toydev")
    t[:, 1] = 7.0
    t[1] = kiln.tensor([1.0, 2.0, 3.0])
    assert t.cpu().tolist() == [[0.0, 7.0, 0.0], [1.0, 2.0, 3.0]]
    assert t._version == 2


def test_device_mismatch_message(toy):
    a = kiln.ones(3, device="toydev")
    b = kiln.ones(3)
    with pytest.raises(
        RuntimeError,
        match=r"^Expected all tensors to be on the same device, but found at least two devices, toydev:0 and cpu!$",
    ):
        a + b
    # a 0-d CPU tensor mixes with any device, as in PyTorch
    assert (a + kiln.tensor(1.0)).cpu().tolist() == [2.0, 2.0, 2.0]


def test_device_module_reports_contract(toy):
    assert kiln.toydev.is_available()
    assert kiln.toydev.device_count() == 2
    assert kiln.cuda.is_available() is False
    assert kiln.cuda.device_count() == 0


def test_unknown_device_type():
    with pytest.raises(RuntimeError, match="Device type 'nodev' is not registered"):
        kiln.ones(2, device="nodev")


def test_invalid_device_strings():
    for bad in ("cuda:x", "cuda:-1", ":0", "cu da"):
        with pytest.raises(RuntimeError):
            kiln.device(bad)
    assert kiln.device("cuda:1") is kiln.device("cuda", 1)
    assert str(kiln.device("cuda", 0)) == "cuda:0"
    assert repr(kiln.device("cpu")) == "device(type='cpu')"
    assert kiln.device("cuda:2").index == 2
