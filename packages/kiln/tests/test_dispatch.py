"""The op registry and dispatcher: defining an op, kernel lookup, dispatch modes, plugin switches."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import _plugins
from kiln._dispatch import OPS, DispatchMode, op
from kiln.autograd import gradcheck, gradgradcheck
from kiln.backend import Spec


def _cube_meta(input, scale=1.0):
    if not isinstance(input, kiln.Tensor):
        raise TypeError("cube(): argument 'input' must be Tensor")
    return Spec.make(input.shape, input.dtype, input.device)


@op(
    meta=_cube_meta,
    reference=lambda spec, a, scale=1.0: (a.astype(spec.dtype.numpy) ** 3) * scale,
    backward=lambda grad, input, scale: grad * 3 * input * input * scale,
    autocast="fp32",
    methods=("cube",),
    tags=("pointwise",),
)
def cube_op(input: kiln.Tensor, scale: float = 1.0) -> kiln.Tensor:
    """``scale * input ** 3`` (an op defined by a test, after kiln loaded its plugins)."""


def test_an_op_is_one_definition():
    x = kiln.tensor([1.0, -2.0, 0.5], dtype=kiln.float64, requires_grad=True)
    y = cube_op(x, 2.0)
    assert y.tolist() == [2.0, -16.0, 0.25]
    assert x.cube().tolist() == [1.0, -8.0, 0.125]
    assert y.grad_fn.name() == "CubeOpBackward0"
    y.sum().backward()
    assert x.grad.tolist() == [6.0, 24.0, 1.5]
    assert gradcheck(lambda t: cube_op(t, 0.5), (x,))
    assert gradgradcheck(lambda t: cube_op(t, 0.5), (x,))
    assert OPS["cube_op"].autocast == "fp32"
    assert _plugins.kernel_owner("cube_op", "cpu") == _plugins.REFERENCE_PLUGIN
    with pytest.raises(TypeError, match="argument 'input' must be Tensor"):
        cube_op([1.0])


def test_kernel_lookup_is_a_plain_dict_after_first_use():
    a = kiln.ones(2)
    _ = a + a
    assert isinstance(OPS["add"].kernels, dict)
    assert "cpu" in OPS["add"].kernels


class CountingMode(DispatchMode):
    level = "post_autograd"

    def __init__(self):
        self.seen = []

    def dispatch(self, op, args, redispatch):
        self.seen.append(op.name)
        return redispatch(op, args)


class DoubleAddMode(DispatchMode):
    """A pre-autograd mode that rewrites ``add`` calls (as autocast rewrites dtypes)."""

    level = "pre_autograd"

    def dispatch(self, op, args, redispatch):
        if op.name == "add":
            return redispatch(op, (args[0], args[1] * 2, *args[2:]))
        return redispatch(op, args)


def test_post_autograd_mode_sees_forward_and_backward_ops():
    x = kiln.ones(3, requires_grad=True)
    with CountingMode() as mode:
        y = (x * 2).sum()
        y.backward()
    assert mode.seen[:2] == ["mul", "sum"]
    assert "expand" in mode.seen  # sum's backward ran under the mode
    z = x * 2  # mode gone: nothing recorded
    assert len(mode.seen) == mode.seen.__len__() and z.shape == (3,)


def test_views_outside_every_mode_skip_the_dispatcher_and_inside_one_do_not(monkeypatch):
    """``view``/``reshape``/``view_as``/``expand``/``expand_as`` run their op's meta and kernel directly when
    no dispatch mode is active and nothing needs recording (no input that requires grad, or grad mode off);
    a mode (a tracer, a profiler) or an input that requires grad with grad mode on sends them through the
    dispatcher, which the mode sees and autograd records."""
    from kiln import _dispatch

    calls = []
    real = _dispatch.call_kernel

    def spy(opdef, args, spec=None):
        calls.append(opdef.name)
        return real(opdef, args, spec)

    monkeypatch.setattr(_dispatch, "call_kernel", spy)
    x = kiln.arange(8.0)
    v = x.view(2, 4)
    r = x.reshape(4, 2)
    a = x.view_as(v)
    assert calls == [] and v._base is x and r._base is x and a.shape == (2, 4)
    v[0, 0] = 5.0  # a view: the same storage and version counter
    assert x[0].item() == 5.0 and x._version == v._version == 1
    with CountingMode() as mode:
        x.view(4, 2)
    assert mode.seen == ["view"]
    w = kiln.ones(4, requires_grad=True)
    calls.clear()
    assert w.view(2, 2).grad_fn.name() == "ViewBackward0"  # recorded: the op's public function ran
    with pytest.raises(RuntimeError, match="shape '\\[3, 3\\]' is invalid for input of size 8"):
        x.view(3, 3)  # the op's own errors
    one = kiln.ones(1)
    calls.clear()
    e = one.expand(2, 3)
    assert calls == [] and e.stride() == (0, 0) and one.expand_as(e).shape == (2, 3) and calls == []
    with kiln.no_grad():  # grad mode off: nothing to record, even for an input that requires grad
        nv = w.view(4)
        ne = w.view(1, 4).expand(3, 4)
    assert calls == [] and nv.grad_fn is None and not ne.requires_grad and ne.shape == (3, 4)
    assert nv._nograd_view  # still marked as a no_grad view of a base that requires grad
    assert w.expand(2, 4).grad_fn.name() == "ExpandBackward0"
    with CountingMode() as mode, kiln.no_grad():
        one.expand(5)
        x.view(8)
    assert mode.seen == ["expand", "view"]
    with pytest.raises(RuntimeError, match="must match the existing size"):
        x.expand(3, 4)


def test_a_plugin_kernel_for_a_view_op_is_not_skipped(monkeypatch):
    """The view methods skip the dispatcher only for the core's device-generic kernel: a kernel a plugin
    registered for the device type (here put in the table by hand) still runs."""
    from kiln._ops.views import _view_kernel, expand, view

    seen = []

    def plugin_kernel(spec, input, *args):
        seen.append(spec.shape)
        return _view_kernel(spec, input, *args)

    x = kiln.arange(8.0)
    for opdef in (view.op, expand.op):
        monkeypatch.setitem(opdef.kernels, "cpu", plugin_kernel)
        monkeypatch.setattr(opdef, "_checked", {})
    assert x.view(2, 4).shape == (2, 4) and x[:1].expand(3, 2).shape == (3, 2)
    assert seen == [(2, 4), (3, 2)]


def test_pre_autograd_mode_rewrites_and_autograd_sees_rewrite():
    x = kiln.tensor([1.0, 2.0], requires_grad=True)
    with DoubleAddMode():
        y = x + x
    assert y.tolist() == [3.0, 6.0]
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_modes_nest_and_exit_in_order():
    outer, inner = CountingMode(), CountingMode()
    with outer, inner:
        kiln.ones(2) + 1
    assert "add" in inner.seen and "add" in outer.seen
    m = CountingMode()
    m.__enter__()
    other = CountingMode()
    other.__enter__()
    with pytest.raises(RuntimeError, match="out of order"):
        m.__exit__(None, None, None)
    other.__exit__(None, None, None)
    m.__exit__(None, None, None)


def test_dtype_narrowed_kernels_and_precedence():
    calls = []

    class Fast:
        def kiln_register_kernels(self, register):
            def neg32(spec, a):
                calls.append(a.dtype)
                return kiln.from_numpy(np.negative(a.numpy()))

            register("neg", "cpu", neg32, dtypes=(kiln.float32,))

    # whoever served float64 before (the reference backend, or an installed CPU backend) still does
    owner64 = _plugins.kernel_owner("neg", "cpu", kiln.float64)
    owner = _plugins.kernel_owner("neg", "cpu")
    _plugins.register_plugin(Fast(), name="fast-neg")
    try:
        assert (-kiln.ones(2)).tolist() == [-1.0, -1.0]
        assert (-kiln.ones(2, dtype=kiln.float64)).tolist() == [-1.0, -1.0]  # the earlier owner serves float64
        assert calls == [kiln.float32]
        assert _plugins.kernel_owner("neg", "cpu", kiln.float32) == "fast-neg"
        assert _plugins.kernel_owner("neg", "cpu", kiln.float64) == owner64
    finally:
        _plugins.unregister_plugin("fast-neg")
    assert _plugins.kernel_owner("neg", "cpu") == owner


def test_inplace_kernels_of_a_plugin_serve_its_op_and_may_decline():
    """``register(op, device, kernel, inplace=True)``: the in-place variant (``mul_``) calls the in-place
    kernel of the plugin whose kernel runs the op; one that returns None leaves the call to that kernel
    and a copy, and so does a call that autograd records."""
    calls = []

    class InPlace:
        def kiln_register_kernels(self, register):
            def mul(spec, a, b):
                calls.append(("mul", tuple(a.shape)))
                return kiln.from_numpy(
                    np.multiply(a.detach().numpy(), b if not isinstance(b, kiln.Tensor) else b.numpy())
                )

            def mul_(spec, a, b):
                calls.append(("mul_", tuple(a.shape)))
                if a.numel() < 4:
                    return None  # declined: nothing written
                np.multiply(a.numpy(), b if not isinstance(b, kiln.Tensor) else b.numpy(), out=a.numpy())
                return a

            register("mul", "cpu", mul, dtypes=(kiln.float64,))
            register("mul", "cpu", mul_, dtypes=(kiln.float64,), inplace=True)

    _plugins.register_plugin(InPlace(), name="inplace-mul")
    try:
        big, small = kiln.ones(2, 3, dtype=kiln.float64), kiln.ones(3, dtype=kiln.float64)
        big.mul_(3.0)
        small.mul_(kiln.full((3,), 2.0, dtype=kiln.float64))
        kiln.ones(2, 3).mul_(2.0)  # float32: not the plugin's
        assert calls == [("mul_", (2, 3)), ("mul_", (3,)), ("mul", (3,))]
        assert big.tolist() == [[3.0] * 3] * 2 and small.tolist() == [2.0] * 3
        assert big._version == 1 and small._version == 1
        calls.clear()
        x = kiln.ones(2, 3, dtype=kiln.float64, requires_grad=True) * 1
        x.mul_(2.0)  # autograd records: the out-of-place kernel and a copy
        assert ("mul_", (2, 3)) not in calls and x.grad_fn is not None
    finally:
        _plugins.unregister_plugin("inplace-mul")
    calls.clear()
    kiln.ones(2, 3, dtype=kiln.float64).mul_(2.0)
    assert calls == []


def test_a_plugin_overriding_an_op_serves_its_inplace_variant_too():
    """A plugin's ``add`` kernel, registered without an in-place one, runs ``add_`` as well (then a copy):
    the in-place kernels of the plugins it took precedence over stand aside, for the dtypes it serves."""

    class Override:
        def kiln_register_kernels(self, register):
            register("add", "cpu", lambda spec, a, b, alpha=1: kiln.from_numpy(a.numpy() + alpha * b + 100))
            register("exp", "cpu", lambda spec, a: kiln.full(a.shape, 7.0), dtypes=(kiln.float32,))

    _plugins.register_plugin(Override(), name="override-add")
    try:
        x = kiln.ones(3000)
        assert x.add_(1)[0].item() == 102.0
        assert kiln.ones(3000).exp_()[0].item() == 7.0
        assert kiln.ones(3000, dtype=kiln.float64).exp_()[0].item() == pytest.approx(np.e)  # not its dtype
    finally:
        _plugins.unregister_plugin("override-add")
    assert kiln.ones(3000).add_(1)[0].item() == 2.0


def test_an_inplace_kernel_needs_an_op_with_an_inplace_variant():
    class Wrong:
        def kiln_register_kernels(self, register):
            register("matmul", "cpu", lambda spec, a, b: None, inplace=True)

    info = _plugins.register_plugin(Wrong(), name="wrong-inplace")
    try:
        assert "ValueError: op 'matmul' has no in-place variant" in info.error  # the plugin loads whole or not at all
        assert not OPS["matmul"].inplace_kernels
    finally:
        _plugins.unregister_plugin("wrong-inplace")


def test_thread_controls_come_from_backends():
    calls = []

    class Pool:
        def kiln_register_threading(self, register):
            register("pool", set_num_threads=calls.append, get_num_threads=lambda: calls[-1] if calls else 7)

    before = kiln.get_num_threads()
    kiln.set_num_threads(3)
    _plugins.register_plugin(Pool(), name="pool-plugin")
    try:
        assert calls == [3]  # registered after set_num_threads: it starts with the requested count
        kiln.set_num_threads(2)
        assert calls == [3, 2]
        assert kiln.get_num_threads() in (2, before)  # the first registered control answers
        assert "pool" in _plugins.threading_controls()
    finally:
        _plugins.unregister_plugin("pool-plugin")
        kiln.set_num_threads(before)
    assert "pool" not in _plugins.threading_controls()


@pytest.mark.parametrize(
    "bad, message", [(0, "positive integer"), (-2, "positive integer"), (1.5, "an int, but got float")]
)
def test_set_num_threads_rejects_bad_counts_as_torch_does(bad, message):
    import torch

    for lib in (torch, kiln):
        with pytest.raises(RuntimeError, match=message):
            lib.set_num_threads(bad)


def test_a_plugin_whose_hook_raises_is_recorded_and_harmless():
    class Broken:
        def kiln_register_kernels(self, register):
            register("neg", "cpu", lambda spec, a: None)
            raise ValueError("boom in hook")

    info = _plugins.register_plugin(Broken(), name="broken-hook")
    try:
        assert "boom in hook" in info.error
        assert (-kiln.ones(1)).tolist() == [-1.0]  # its half-done registration was discarded
    finally:
        _plugins.unregister_plugin("broken-hook")


def test_import_kiln_loads_no_plugin_and_compiles_nothing():
    import subprocess
    import sys

    code = (
        "import sys, kiln; from kiln import _plugins; "
        "print(_plugins._loaded, 'pluggy' in sys.modules, 'numba' in sys.modules, 'ml_dtypes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.split() == ["False", "False", "False", "False"]


def test_a_meta_function_must_return_a_typed_spec(monkeypatch):
    """Kernels read spec fields by name: a meta function returning a plain tuple is a core bug, named
    before any kernel runs."""
    neg = OPS["neg"]
    monkeypatch.setattr(neg, "meta", lambda input: (input._shape, input._dtype, input._device))
    monkeypatch.setattr(neg, "_checked", {})  # the first call (per dtype and device) is the checked one
    with pytest.raises(TypeError, match=r"meta function of op 'neg' returned .* not a kiln\.backend\.Spec"):
        kiln.neg(kiln.ones(2))


def test_every_op_record_carries_its_facts():
    """Tags are what code generators, autocast and the conformance kit select ops by (``op()`` refuses an op
    without one), and the facts derived from them hold (views need only metadata, fused ops have a decomposition,
    in-place variants write into their first argument, a tensor, and never belong to a view or reduction op,
    whose result has another shape or aliases its input)."""
    from kiln.backend import TAGS, ops

    for name, opdef in ops().items():
        assert opdef.tags <= TAGS.keys(), name
        if "view" in opdef.tags:
            assert opdef.device_generic, name
        if "fused" in opdef.tags:
            assert opdef.decompose is not None, name
        if opdef.inplace:
            first = next(iter(opdef.signature.parameters.values()))
            assert "Tensor" in str(first.annotation), name  # pow's is "Tensor | Number": Tensor.pow_ takes a tensor
            assert not opdef.tags & {"view", "reduction", "creation"}, name


def test_an_op_without_tags_is_refused():
    with pytest.raises(ValueError, match="give it at least one tag"):

        @op(meta=lambda input: None)
        def _untagged(input: kiln.Tensor) -> kiln.Tensor:
            """An op with no tags (refused)."""

    assert "_untagged" not in OPS


def test_mark_written_counts_a_write_made_behind_the_dispatcher():
    """A kernel that stored into an existing tensor through host_view counts the write with mark_written:
    autograd then refuses a backward that saved the old values, as it does after copy_."""
    import kiln.backend as kb

    w = kiln.ones(3, requires_grad=True)
    buf = kiln.full((3,), 2.0)
    y = (w * buf).sum()  # saves buf for w's gradient
    kb.host_view(buf)[:] = 5.0
    version = buf._version
    assert kb.mark_written(buf) is buf and buf._version == version + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    with pytest.raises(TypeError, match="mark_written"):
        kb.mark_written(buf.numpy())


def test_the_public_function_runs_calls_path_itself_and_leaves_the_rest_to_call(monkeypatch):
    """On a thread with no dispatch mode an op's public function runs the meta function, the checked kernel
    and autograd's recording itself (in grad mode, ``no_grad`` and ``inference_mode``); a kernel's first,
    checked call goes through ``call_kernel``, and a mode or a sparse argument through ``call``. Both give
    the same results, errors and autograd history."""
    from kiln import _dispatch

    through_call = []  # call_kernel runs for call's path and a first call; not on the public function's own
    real = _dispatch.call_kernel

    def spy(opdef, args, spec=None):
        through_call.append(opdef.name)
        return real(opdef, args, spec)

    x = kiln.tensor([1.0, -2.0, 0.5], dtype=kiln.float64, requires_grad=True)
    cube_op(x.detach())  # the kernel's first, checked call
    monkeypatch.setattr(_dispatch, "call_kernel", spy)
    y = cube_op(x, 2.0)
    assert through_call == []
    assert y.grad_fn.name() == "CubeOpBackward0" and y.tolist() == [2.0, -16.0, 0.25]
    y.sum().backward()
    assert x.grad.tolist() == [6.0, 24.0, 1.5]

    class Sub(kiln.Tensor):
        pass

    p = kiln.Tensor._make_subclass(Sub, kiln.ones(2), True)  # a subclass that requires grad is recorded too
    assert type(p) is Sub and cube_op(p).grad_fn.name() == "CubeOpBackward0"
    with pytest.raises(TypeError, match="argument 'input' must be Tensor"):
        cube_op([1.0])
    through_call.clear()  # (the backward's ops and the float32 call above were first calls)
    with kiln.no_grad():
        z = cube_op(x)
    with kiln.inference_mode():
        i = cube_op(x)
    assert z.grad_fn is None and not z.requires_grad and not z.is_inference()
    assert i.grad_fn is None and not i.requires_grad and i.is_inference()
    assert through_call == []  # grad mode off: the public function's own path too, recording nothing
    with CountingMode() as mode:
        cube_op(x.detach())
    assert mode.seen == ["cube_op"]
    OPS["cube_op"]._checked.clear()  # as when the kernel table changes: the next call is checked again
    through_call.clear()
    assert cube_op(x.detach()).tolist() == [1.0, -8.0, 0.125] and through_call == ["cube_op"]
    through_call.clear()
    cube_op(x.detach())
    assert through_call == []  # checked again: the public function's own path from here on
    s = kiln.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
    assert (s * 2).to_dense().tolist() == [[0.0, 4.0], [6.0, 0.0]]  # a sparse argument: call's sparse path


def test_a_kernel_the_public_function_calls_raises_memory_errors_as_pytorch_does(monkeypatch):
    """A kernel's MemoryError is PyTorch's RuntimeError on both paths (the public function's own, and call's)."""

    def failing(spec, a, scale=1.0):
        raise MemoryError

    x = kiln.ones(3, dtype=kiln.float64)
    cube_op(x)
    opdef = OPS["cube_op"]
    monkeypatch.setitem(opdef._checked.setdefault(kiln.float64, {}), "cpu", failing)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        cube_op(x)
    with CountingMode(), pytest.raises(RuntimeError, match="can't allocate memory"):
        monkeypatch.setitem(opdef.kernels, "cpu", failing)
        opdef._checked.clear()
        cube_op(x)


def test_a_reference_kernel_with_a_fast_path_tests_the_size_itself():
    """``reference_kernel(name, fast=..., min_numel=...)``: ``fast`` for outputs of at least ``min_numel()``
    elements (the reference when it returns None), the reference below; ``fast`` alone: tried on every call."""
    from kiln.backend import reference_kernel

    seen = []

    def fast(spec, a, b, *rest):
        seen.append(spec.shape)
        return None if spec.shape == (5,) else kiln.full(spec.shape, 7.0)

    floor = [4]
    kernel = reference_kernel("add", fast=fast, min_numel=lambda: floor[0])
    add = kiln.backend.op("add")
    for n, want in ((3, 2.0), (4, 7.0), (5, 2.0)):
        a = kiln.ones(n)
        assert kernel(add.meta(a, a, 1), a, a, 1).tolist() == [want] * n
    assert seen == [(4,), (5,)]
    floor[0] = 0  # read on every call
    e = kiln.ones(0)
    assert kernel(add.meta(e, e, 1), e, e, 1).shape == (0,) and seen[-1] == (0,)
    always = reference_kernel("neg", fast=lambda spec, a: None)
    assert always(kiln.backend.op("neg").meta(kiln.ones(2)), kiln.ones(2)).tolist() == [-1.0, -1.0]
    with pytest.raises(TypeError, match="give fast too"):
        reference_kernel("add", min_numel=lambda: 1)
    view = kiln.backend.op("view")
    generic = reference_kernel("view", fast=lambda spec, a, shape: None)  # a device-generic op's too
    assert generic(view.meta(kiln.ones(4), (2, 2)), kiln.ones(4), (2, 2)).shape == (2, 2)


def test_a_same_dtype_binary_op_calls_its_ufunc_as_the_reference_computes_it():
    """``add``, ``sub`` and ``mul`` on two arrays of the result's compute dtype (add's alpha 1) run their ufunc
    in the reference kernel without the reference's frame: the same values, dtype and silence as the
    reference's general path, which every other case (alpha, half types, mixed dtypes, scalars) still takes."""
    import warnings

    from kiln.backend import reference_kernel

    rng = np.random.default_rng(0)
    cases = []
    for dtype in (kiln.float32, kiln.float64, kiln.int32, kiln.int64, kiln.bool, kiln.float16, kiln.bfloat16):
        a = kiln.from_numpy(rng.standard_normal(6) * 9).to(dtype)
        b = kiln.from_numpy(rng.standard_normal(6) * 9).to(dtype)
        cases += [(dtype, a, b)]
    cases.append((kiln.float64, kiln.ones(6, dtype=kiln.float32), kiln.ones(6, dtype=kiln.float64)))
    big = kiln.full((3,), 3e38)
    cases.append((kiln.float32, big, big))  # overflows to inf, as NumPy would warn of
    for name, rests in (("add", ((1,), (2,), (1.0,))), ("sub", ((1,), (3,))), ("mul", ((),))):
        opdef = kiln.backend.op(name)
        kernel = reference_kernel(name)
        for dtype, a, b in cases:
            for rest in rests:
                if dtype is kiln.bool and (name == "sub" or rest not in ((), (1,))):
                    continue
                spec = opdef.meta(a, b, *rest)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    got = kernel(spec, a, b, *rest)
                with np.errstate(all="ignore"):
                    want = opdef.reference(spec, a._numpy(), b._numpy(), *rest)
                assert got.dtype is spec.dtype and got.shape == spec.shape, (name, dtype, rest)
                np.testing.assert_array_equal(got._numpy(), np.asarray(want).astype(got._numpy().dtype))
    inf = kiln.backend.op("add").meta(big, big, 1)
    assert reference_kernel("add")(inf, big, big, 1).isinf().all()
    assert (kiln.full((2,), 2**31 - 1, dtype=kiln.int32) + 1).tolist() == [-(2**31)] * 2  # wraps, as PyTorch


def test_a_contiguous_array_of_the_dtype_is_wrapped_as_it_is():
    """``from_array`` keeps a C-contiguous array of the tensor's NumPy dtype as its cached view (a 1-D one as
    the storage itself) and copies or casts anything else."""
    from kiln.backend import from_array

    a = np.arange(4, dtype=np.float32)
    t = from_array(a, kiln.float32)
    assert t._numpy() is a and t._storage is a and t.stride() == (1,)
    a[0] = 9
    assert t.tolist() == [9.0, 1.0, 2.0, 3.0]
    m = np.arange(6, dtype=np.float64).reshape(2, 3)
    u = from_array(m, kiln.float64)
    assert u._numpy() is m and np.shares_memory(u._storage, m) and u.stride() == (3, 1) and u.shape == (2, 3)
    cast = from_array(m, kiln.float32)
    assert cast.dtype is kiln.float32 and cast.tolist() == m.tolist() and cast._numpy().base is not m
    tr = from_array(m.T, kiln.float64)
    assert tr.stride() == (1, 3) and tr.tolist() == m.T.tolist()
    assert from_array(np.float32(2.5), kiln.float32).shape == ()
    assert from_array(np.zeros((0, 3), np.float32), kiln.float32).shape == (0, 3)


def test_the_public_function_reads_the_op_record_on_each_call(monkeypatch):
    """A meta function put in the record after the op was defined is the one that runs (as ``call`` reads
    it), and an op parameter may not take the generated function's own names."""
    x = kiln.ones(2, dtype=kiln.float64)
    cube_op(x)

    def refusing(input, scale=1.0):
        raise TypeError("refused by the new meta")

    monkeypatch.setattr(OPS["cube_op"], "meta", refusing)
    with pytest.raises(TypeError, match="refused by the new meta"):
        cube_op(x)
    with pytest.raises(ValueError, match="taken by the generated public function"):

        @op(meta=_cube_meta, reference=lambda spec, a, _lane_k=1.0: a, tags=("pointwise",))
        def clashing_op(input: kiln.Tensor, _lane_k: float = 1.0) -> kiln.Tensor:
            """An op whose parameter name the public function uses."""

    assert "clashing_op" not in OPS


def test_a_post_autograd_mode_is_told_when_a_generator_is_reset():
    class Watch(DispatchMode):
        def __init__(self):
            self.reset = []

        def generator_reset(self, generator):
            self.reset.append(generator)

    g = kiln.Generator()
    state = g.get_state()
    with Watch() as w:
        kiln.manual_seed(3)
        g.manual_seed(4)
        g.set_state(state)
        kiln.set_rng_state(kiln.get_rng_state())
        kiln.rand(2)  # a draw is no reset
    cpu = kiln.random.default_generator("cpu")
    assert w.reset[0] is cpu and w.reset.count(g) == 2 and w.reset[-1] is cpu
    told = len(w.reset)
    g.manual_seed(5)  # no mode active: nobody told
    assert len(w.reset) == told
