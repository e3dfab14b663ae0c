"""PyTorch's module paths import in kiln (issue 19): the device-type modules (``import kiln.cuda``,
``from kiln.cuda import ...``), ``kiln.accelerator``, ``kiln.backends``, ``kiln.jit``, ``kiln.fft``'s
real helpers, the placeholders of packages not installed (``kiln.distributed``, ``kiln.onnx``), the
global switches, and the device-type tests on tensors, compared with PyTorch's CPU build."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import typing
import warnings

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------------------ device-type modules


def test_import_kiln_cuda_as_a_module():
    import kiln.cuda
    from kiln.cuda import device_count, is_available, manual_seed, manual_seed_all

    assert sys.modules["kiln.cuda"] is kiln.cuda
    assert is_available() is torch.cuda.is_available() is False
    assert device_count() == torch.cuda.device_count() == 0
    manual_seed(1)  # no GPU: accepted, as PyTorch queues it
    manual_seed_all(2)
    assert kiln.cuda.initial_seed() == 2


def test_every_device_type_is_a_module():
    mod = importlib.import_module("kiln.cpu")
    assert mod is kiln.cpu and mod.is_available()
    assert "is_available" in dir(mod) and "manual_seed_all" in mod.__all__


def test_cuda_seeding_reaches_the_cuda_generators_not_the_cpu_one():
    kiln.manual_seed(5)
    before = kiln.rand(3).tolist()
    kiln.manual_seed(5)
    kiln.cuda.manual_seed_all(123)
    assert kiln.rand(3).tolist() == before
    from kiln.random import default_generator

    assert default_generator("cuda").initial_seed() == 123


def test_rng_state_round_trip_per_device_type():
    kiln.cpu.manual_seed(7)
    state = kiln.cpu.get_rng_state()
    a = kiln.rand(4).tolist()
    kiln.cpu.set_rng_state(state)
    assert kiln.rand(4).tolist() == a
    states = kiln.cuda.get_rng_state_all()
    kiln.cuda.set_rng_state_all(states)
    assert len(states) == 1


def test_cuda_calls_that_need_a_device_say_what_to_install():
    assert kiln.cuda.memory_allocated() == torch.cuda.memory_allocated() == 0  # no device: nothing allocated
    assert kiln.cuda.memory_stats() == {}
    with pytest.raises(RuntimeError, match="pip install kiln-cuda"):
        kiln.cuda.synchronize()
    with pytest.raises(RuntimeError, match="pip install kiln-cuda"):
        kiln.cuda.init()
    kiln.cuda.empty_cache()  # nothing cached, nothing to do (PyTorch: a no-op before CUDA starts)
    assert kiln.cuda.is_initialized() is False


def test_unknown_submodule_is_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kiln.no_such_module")
    assert not hasattr(kiln, "no_such_module")


def test_cuda_amp_paths():
    pytest.importorskip("kiln.amp")
    from kiln.cuda.amp import GradScaler

    with pytest.warns(FutureWarning):
        scaler = GradScaler(enabled=False)
    assert scaler.is_enabled() is False
    assert importlib.import_module("kiln.cpu.amp").autocast is kiln.cpu.amp.autocast


# ----------------------------------------------------------------------------------- placeholders


def test_distributed_and_onnx_import_without_their_packages():
    try:
        importlib.import_module("kiln_distributed")
        pytest.skip("kiln-distributed is installed")
    except ModuleNotFoundError:
        pass
    import kiln.distributed as dist
    import kiln.onnx

    assert dist.is_available() is False and dist.is_initialized() is False
    assert kiln.onnx.is_in_onnx_export() is False
    with pytest.raises(AttributeError, match="pip install kiln-distributed"):
        dist.init_process_group("gloo")
    assert not hasattr(dist, "get_rank")  # probes work
    if importlib.util.find_spec("kiln_compile") is None:  # kiln.onnx is kiln-compile's
        with pytest.raises(AttributeError, match="pip install kiln-compile"):
            kiln.onnx.export(None, None, "m.onnx")
        assert getattr(kiln.onnx, "export", None) is None


def test_compile_without_its_package_names_it():
    if importlib.util.find_spec("kiln_compile") is not None:
        pytest.skip("kiln-compile is installed")
    with pytest.raises(ModuleNotFoundError, match="pip install kiln-compile"):
        kiln.compile(lambda x: x)
    with pytest.raises(AttributeError, match="pip install kiln-compile"):
        kiln.compile.explain(lambda x: x)
    m = kiln.nn.Linear(2, 2) if importlib.util.find_spec("kiln.nn") is not None else None
    if m is not None:
        with pytest.raises(ModuleNotFoundError, match="pip install kiln-compile"):
            m.compile()
    # torch.compiler's and torch._dynamo's names: the queries answer, the rest names the package
    assert kiln.compiler.is_compiling() is False and kiln.compiler.is_dynamo_compiling() is False
    assert kiln._dynamo.is_compiling() is False and kiln.compile.is_compiling() is False
    with pytest.raises(AttributeError, match="pip install kiln-compile"):
        kiln.compiler.reset()
    with pytest.raises(AttributeError, match="pip install kiln-compile"):
        kiln._dynamo.config.cache_size_limit = 16
    x = kiln.zeros(3, 4)  # torch._dynamo's marks: set, for no compiler to read
    kiln._dynamo.mark_dynamic(x, 0)
    kiln._dynamo.mark_static(x, 1)
    assert x._dynamo_dynamic_indices == {0} and x._dynamo_static_indices == {1}


def _dynamo_marks(t) -> dict:
    """The mark attributes ``torch._dynamo``'s functions set on ``t``, ranges as (dim, min, max)."""
    names = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices", "_dynamo_static_indices")
    others = ("_has_dynamo_dim_marking", "_dynamo_hint_overrides", "_specialize_on")
    out = {n: getattr(t, n, None) for n in (*names, *others)}
    out["ranges"] = {(r.dim, r.min, r.max) for r in getattr(t, "_dynamo_dynamic_range", ())}
    return out


def test_dynamo_marks_work_without_kiln_compile_as_pytorch_sets_them():
    """``kiln._dynamo``'s placeholder (kiln-compile missing) marks tensors with the core's functions, which
    set PyTorch's attributes with PyTorch's values and errors; with kiln-compile they are the same
    functions."""
    from kiln import _marks
    from kiln._device_module import _PLACEHOLDERS, _Placeholder

    placeholder = _Placeholder("_dynamo", *_PLACEHOLDERS["_dynamo"])
    installed = importlib.util.find_spec("kiln_compile") is not None
    for dyn in (placeholder, kiln._dynamo):
        assert dyn.mark_dynamic is _marks.mark_dynamic and dyn.mark_static is _marks.mark_static
        assert dyn.maybe_mark_dynamic is _marks.maybe_mark_dynamic
        assert dyn.is_compiling() is False
        if not installed:  # the placeholder's other names still name the package
            with pytest.raises(AttributeError, match="pip install kiln-compile"):
                dyn.set_stance("force_eager")
    for ours_lib, theirs_lib in ((placeholder, torch._dynamo), (kiln._dynamo, torch._dynamo)):
        ours, theirs = kiln.zeros(4, 5, 6), torch.zeros(4, 5, 6)
        for lib, t in ((ours_lib, ours), (theirs_lib, theirs)):
            lib.mark_dynamic(t, 0, min=2, max=8)
            lib.mark_dynamic(t, [2, (0,)], hint_override=7, specialize_on=[])
            lib.mark_dynamic(t, 1, hint_override=5)
            lib.maybe_mark_dynamic(t, 1)
            assert lib.mark_static(t, 2) is None
            lib.mark_static(t)  # every dim
        assert _dynamo_marks(ours) == _dynamo_marks(theirs)
        assert _dynamo_marks(ours)["ranges"] == {(0, 2, 8), (0, None, None), (1, None, None), (2, None, None)}
        assert ours._dynamo_hint_overrides == {1: 5}
        for calls in (  # PyTorch's recursion: a list marks entry by entry, None in mark_static's marks every dim
            lambda lib, t: lib.mark_static(t, [None]),
            lambda lib, t: lib.mark_static(t, [1, None]),
            lambda lib, t: lib.mark_static(t, []),
            lambda lib, t: lib.mark_dynamic(t, [0, "a"]),  # marks dim 0, then raises
            lambda lib, t: lib.maybe_mark_dynamic(t, [1, None]),
            lambda lib, t: lib.mark_dynamic(t, 1, specialize_on=(1, 2)),
        ):
            marked = []
            for lib, t in ((ours_lib, kiln.zeros(3, 4)), (theirs_lib, torch.zeros(3, 4))):
                try:
                    calls(lib, t)
                except AssertionError as exc:
                    marked.append((_dynamo_marks(t), str(exc)))
                else:
                    marked.append((_dynamo_marks(t), getattr(t, "_specialize_on", None)))
            assert marked[0] == marked[1]
        scalar = kiln.tensor(1.0)
        ours_lib.mark_static(scalar)  # no dims: nothing marked, as in PyTorch
        assert not hasattr(scalar, "_has_dynamo_dim_marking")
        for bad in ("0", 1.5, None):
            with pytest.raises(AssertionError) as theirs_err:
                torch._dynamo.mark_dynamic(torch.zeros(2), bad)
            with pytest.raises(AssertionError) as ours_err:
                ours_lib.mark_dynamic(kiln.zeros(2), bad)
            assert str(ours_err.value) == str(theirs_err.value)
        with pytest.raises(TypeError, match=r"expects a tensor/nn\.Module class but received <class 'int'>"):
            ours_lib.mark_static(3)  # (PyTorch: its issubclass call's TypeError)
    if importlib.util.find_spec("kiln.nn") is not None:
        linear = importlib.import_module("kiln.nn").Linear
        assert placeholder.mark_static(linear) is linear
        assert linear._dynamo_marked_static is True
        del linear._dynamo_marked_static


# ------------------------------------------------------------------------------------- accelerator


def _accelerators() -> list[str]:
    """The non-CPU device types a plugin registers here and reports usable (the example device, in its cell)."""
    from kiln import _plugins

    _plugins.load()
    return [n for n, c in _plugins._devices.items() if n != "cpu" and c.is_available()]


def test_accelerator_without_one_matches_pytorch():
    if _accelerators():
        pytest.skip(f"this environment has an accelerator device: {_accelerators()}")
    acc = kiln.accelerator
    assert acc.is_available() is torch.accelerator.is_available() is False
    assert acc.current_accelerator() is None and torch.accelerator.current_accelerator() is None
    assert acc.device_count() == torch.accelerator.device_count() == 0
    for name in ("synchronize", "empty_cache", "memory_allocated"):
        with pytest.raises(RuntimeError) as theirs:
            getattr(torch.accelerator, name)()
        with pytest.raises(RuntimeError) as ours:
            getattr(acc, name)()
        assert str(ours.value) == str(theirs.value)


def test_accelerator_is_a_plugin_device(toy_device=None):
    from kiln import _plugins

    contract = _plugins.DeviceType(
        name="toyacc",
        empty=lambda n, d, i: np.empty(n, d.np if hasattr(d, "np") else np.float32),
        to_host=lambda s: s,
        from_host=lambda a, i: a.copy(),
        write=lambda s, start, a: s.__setitem__(slice(start, start + len(a)), a),
        device_count=lambda: 3,
    )
    _plugins.load()
    others = {n: c for n, c in _plugins._devices.items() if n != "cpu"}  # the example device, in its cell
    for n in others:
        del _plugins._devices[n]
    _plugins._devices["toyacc"] = contract
    try:
        assert kiln.accelerator.current_accelerator() == kiln.device("toyacc")
        assert kiln.accelerator.device_count() == 3
        assert importlib.import_module("kiln.toyacc").device_count() == 3
    finally:
        del _plugins._devices["toyacc"]
        _plugins._devices.update(others)
        sys.modules.pop("kiln.toyacc", None)
        from kiln import _device_module

        _device_module._CACHE.pop("toyacc", None)


# ----------------------------------------------------------------------------------------- backends


def test_backend_flags_are_settable_like_pytorch():
    b = kiln.backends
    assert b.cudnn.enabled is torch.backends.cudnn.enabled
    assert b.cudnn.benchmark is torch.backends.cudnn.benchmark
    assert b.cudnn.deterministic is torch.backends.cudnn.deterministic
    assert b.cudnn.allow_tf32 is torch.backends.cudnn.allow_tf32
    b.cudnn.benchmark = True
    try:
        with b.cudnn.flags(enabled=False, deterministic=True):
            assert b.cudnn.enabled is False and b.cudnn.deterministic is True
        assert b.cudnn.enabled is True and b.cudnn.benchmark is True
    finally:
        b.cudnn.benchmark = False
    assert b.mps.is_available() is False and b.mps.is_built() is False
    assert b.cpu.get_cpu_capability() in ("DEFAULT", "AVX2", "AVX512")


def test_tf32_flag_is_a_view_of_matmul_precision():
    assert kiln.get_float32_matmul_precision() == torch.get_float32_matmul_precision() == "highest"
    assert kiln.backends.cuda.matmul.allow_tf32 is False
    kiln.backends.cuda.matmul.allow_tf32 = True
    try:
        assert kiln.get_float32_matmul_precision() == "high"
    finally:
        kiln.set_float32_matmul_precision("highest")
    with pytest.raises(AttributeError, match="Unknown attribute foo"):
        kiln.backends.cuda.matmul.foo = 1
    with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
        kiln.set_float32_matmul_precision("ultra")
    assert kiln.get_float32_matmul_precision() == "highest"


def test_deterministic_switches_match_pytorch():
    try:
        for lib in (torch, kiln):
            lib.use_deterministic_algorithms(True, warn_only=True)
        assert kiln.get_deterministic_debug_mode() == torch.get_deterministic_debug_mode() == 1
        for lib in (torch, kiln):
            lib.set_deterministic_debug_mode("error")
        assert kiln.are_deterministic_algorithms_enabled() is torch.are_deterministic_algorithms_enabled() is True
        assert kiln.is_deterministic_algorithms_warn_only_enabled() is False
        for bad, exc in (("x", RuntimeError), (5, RuntimeError)):
            with pytest.raises(exc) as theirs:
                torch.set_deterministic_debug_mode(bad)
            with pytest.raises(exc) as ours:
                kiln.set_deterministic_debug_mode(bad)
            assert str(ours.value) == str(theirs.value)
        with pytest.raises(TypeError, match="must be bool, not str"):
            kiln.use_deterministic_algorithms("yes")
    finally:
        torch.use_deterministic_algorithms(False)
        kiln.use_deterministic_algorithms(False)


# ----------------------------------------------------------------------------------------------- jit


def test_jit_decorators_run_eagerly():
    @kiln.jit.ignore
    def f(x):
        return x + 1

    @kiln.jit.ignore(drop=True)
    def g(x):
        return x * 2

    assert f(1) == 2 and g(2) == 4
    assert kiln.jit.unused(f) is f and kiln.jit.export(f) is f and kiln.jit.script_if_tracing(f) is f
    assert kiln.jit.is_scripting() is torch.jit.is_scripting() is False
    assert kiln.jit.is_tracing() is False
    assert kiln.jit.annotate(list[int], []) == []
    assert kiln.jit.wait(kiln.jit.fork(lambda a, b: a + b, 2, b=3)) == 5


@pytest.mark.parametrize(
    "value, typ",
    [
        ([1, 2], list[int]),
        ([1, "a"], list[int]),
        ({"a": 1}, dict[str, int]),
        ((1, 2), tuple[int, int]),
        ((1, 2, 3), tuple[int, int]),
        (None, typing.Optional[int]),  # noqa: UP045 (the spelling TorchScript code uses)
        (3, int | None),
        ("x", int | None),
    ],
)
def test_jit_isinstance_matches_pytorch(value, typ):
    assert kiln.jit.isinstance(value, typ) == torch.jit.isinstance(value, typ)


def test_jit_compiling_needs_kiln_compile():
    try:
        importlib.import_module("kiln.compile")
        pytest.skip("kiln-compile is installed")
    except ModuleNotFoundError:
        pass
    with pytest.raises(ModuleNotFoundError, match="pip install kiln-compile"):
        kiln.jit.script(lambda x: x)
    with pytest.raises(RuntimeError, match="without a contained type"):
        kiln.jit.isinstance([1], list)


# ----------------------------------------------------------------------------------------------- fft


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
@pytest.mark.parametrize("d", [1.0, 0.25])
def test_fftfreq_matches_pytorch(n, d):
    for name in ("fftfreq", "rfftfreq"):
        ours = getattr(kiln.fft, name)(n, d)
        theirs = getattr(torch.fft, name)(n, d)
        assert ours.dtype == kiln.float32
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    f64 = kiln.fft.fftfreq(n, d, dtype=kiln.float64)
    np.testing.assert_allclose(f64.numpy(), torch.fft.fftfreq(n, d, dtype=torch.float64).numpy())


@pytest.mark.parametrize("shape", [(7,), (4, 5), (3, 0), ()])
@pytest.mark.parametrize("dim", [None, 0, -1, (0,)])
def test_fftshift_matches_pytorch(shape, dim):
    if dim is not None and len(shape) == 0:
        pytest.skip("0-d tensors have no dim to shift")
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    if not shape:
        for lib in (torch, kiln):
            with pytest.raises(RuntimeError, match="`shifts` required"):
                lib.fft.fftshift(lib.tensor(x))
        return
    for name in ("fftshift", "ifftshift"):
        ours = getattr(kiln.fft, name)(kiln.tensor(x), dim=dim)
        theirs = getattr(torch.fft, name)(torch.tensor(x), dim=dim)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_fftshift_is_differentiable():
    x = kiln.randn(6, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(kiln.fft.fftshift, (x,))


def test_fftfreq_rejects_what_pytorch_rejects():
    with pytest.raises(TypeError):
        kiln.fft.fftfreq(2.5)
    with pytest.raises(RuntimeError):
        kiln.fft.fftfreq(-1)


# ------------------------------------------------------------------------------- tensor device tests


def test_tensor_device_type_tests():
    t, k = torch.ones(2), kiln.ones(2)
    for name in ("is_xpu", "is_mps", "is_ipu", "is_xla", "is_mtia", "is_maia", "is_meta", "is_vulkan"):
        assert getattr(k, name) is getattr(t, name) is False, name
    for name in ("is_mkldnn", "is_quantized", "is_nested"):
        assert getattr(k, name) is False


def test_import_kiln_does_not_import_the_new_modules():
    code = (
        "import sys, kiln; bad = [m for m in ('kiln.func', 'kiln.jit', 'kiln.backends', 'kiln.accelerator', "
        "'kiln.fft', 'kiln.cuda') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- smaller top-level names


def test_build_flags_and_interop_threads():
    assert kiln.has_lapack is True and kiln.has_mkl is False and kiln.has_spectral is False
    assert kiln.get_num_interop_threads() >= 1
    kiln.set_num_interop_threads(2)
    assert kiln.get_num_interop_threads() == 2
    kiln.set_num_interop_threads(1)
    for lib in (torch, kiln):
        with pytest.raises(RuntimeError, match="set_num_interop_threads expects a positive integer"):
            lib.set_num_interop_threads(0)
    kiln.init_num_threads()
    assert kiln.set_flush_denormal(True) is False  # not supported: says so, changes nothing
    assert kiln.is_vulkan_available() is torch.is_vulkan_available() is False


def test_default_generator_is_what_manual_seed_seeds():
    kiln.manual_seed(11)
    assert kiln.default_generator.initial_seed() == 11
    state = kiln.default_generator.get_state()
    a = kiln.rand(2).tolist()
    kiln.default_generator.set_state(state)
    assert kiln.rand(2).tolist() == a
    assert kiln.thread_safe_generator() is kiln.default_generator


def test_get_device_module():
    assert kiln.get_device_module("cuda") is kiln.cuda
    assert kiln.get_device_module(kiln.device("cpu")) is kiln.cpu
    assert kiln.get_device_module("cuda:1") is kiln.cuda
    expected = _accelerators()[0] if _accelerators() else "cpu"
    assert kiln.get_device_module() is importlib.import_module(f"kiln.{expected}")
    with pytest.raises(RuntimeError, match="does not have a corresponding module"):
        kiln.get_device_module("nosuchdevice")


def test_set_default_tensor_type_matches_torch():
    try:
        for lib in (torch, kiln):
            with pytest.warns(UserWarning, match="deprecated"):
                lib.set_default_tensor_type(lib.DoubleTensor)
        assert kiln.get_default_dtype() == kiln.float64 and kiln.ones(1).dtype == kiln.float64
        for lib in (torch, kiln):
            with warnings.catch_warnings():  # PyTorch warns once per process
                warnings.simplefilter("ignore")
                with pytest.raises(TypeError, match="only floating-point types"):
                    lib.set_default_tensor_type("torch.IntTensor")
    finally:
        torch.set_default_dtype(torch.float32)
        kiln.set_default_dtype(kiln.float32)


def test_anomaly_switches():
    assert kiln.is_anomaly_enabled() is False
    kiln.set_anomaly_enabled(True, check_nan=False)
    try:
        assert kiln.is_anomaly_enabled() and not kiln.is_anomaly_check_nan_enabled()
    finally:
        kiln.set_anomaly_enabled(False)
    assert kiln.is_complex(kiln.ones(1)) is False and kiln.is_distributed(kiln.ones(1)) is False


@pytest.mark.parametrize(
    "data, kwargs",
    [
        (b"", {}),
        (b"abcd", {"offset": 4}),
        (b"abcd", {"offset": -1}),
        (b"abcde", {}),
        (b"abcd", {"count": 2}),
        (b"abcd", {"count": 0}),
        (b"abcdef", {"count": 2, "offset": 2}),
        (b"abcdef", {"count": 3, "offset": 2}),
    ],
)
def test_frombuffer_matches_torch(data, kwargs):
    outs = {}
    for lib in (torch, kiln):
        try:
            outs[lib] = lib.frombuffer(bytearray(data), dtype=lib.int16, **kwargs).tolist()
        except ValueError as e:
            outs[lib] = str(e)
    assert outs[kiln] == outs[torch]


def test_frombuffer_shares_memory():
    buf = bytearray(8)
    t = kiln.frombuffer(buf, dtype=kiln.int32)
    t[1] = 7
    assert int.from_bytes(buf[4:], "little") == 7
    buf[0] = 3
    assert t[0].item() == 3


def test_empty_permuted_layout_matches_torch():
    for perm in ((0, 1, 2), (2, 0, 1), (1, 2, 0)):
        k = kiln.empty_permuted((2, 3, 4), perm)
        t = torch.empty_permuted((2, 3, 4), perm)
        assert tuple(k.shape) == tuple(t.shape) and k.stride() == t.stride()


def test_tensor_autograd_extras_match_torch():
    seen = []
    for lib in (torch, kiln):
        x = lib.ones(2, requires_grad=True)
        h = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
        (x * 3).sum().backward()
        h.remove()
        (x * 3).sum().backward()
        with pytest.raises(RuntimeError, match="non-leaf"):
            (x * 2).register_post_accumulate_grad_hook(lambda t: None)
        assert x.output_nr == 0 and lib.ones(2, 2).max(0)[1].output_nr == 0
        assert x.const_data_ptr() == x.data_ptr()
    assert seen == [[3.0, 3.0], [3.0, 3.0]]  # once each, before removal


def test_other_device_moves_need_their_device():
    with pytest.raises(RuntimeError, match="Device type 'xpu' is not registered"):
        kiln.ones(1).xpu()
