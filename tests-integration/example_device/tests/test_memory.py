"""The example device's own unit tests (a vendor's tests of its allocator and device contract)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from kiln_example_device import device
from kiln_example_device.memory import Allocator

import kiln


def test_allocator_counts_live_blocks_and_peak():
    a = Allocator(0)
    b1 = a.allocate(1000, np.dtype(np.float32))
    b2 = a.allocate(24, np.dtype(np.int64))
    assert a.stats()["allocated_bytes.all.current"] == 1024
    assert a.stats()["allocation.all.current"] == 2
    assert len(b1) == 250 and len(b2) == 3
    assert b2.address - b1.address == 1024  # 1000 bytes rounded up to the 512-byte alignment
    del b1
    gc.collect()
    stats = a.stats()
    assert stats["allocated_bytes.all.current"] == 24 and stats["allocation.all.current"] == 1
    assert stats["allocated_bytes.all.peak"] == 1024 and stats["allocated_bytes.all.allocated"] == 1024
    a.reset_peak_stats()
    assert a.stats()["allocated_bytes.all.peak"] == 24
    del b2


def test_buffers_are_bytearrays_not_numpy_arrays():
    t = kiln.arange(6, dtype=kiln.int16, device="example")
    storage = t.untyped_storage()
    assert not isinstance(storage, np.ndarray)
    assert isinstance(storage.data, bytearray) and len(storage.data) == 12
    assert bytes(storage.data) == np.arange(6, dtype=np.int16).tobytes()


def test_each_device_index_has_its_own_memory():
    gc.collect()
    before = [kiln.example.memory_allocated(i) for i in range(2)]
    t = kiln.zeros(1000, dtype=kiln.float64, device="example:1")
    assert kiln.example.memory_allocated(1) - before[1] == 8000
    assert kiln.example.memory_allocated(0) == before[0]
    assert t.untyped_storage().device_index == 1
    assert t.data_ptr() >> 40 == 2  # example:1's address range
    del t


def test_views_address_into_the_same_block():
    t = kiln.zeros(4, 5, device="example")
    assert t[1:, 2:].data_ptr() == t.data_ptr() + (5 + 2) * 4


def test_half_precision_is_refused_by_name():
    with pytest.raises(TypeError, match="does not support float16"):
        kiln.zeros(2, dtype=kiln.float16, device="example")
    with pytest.raises(TypeError, match="does not support bfloat16"):
        kiln.ones(2, dtype=kiln.bfloat16).to("example")


def test_invalid_ordinal():
    with pytest.raises(RuntimeError, match="invalid device ordinal 2"):
        device.empty(1, kiln.float32, 2)
