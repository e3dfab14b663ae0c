"""The device contract: registration, host round trips, views and writes, creation, copies between
devices, serialization (``kiln.save``/``kiln.load`` and pickle), random numbers, memory statistics,
autograd on the device, and the errors for ops and dtypes the device does not serve."""

from __future__ import annotations

import copy
import gc
import pickle
import warnings

import numpy as np
import pytest

import kiln
import kiln_testing
from kiln import plugins
from kiln.backend import op as op_record
from kiln.testing import assert_close, gradcheck
from kiln_testing._runner import FALLBACK_WARNING, ReferenceMode, _build, cpu_fallback, is_missing_error
from kiln_testing._specs import Ctx

pytestmark = pytest.mark.kiln_conformance

LAYOUTS = ("contiguous", "transposed", "strided", "expanded", "0-d", "empty")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dtype" in metafunc.fixturenames:
        dtypes = kiln_testing.plan(metafunc.config).dtypes
        metafunc.parametrize("dtype", dtypes, ids=[str(d).removeprefix("kiln.") for d in dtypes])


@pytest.fixture(scope="module")
def plan(kiln_conformance_plan):
    return kiln_conformance_plan


@pytest.fixture(scope="module")
def dev(plan):
    return plan.device


def _host_values(shape, dtype, seed=0) -> np.ndarray:
    """Values that exercise every bit of a dtype: extremes for integers, IEEE specials for floats."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype is kiln.bool:
        flat = rng.random(n) < 0.5
    elif dtype.is_floating_point:
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25], dtype=np.float64)
        flat = np.concatenate([specials, rng.uniform(-100, 100, n)])[:n]
        if n > len(specials):
            flat = rng.permutation(flat)
    else:
        info = np.iinfo(dtype.numpy)
        flat = np.concatenate([[info.min, info.max, 0, 1], rng.integers(info.min, info.max, n, dtype=np.int64)])[:n]
    return flat.astype(dtype.numpy).reshape(shape)


def _layout(t: kiln.Tensor, layout: str) -> kiln.Tensor:
    if layout == "transposed":
        return t.t()
    if layout == "strided":
        return t[::2, 1::2]
    if layout == "expanded":
        return t[:1].expand(3, t.shape[1])
    return t


def _cpu_tensor(dtype, layout, seed=0) -> kiln.Tensor:
    shape = {"0-d": (), "empty": (0, 3)}.get(layout, (4, 6))
    return _layout(kiln.tensor(_host_values(shape, dtype, seed), dtype=dtype), layout)


def _same_bits(a: kiln.Tensor, b: kiln.Tensor, what: str) -> None:
    """Equal dtype, shape and bit patterns (so -0.0 and NaN survive), a and b on the CPU."""
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (
        f"{what}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
    )
    an, bn = np.ascontiguousarray(a.detach().numpy()), np.ascontiguousarray(b.detach().numpy())
    raw = np.dtype(f"u{an.dtype.itemsize}") if an.dtype.itemsize > 1 else np.uint8
    assert np.array_equal(an.view(raw), bn.view(raw)), f"{what}: values differ\n{an}\n!=\n{bn}"


# ---------------------------------------------------------------------------------------- registration


def test_device_is_registered(plan, dev):
    assert plugins.devices()[dev.type] is plan.contract
    module = getattr(kiln, dev.type)
    assert module.is_available()
    assert module.device_count() == plan.contract.device_count() >= 1
    if plan.plugin is not None:
        assert plan.plugin.error is None, plan.plugin.error
        assert dev.type in plan.plugin.devices
    t = kiln.ones(2, device=dev.type)
    assert t.device == dev
    if dev.type != "cpu":
        assert f"device='{dev}'" in repr(t)


# ---------------------------------------------------------------------------------------- host round trips


@pytest.mark.parametrize("layout", LAYOUTS)
def test_to_round_trip(dtype, layout, dev):
    src = _cpu_tensor(dtype, layout)
    on_dev = src.to(dev)
    assert on_dev.device == dev and on_dev.dtype == dtype and on_dev.shape == src.shape
    _same_bits(on_dev.cpu(), src, f"{layout} {dtype} to {dev} and back")
    _same_bits(on_dev.to("cpu"), src, "to('cpu')")
    assert on_dev.to(dev) is on_dev
    again = on_dev.to(dev, copy=True)
    assert again is not on_dev and again.device == dev
    _same_bits(again.cpu(), src, "to(device, copy=True)")
    direct = kiln.tensor(src.numpy(), dtype=dtype, device=dev)
    assert direct.device == dev
    _same_bits(direct.cpu(), src, "kiln.tensor(..., device=)")


def test_dtype_conversions_on_device(dtype, dev, plan):
    # in-range values (out-of-range float -> integer casts are undefined, and differ by platform in PyTorch)
    rng = np.random.default_rng(2)
    values = np.round(rng.uniform(0, 100, (3, 5)), 2)
    values[0, :2] = 0
    host = kiln.tensor(values, dtype=kiln.float64).to(dtype)
    specials = kiln.tensor([np.nan, np.inf, -np.inf, -0.0, 1e-3], dtype=kiln.float64).to(dtype)
    on_dev, specials_dev = host.to(dev), specials.to(dev)
    for target in plan.dtypes:
        converted = on_dev.to(target)
        assert converted.device == dev and converted.dtype == target
        _same_bits(converted.cpu(), host.to(target), f"{dtype} -> {target} on {dev}")
        if dtype.is_floating_point and target.is_floating_point:
            _same_bits(specials_dev.to(target).cpu(), specials.to(target), f"IEEE specials {dtype} -> {target}")


def test_creation_functions(dtype, dev):
    fill = True if dtype is kiln.bool else 3 if not dtype.is_floating_point else -1.5
    makers = {
        "zeros": lambda d: kiln.zeros(2, 3, dtype=dtype, device=d),
        "ones": lambda d: kiln.ones(2, 3, dtype=dtype, device=d),
        "full": lambda d: kiln.full((2, 3), fill, dtype=dtype, device=d),
        "eye": lambda d: kiln.eye(3, 4, dtype=dtype, device=d),
        "zeros_like": lambda d: kiln.zeros_like(kiln.ones(2, dtype=dtype, device=d)),
        "ones_like": lambda d: kiln.ones_like(kiln.zeros(0, 2, dtype=dtype, device=d)),
        "full_like": lambda d: kiln.full_like(kiln.zeros((), dtype=dtype, device=d), fill),
        "tensor": lambda d: kiln.tensor([[0, 1], [1, 0]], dtype=dtype, device=d),
    }
    if dtype is not kiln.bool:
        makers["arange"] = lambda d: kiln.arange(0, 7, 2, dtype=dtype, device=d)
    if dtype.is_floating_point:
        makers["linspace"] = lambda d: kiln.linspace(-1, 1, 5, dtype=dtype, device=d)
    for name, make in makers.items():
        expected, actual = make("cpu"), make(dev)
        assert actual.device == dev, f"{name}: created on {actual.device}"
        _same_bits(actual.cpu(), expected, f"kiln.{name} on {dev}")
    empty = kiln.empty(2, 3, dtype=dtype, device=dev)
    assert empty.device == dev and empty.dtype == dtype and tuple(empty.shape) == (2, 3)


def test_device_indices(plan, dev):
    n = plan.contract.device_count()
    if n < 2:
        pytest.skip(f"device type '{dev.type}' has a single device")
    other = kiln.device(dev.type, 1)
    x = kiln.arange(6.0).to(dev)
    y = x.to(other)
    assert y.device == other and x.device == dev
    assert y.cpu().tolist() == x.cpu().tolist()
    assert y.to(dev).device == dev
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + y
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        x.to(f"{dev.type}:{n}")


# ---------------------------------------------------------------------------------------- views and writes


def test_views_share_storage(dev):
    base = kiln.arange(12.0).to(dev).view(3, 4)
    storage = base.untyped_storage()
    views = {
        "view": base.view(4, 3),
        "t": base.t(),
        "slice": base[1:, ::2],
        "select": base[2],
        "as_strided": base.as_strided((2, 2), (1, 4), 1),
        "expand": base[:1].expand(5, 4),
        "unsqueeze": base.unsqueeze(0),
    }
    for name, v in views.items():
        assert v.device == dev, name
        assert v.untyped_storage() is storage, f"{name} of a {dev} tensor copied its storage"
    s = base[1:, ::2]
    assert s.storage_offset() == 4 and s.stride() == (4, 2)
    assert base[1].data_ptr() == base.data_ptr() + 4 * base.element_size()
    expected = kiln.arange(12.0).view(3, 4)[1:, ::2]
    assert_close(s.cpu(), expected)


def test_writes_through_views(dev):
    ops = [
        lambda t: t.__setitem__(1, 5.0),
        lambda t: t.__setitem__((slice(None), 2), kiln.tensor([1.0, 2.0, 3.0])),
        lambda t: t.t()[0].copy_(kiln.tensor([7.0, 8.0, 9.0])),
        lambda t: t[1:, ::2].fill_(-1.0),
        lambda t: t[0].zero_(),
    ]
    on_dev = kiln.zeros(3, 4, device=dev)
    on_cpu = kiln.zeros(3, 4)
    version = on_dev._version
    for i, op in enumerate(ops):
        op(on_dev)
        op(on_cpu)
        assert_close(on_dev.cpu(), on_cpu, msg=lambda m, i=i: f"after write {i}: {m}")
    assert on_dev._version == version + len(ops), "every in-place write must bump the shared version counter"


def test_copy_between_devices(dtype, dev, plan):
    src_cpu = _cpu_tensor(dtype, "contiguous", seed=3)
    dst = kiln.zeros(4, 6, dtype=dtype, device=dev)
    dst.copy_(src_cpu)  # host -> device
    _same_bits(dst.cpu(), src_cpu, "copy_ from the CPU")
    back = kiln.zeros(4, 6, dtype=dtype)
    back.copy_(dst)  # device -> host
    _same_bits(back, src_cpu, "copy_ to the CPU")
    strided = kiln.zeros(6, 4, dtype=dtype, device=dev).t()
    strided.copy_(dst)  # device -> device, into a transposed view
    _same_bits(strided.cpu(), src_cpu, "copy_ into a transposed view on the device")
    row = kiln.zeros(4, 6, dtype=dtype, device=dev)
    row.copy_(dst[0])  # broadcast
    _same_bits(row.cpu(), src_cpu[0].expand(4, 6), "broadcasting copy_")
    if plan.contract.device_count() > 1:
        other = kiln.zeros(4, 6, dtype=dtype, device=kiln.device(dev.type, 1))
        other.copy_(dst)
        _same_bits(other.cpu(), src_cpu, "copy_ between device indices")


# ---------------------------------------------------------------------------------------- serialization


@pytest.mark.parametrize("layout", LAYOUTS)
def test_save_load_round_trip(dtype, layout, dev, tmp_path):
    src = _cpu_tensor(dtype, layout, seed=7)
    t = src.to(dev)
    path = tmp_path / "tensors.safetensors"
    kiln.save({"t": t, "nested": [t, {"again": t}]}, path)
    back = kiln.load(path)
    assert back["t"].device == dev and back["t"].dtype == dtype and back["t"].shape == t.shape
    _same_bits(back["t"].cpu(), src, f"kiln.save/kiln.load of a {layout} {dtype} tensor on {dev}")
    _same_bits(back["nested"][1]["again"].cpu(), src, "kiln.save/kiln.load of a nested tensor")
    on_cpu = kiln.load(path, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu"
    _same_bits(on_cpu["t"], src, "kiln.load(map_location='cpu')")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pickle_round_trip(dtype, layout, dev):
    src = _cpu_tensor(dtype, layout, seed=5)
    t = src.to(dev)
    back = pickle.loads(pickle.dumps(t))
    assert back.device == dev and back.dtype == dtype and back.shape == t.shape
    _same_bits(back.cpu(), src, f"pickle of a {layout} {dtype} tensor on {dev}")
    dup = copy.deepcopy(t)
    assert dup.device == dev
    _same_bits(dup.cpu(), src, "deepcopy")


def test_pickle_keeps_requires_grad_and_refuses_graphs(plan, dev):
    d = _float_dtype(plan)
    leaf = kiln.ones(3, dtype=d, device=dev, requires_grad=True)
    back = pickle.loads(pickle.dumps(leaf))
    assert back.requires_grad and back.is_leaf and back.device == dev
    with pytest.raises(RuntimeError, match=r"grad_fn|autograd graph"):
        pickle.dumps(leaf[1:])


# ---------------------------------------------------------------------------------------- random numbers


def test_rng_reproducible(plan, dev):
    d = _float_dtype(plan)

    def draw():
        return [
            kiln.rand(5, dtype=d, device=dev),
            kiln.randn(2, 3, dtype=d, device=dev),
            kiln.randint(0, 100, (7,), device=dev) if kiln.int64 in plan.dtypes else kiln.rand(1, device=dev),
        ]

    kiln.manual_seed(1234)
    first = draw()
    kiln.manual_seed(1234)
    second = draw()
    for a, b in zip(first, second):
        assert a.device == dev
        _same_bits(a.cpu(), b.cpu(), "the same seed must give the same numbers")
    kiln.manual_seed(4321)
    assert not np.array_equal(kiln.rand(5, dtype=d, device=dev).cpu().numpy(), first[0].cpu().numpy())

    g = kiln.Generator(device=dev)
    g.manual_seed(7)
    a = kiln.rand(4, generator=g, dtype=d, device=dev)
    state = g.get_state()
    b = kiln.rand(4, generator=g, dtype=d, device=dev)
    g.set_state(state)
    _same_bits(kiln.rand(4, generator=g, dtype=d, device=dev).cpu(), b.cpu(), "Generator.set_state replays")
    g.manual_seed(7)
    _same_bits(kiln.rand(4, generator=g, dtype=d, device=dev).cpu(), a.cpu(), "Generator.manual_seed restarts")


def test_device_module_manual_seed(dev):
    module = getattr(kiln, dev.type)
    module.manual_seed(99)
    x = kiln.rand(3, device=dev)
    module.manual_seed(99)
    _same_bits(kiln.rand(3, device=dev).cpu(), x.cpu(), f"kiln.{dev.type}.manual_seed")


# ---------------------------------------------------------------------------------------- memory


def test_memory_statistics(plan, dev):
    module = getattr(kiln, dev.type)
    module.synchronize()
    if not module.memory_stats():
        pytest.skip(f"device type '{dev.type}' reports no memory statistics (memory_stats returns {{}})")
    gc.collect()
    before = module.memory_allocated()
    nbytes = 1 << 20
    dtype = plan.dtypes[-1]  # any declared dtype
    t = kiln.empty(nbytes // dtype.itemsize, dtype=dtype, device=dev)
    during = module.memory_allocated()
    assert during - before >= nbytes, f"allocating {nbytes} bytes raised memory_allocated by {during - before}"
    assert module.max_memory_allocated() >= during
    del t
    gc.collect()
    module.synchronize()
    after = module.memory_allocated()
    assert during - after >= nbytes, f"freeing {nbytes} bytes lowered memory_allocated by {during - after}"
    assert module.max_memory_allocated() >= during, "the peak must not drop when memory is freed"


# ---------------------------------------------------------------------------------------- autograd


def _float_dtype(plan):
    for d in (kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16):
        if d in plan.dtypes:
            return d
    pytest.skip("the device declares no floating point dtype")


def test_autograd_on_device(plan, dev):
    d = _float_dtype(plan)
    x = kiln.tensor([1.0, -2.0, 3.0, 0.5], dtype=d, device=dev, requires_grad=True)
    try:
        y = (x * x).sum()
        y.backward(retain_graph=True)
        assert x.grad.device == dev and x.grad.dtype == d
        assert_close(x.grad.cpu(), kiln.tensor([2.0, -4.0, 6.0, 1.0], dtype=d))
        y.backward()  # gradients accumulate into the leaf, on the device
        assert_close(x.grad.cpu(), kiln.tensor([4.0, -8.0, 12.0, 2.0], dtype=d))
        x.grad = None
        x[1:].sum().backward()  # through a view
        assert_close(x.grad.cpu(), kiln.tensor([0.0, 1.0, 1.0, 1.0], dtype=d))
    except NotImplementedError as exc:
        pytest.fail(f"autograd on {dev} needs an op the device lacks: {exc}", pytrace=False)
    z = x.detach()
    assert z.device == dev and not z.requires_grad
    assert z.untyped_storage() is x.untyped_storage()


def test_gradcheck_on_device(plan, dev):
    if kiln.float64 not in plan.dtypes:
        pytest.skip("the device does not declare float64, which finite differences need")
    a = kiln.tensor([[0.3, -1.2], [0.7, 2.0]], dtype=kiln.float64, device=dev, requires_grad=True)
    b = kiln.tensor([1.5, -0.5], dtype=kiln.float64, device=dev, requires_grad=True)
    try:
        assert gradcheck(lambda a, b: (a * b).tanh() + a, (a, b))
    except NotImplementedError as exc:
        pytest.fail(f"gradcheck on {dev} needs an op the device lacks: {exc}", pytrace=False)


# ---------------------------------------------------------------------------------------- errors


def _value_case(plan, op_name: str, dtype):
    """The first case of an op that the reference computes, for ``dtype`` (or None)."""
    spec = plan.ops[op_name].spec
    if spec is None:
        return None
    cpu = kiln.device("cpu")
    for case in spec.cases(Ctx(op_name, dtype, plan.dtypes)):
        if any(t.dtype not in plan.dtypes for t in case.tensors()):
            continue
        args, kwargs, _ = _build(case, cpu)
        try:
            with ReferenceMode():
                expected = op_record(op_name).public(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an error case: try the next
            continue
        return case, expected
    return None


def test_missing_ops_raise(plan, dev):
    missing = plan.missing_ops()
    if not missing:
        pytest.skip(f"'{dev.type}' serves every op")
    who = plan.contract.plugin
    problems = []
    with cpu_fallback(False):
        for op_name in missing:
            found = _value_case(plan, op_name, _float_dtype(plan))
            if found is None:
                continue
            case, _ = found
            args, kwargs, _ = _build(case, dev)
            try:
                op_record(op_name).public(*args, **kwargs)
            except NotImplementedError as exc:
                msg = str(exc)
                for part in (f"'{op_name}'", dev.type, f"'{who}'", "KILN_CPU_FALLBACK=1"):
                    if part not in msg:
                        problems.append(f"{op_name}: the error does not mention {part}: {msg}")
            except Exception as exc:  # noqa: BLE001 - the wrong exception type is the finding
                problems.append(f"{op_name}: raised {type(exc).__name__} ({exc}), expected NotImplementedError")
            else:
                problems.append(f"{op_name}: ran although '{dev.type}' has no kernel for it and the fallback is off")
    assert not problems, "\n".join(problems)


def test_cpu_fallback_serves_missing_ops(plan, dev):
    missing = plan.missing_ops()
    if not missing:
        pytest.skip(f"'{dev.type}' serves every op")
    problems = []
    with cpu_fallback(True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", FALLBACK_WARNING, UserWarning)
        for op_name in missing:
            found = _value_case(plan, op_name, _float_dtype(plan))
            if found is None:
                continue
            case, expected = found
            args, kwargs, _ = _build(case, dev)
            before = plugins.fallback_counts().get((op_name, dev.type), 0)
            try:
                out = op_record(op_name).public(*args, **kwargs)
                for o in out if isinstance(out, tuple) else (out,):
                    assert o.device == dev, f"result on {o.device}"
                assert_close(
                    [o.cpu() for o in out] if isinstance(out, tuple) else out.cpu(),
                    list(expected) if isinstance(expected, tuple) else expected,
                    equal_nan=True,
                )
                assert plugins.fallback_counts().get((op_name, dev.type), 0) > before, "not counted"
            except Exception as exc:  # noqa: BLE001 - every op's problem is reported at once
                problems.append(f"{op_name} [{case.label}]: {type(exc).__name__}: {exc}")
    assert not problems, "\n".join(problems)


def test_unsupported_dtype_errors(plan, dev):
    checked = 0
    problems = []
    who = plan.contract.plugin
    # ops with a kernel registered for some dtypes only: the others must raise the dispatcher's error
    with cpu_fallback(False):
        for op in plan.ops.values():
            if op.source in (None, "generic") or op.spec is None:
                continue
            for d in plan.dtypes:
                found = _value_case(plan, op.name, d)
                if found is None:
                    continue
                case, _ = found
                args, kwargs, _ = _build(case, dev)
                try:
                    op_record(op.name).public(*args, **kwargs)
                except NotImplementedError as exc:
                    if not is_missing_error(exc, op_record(op.name)):
                        continue  # a kernel's own error: the op tests judge it
                    checked += 1
                    msg = str(exc)
                    for part in (dev.type, "dtype kiln.", f"'{who}'", "KILN_CPU_FALLBACK=1"):
                        if part not in msg:
                            problems.append(f"{op.name} {d}: the error does not mention {part!r}: {msg}")
                except Exception:  # noqa: BLE001 - served (or rejected by the meta): the op tests judge it
                    continue
    # dtypes the device does not declare at all: creating such a tensor must fail, naming both
    for d in kiln_testing._all_dtypes():
        if d in plan.contract.dtypes:  # declared (--kiln-dtypes may check fewer)
            continue
        short = str(d).removeprefix("kiln.")
        for what, make in (
            ("zeros", lambda d=d: kiln.zeros(2, dtype=d, device=dev)),
            ("to", lambda d=d: kiln.zeros(2, dtype=d).to(dev)),
        ):
            checked += 1
            try:
                make()
            except (TypeError, RuntimeError, NotImplementedError) as exc:
                if short not in str(exc) or dev.type not in str(exc):
                    problems.append(f"{what} in undeclared {d}: the error does not name {short} and {dev.type}: {exc}")
            else:
                problems.append(f"{what}: created a {d} tensor on '{dev.type}', which does not declare {d}")
    if not checked:
        pytest.skip(f"'{dev.type}' declares every dtype and its kernels serve each of them")
    assert not problems, "\n".join(problems)


def test_mixed_device_error(dev):
    if dev.type == "cpu":
        pytest.skip("mixing needs a second device type")
    a = kiln.ones(3, device=dev)
    b = kiln.ones(3)
    with pytest.raises(RuntimeError) as info:
        a + b
    assert str(info.value) == (
        f"Expected all tensors to be on the same device, but found at least two devices, {dev} and cpu!"
    )
