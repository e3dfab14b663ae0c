"""kiln.cuda's API and the device contract: devices, streams, events, the caching allocator."""

import gc

import numpy as np
import pytest

import kiln


def test_availability_and_properties():
    assert kiln.cuda.is_available()
    assert kiln.cuda.device_count() >= 1
    assert kiln.cuda.current_device() == 0
    props = kiln.cuda.get_device_properties(0)
    assert props.name == kiln.cuda.get_device_name() and props.total_memory > 0
    assert kiln.cuda.get_device_capability() == (props.major, props.minor)
    free, total = kiln.cuda.mem_get_info()
    assert 0 <= free <= total
    assert "Stream" in dir(kiln.cuda) and "memory_summary" in kiln.cuda.__dir__()


def test_invalid_ordinal_is_a_clear_error():
    n = kiln.cuda.device_count()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        kiln.zeros(2, device=f"cuda:{n}")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        kiln.cuda.set_device(n)
    with pytest.raises(ValueError, match="Expected a cuda device"):
        kiln.cuda.set_device("cpu")


def test_device_context_and_device_of():
    t = kiln.ones(2, device="cuda")
    with kiln.cuda.device(0) as d:
        assert kiln.cuda.current_device() == 0 and d.idx == 0
    with kiln.cuda.device_of(t):
        assert kiln.cuda.current_device() == 0
    with kiln.cuda.device(None):
        assert kiln.cuda.current_device() == 0


@pytest.mark.parametrize(
    "dtype",
    [kiln.bool, kiln.uint8, kiln.int8, kiln.int32, kiln.int64, kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64],
)
def test_round_trip_every_dtype(dtype):
    src = kiln.tensor([[0, 1, 2], [3, 4, 5]]).to(dtype)
    for moved in (src.cuda(), src.to("cuda"), src.to("cuda:0"), kiln.tensor(src.tolist(), dtype=dtype, device="cuda")):
        assert moved.device == kiln.device("cuda", 0)
        assert moved.dtype == dtype
        assert moved.cpu().tolist() == src.tolist()


def test_views_and_in_place_writes_stay_on_the_device():
    x = kiln.arange(12.0, device="cuda").reshape(3, 4)
    v = x.t()[1:]  # a non-contiguous view: no copy
    assert v.untyped_storage() is x.untyped_storage()
    v.fill_(7.0) if False else v.copy_(kiln.zeros(3, 3, device="cuda"))
    assert x.cpu().tolist() == [[0, 0, 0, 0], [4, 0, 0, 0], [8, 0, 0, 0]]
    x[0, 0] = 5.0
    assert x[0, 0].item() == 5.0


def test_allocator_reuses_freed_blocks():
    kiln.cuda.empty_cache()
    base_alloc = kiln.cuda.memory_allocated()
    a = kiln.empty(1000, device="cuda")
    assert kiln.cuda.memory_allocated() == base_alloc + 4096  # rounded to 512 bytes
    reserved = kiln.cuda.memory_reserved()
    ptr = a.data_ptr()
    del a
    gc.collect()
    assert kiln.cuda.memory_allocated() == base_alloc
    assert kiln.cuda.memory_reserved() == reserved  # cached, not given back
    b = kiln.empty(1000, device="cuda")
    assert b.data_ptr() == ptr  # the same block again
    assert kiln.cuda.memory_reserved() == reserved
    del b
    gc.collect()
    kiln.cuda.empty_cache()
    assert kiln.cuda.memory_reserved() < reserved


def test_peak_statistics_and_summary():
    kiln.cuda.reset_peak_memory_stats()
    start = kiln.cuda.memory_allocated()
    big = kiln.empty(1 << 20, dtype=kiln.uint8, device="cuda")
    assert kiln.cuda.max_memory_allocated() >= start + (1 << 20)
    del big
    gc.collect()
    assert kiln.cuda.max_memory_allocated() >= start + (1 << 20)
    kiln.cuda.reset_peak_memory_stats()
    assert kiln.cuda.max_memory_allocated() == kiln.cuda.memory_allocated()
    stats = kiln.cuda.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms", "segment.all.current"):
        assert key in stats
    summary = kiln.cuda.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary


def test_out_of_memory_names_the_sizes():
    total = kiln.cuda.get_device_properties().total_memory
    kiln.cuda.set_per_process_memory_fraction(0.0)
    try:
        with pytest.raises(
            kiln.cuda.OutOfMemoryError, match=r"CUDA out of memory\. Tried to allocate 4\.00 MiB"
        ) as info:
            kiln.empty(1 << 20, device="cuda")
        assert "allocated by kiln" in str(info.value) and "reserved by kiln but unallocated" in str(info.value)
        assert isinstance(info.value, RuntimeError)
        assert kiln.cuda.memory_stats()["num_ooms"] >= 1
    finally:
        kiln.cuda.set_per_process_memory_fraction(1.0)
    assert kiln.cuda.get_per_process_memory_fraction() == 1.0
    assert total > 0
    with pytest.raises(ValueError, match="Allowed range"):
        kiln.cuda.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        kiln.cuda.set_per_process_memory_fraction(1)


def test_streams_and_events():
    s = kiln.cuda.Stream()
    assert s != kiln.cuda.default_stream() and kiln.cuda.current_stream() == kiln.cuda.default_stream()
    start, end = kiln.cuda.Event(enable_timing=True), kiln.cuda.Event(enable_timing=True)
    with kiln.cuda.stream(s):
        assert kiln.cuda.current_stream() == s
        start.record()
        y = (kiln.ones(64, device="cuda") * 3).sum()
        end.record()
    assert kiln.cuda.current_stream() == kiln.cuda.default_stream()
    end.synchronize()
    assert end.query() and s.query()
    assert start.elapsed_time(end) >= 0.0
    kiln.cuda.current_stream().wait_stream(s)
    assert y.item() == 192.0
    with pytest.raises(ValueError, match="enable_timing=True"):
        kiln.cuda.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        kiln.cuda.Event(enable_timing=True).elapsed_time(end)
    kiln.cuda.synchronize()


def test_record_stream_delays_reuse():
    s = kiln.cuda.Stream()
    a = kiln.empty(3000, device="cuda")
    ptr = a.data_ptr()
    a.untyped_storage().record_stream(s)
    del a
    gc.collect()
    b = kiln.empty(3000, device="cuda")  # the block waits for s's work (done at once on the simulator)
    assert b.numel() == 3000 and isinstance(ptr, int)


def test_numpy_interop_and_errors():
    x = kiln.arange(6, device="cuda").reshape(2, 3)
    with pytest.raises(TypeError, match="cuda"):
        x.numpy()
    np.testing.assert_array_equal(x.cpu().numpy(), np.arange(6).reshape(2, 3))
    with pytest.raises(RuntimeError, match=r"same device|cuda"):
        x + kiln.ones(2, 3)


def test_doctor_reports_cuda():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kiln", "doctor"], capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert "cuda: available" in out, out + r.stderr
    assert "kernel cache:" in out


def test_cuda_is_absent_cleanly_without_the_plugin():
    import subprocess
    import sys

    code = "import kiln; print(kiln.cuda.is_available(), kiln.cuda.device_count())"
    env = {**__import__("os").environ, "KILN_DISABLE_PLUGINS": "cuda"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "0"]


class _Holder:
    """Another library's GPU array, as far as the CUDA array interface goes."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float16, kiln.int64, kiln.bool, kiln.uint8])
def test_cuda_array_interface_shares_memory(dtype):
    x = kiln.arange(12, device="cuda").reshape(3, 4).to(dtype)
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["strides"] is None and cai["stream"] != 0
    assert cai["data"][0] == x.data_ptr()
    y = kiln.as_tensor(_Holder(cai))
    assert y.device == x.device and y.dtype == dtype and y.cpu().tolist() == x.cpu().tolist()
    y[1, 2] = 0
    assert x[1, 2].item() == 0  # one memory
    t = x.t()[1:]
    assert t.__cuda_array_interface__["strides"] is not None
    z = kiln.asarray(_Holder(t.__cuda_array_interface__))
    assert z.cpu().tolist() == t.cpu().tolist() and z.stride() == t.stride()


def test_cuda_array_interface_errors():
    assert not hasattr(kiln.ones(2), "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="non-CUDA tensor type"):
        kiln.ones(2).__cuda_array_interface__
    with pytest.raises(RuntimeError, match="requires grad"):
        kiln.ones(2, device="cuda", requires_grad=True).__cuda_array_interface__
    with pytest.raises(TypeError, match="BFloat16"):
        kiln.ones(2, device="cuda", dtype=kiln.bfloat16).__cuda_array_interface__
    e = kiln.empty(0, 3, device="cuda")
    assert kiln.as_tensor(_Holder(e.__cuda_array_interface__)).shape == (0, 3)
    bad = dict(kiln.ones(4, device="cuda").__cuda_array_interface__, strides=(-4,))
    with pytest.raises(ValueError, match="strides"):
        kiln.as_tensor(_Holder(bad))


def test_tensor_from_storage_checks_bounds():
    import kiln.backend as kb

    x = kiln.ones(4, device="cuda")
    with pytest.raises(ValueError, match="needs 5 elements"):
        kb.tensor_from_storage(x.untyped_storage(), (5,), (1,), 0, kiln.float32, "cuda")
    v = kb.tensor_from_storage(x.untyped_storage(), (2,), (2,), 1, kiln.float32, "cuda")
    assert v.cpu().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16, kiln.int64, kiln.bool])
def test_pinned_host_memory(dtype):
    from kiln_cuda import device

    t = kiln.tensor([[1, 0, 3], [0, 5, 1]], dtype=dtype).t()
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned() and p.device == kiln.device("cpu") and p.pin_memory() is p
    assert p.tolist() == t.tolist() and p[1:].is_pinned() and kiln.from_numpy(p.numpy()).is_pinned()
    for non_blocking in (False, True):  # host -> device -> host from page-locked memory
        assert p.to("cuda", non_blocking=non_blocking).cpu().tolist() == t.tolist()
    alive = len(device._PINNED)
    del p
    gc.collect()
    assert len(device._PINNED) == alive - 1  # forgotten with its tensor
    assert kiln.empty(0, dtype=dtype).pin_memory().is_pinned()


def test_pinning_errors_and_type_names():
    c = kiln.ones(2, device="cuda")
    assert c.type() == "kiln.cuda.FloatTensor" and not c.is_pinned()
    with pytest.raises(RuntimeError, match=r"cannot pin 'kiln\.cuda\.FloatTensor' only dense CPU tensors"):
        c.pin_memory()
    assert kiln.ones(2).type("torch.cuda.LongTensor").device.type == "cuda"
