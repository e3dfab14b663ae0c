"""Tensor.pin_memory() and Tensor.is_pinned(): PyTorch's behaviour without an accelerator (its CPU build is
the oracle), and the device contract's pinned-memory hooks with a fake accelerator registered here."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln import plugins


class PinBox:
    """A plugin for device type "pinbox": NumPy-backed storage, and "pinned" host arrays it hands out and
    recognises by address (as kiln-cuda does with page-locked memory)."""

    def __init__(self) -> None:
        self.pinned: list = []  # weak references would do; the tests want to see what was allocated

    def kiln_register_devices(self, register):
        def pin_memory(numel, np_dtype):
            a = np.empty(numel, np_dtype)
            self.pinned.append(a)
            return a

        def is_pinned(array):
            p = array.__array_interface__["data"][0]
            return any(
                a.__array_interface__["data"][0] <= p < a.__array_interface__["data"][0] + max(a.nbytes, 1)
                for a in self.pinned
            )

        register(
            "pinbox",
            empty=lambda n, dtype, index=None: np.empty(n, dtype.numpy),
            to_host=lambda s: s.copy(),
            from_host=lambda a, index=None: np.array(a),
            write=lambda s, start, a: s.__setitem__(slice(start, start + a.size), a),
            pin_memory=pin_memory,
            is_pinned=is_pinned,
        )


@pytest.fixture
def pinbox():
    box = PinBox()
    plugins.register_plugin(box, name="pinbox-plugin")
    try:
        yield box
    finally:
        plugins.unregister_plugin("pinbox-plugin")


def test_without_an_accelerator_as_pytorch():
    for lib in (kiln, torch):
        t = lib.ones(3)
        assert t.is_pinned() is False
        with pytest.raises(RuntimeError, match=r"^Cannot access accelerator device when none is available\.$"):
            t.pin_memory()


def test_pinned_copy(pinbox):
    t = kiln.arange(12.0).reshape(3, 4).t()  # not contiguous
    p = t.pin_memory()
    assert p.device == kiln.device("cpu") and p.is_pinned() and not t.is_pinned()
    assert p.tolist() == t.tolist() and p.is_contiguous() and p.dtype is t.dtype
    assert len(pinbox.pinned) == 1 and p.pin_memory() is p  # pinned already: itself, nothing allocated
    assert p[1:].is_pinned() and kiln.from_numpy(p.numpy()).is_pinned()  # views of pinned memory
    p[0, 0] = 100.0  # a copy: the source is untouched
    assert t[0, 0].item() == 0.0


@pytest.mark.parametrize("dtype", [kiln.bfloat16, kiln.int8, kiln.bool, kiln.float64])
def test_dtypes_and_empty(pinbox, dtype):
    t = kiln.tensor([1, 0, 1], dtype=dtype)
    assert t.pin_memory().tolist() == t.tolist() and t.pin_memory().dtype is dtype
    e = kiln.empty(0, 2, dtype=dtype).pin_memory()
    assert e.shape == (0, 2) and e.is_pinned()


def test_refusals(pinbox):
    with pytest.raises(
        RuntimeError, match=r"cannot pin 'kiln\.pinbox\.FloatTensor' only dense CPU tensors can be pinned"
    ):
        kiln.ones(2, device="pinbox").pin_memory()
    assert kiln.ones(2, device="pinbox").is_pinned() is False
    with pytest.raises(RuntimeError, match="requires grad"):  # never a copy cut out of the graph
        kiln.ones(2, requires_grad=True).pin_memory()
    assert kiln.ones(2, requires_grad=True).detach().pin_memory().is_pinned()


def test_the_device_argument_is_deprecated_as_in_pytorch(pinbox):
    for lib, dev in ((kiln, "pinbox"), (torch, "cpu")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            lib.ones(2).is_pinned(dev)
        messages = [str(w.message).split(" (Triggered internally")[0] for w in seen if w.category is DeprecationWarning]
        assert messages == [
            "The argument 'device' of Tensor.is_pinned() is deprecated. Please do not pass this argument."
        ]
    with pytest.warns(DeprecationWarning, match="'device' of Tensor.pin_memory"):
        assert kiln.ones(2).pin_memory("pinbox").is_pinned()


def test_pinned_tensors_copy_to_the_device_and_back(pinbox):
    p = kiln.arange(5.0).pin_memory()
    d = p.to("pinbox", non_blocking=True)
    assert d.device.type == "pinbox" and d.cpu().tolist() == p.tolist()
    del p, d
    gc.collect()


def test_type_names_the_device():
    """``Tensor.type()`` names the device as PyTorch does (``torch.cuda.FloatTensor``), and a type name moves
    the tensor there."""
    assert kiln.ones(1).type() == "kiln.FloatTensor" == torch.ones(1).type().replace("torch", "kiln")
    assert kiln.ones(1).type("torch.LongTensor").dtype is kiln.int64
    with pytest.raises(ValueError, match=r"invalid type: 'kiln\.a\.b\.FloatTensor'"):
        kiln.ones(1).type("kiln.a.b.FloatTensor")


def test_type_of_a_device_tensor(pinbox):
    x = kiln.ones(2, device="pinbox", dtype=kiln.int64)
    assert x.type() == "kiln.pinbox.LongTensor"
    y = kiln.ones(2).type("kiln.pinbox.DoubleTensor")
    assert y.device.type == "pinbox" and y.dtype is kiln.float64
    assert y.type("torch.FloatTensor").device == kiln.device("cpu")
