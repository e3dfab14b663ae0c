"""The dispatcher checks kernels' outputs against their op's spec (shape, dtype, device, type).

Kernels come from plugins registered at run time; a wrong result must raise ``RuntimeError`` on the
first call, naming the op, the device type and the plugin, instead of reaching the caller. A correct
kernel is checked once per (op, device type, output dtype), or on every call when checking is
switched to "always" (the conformance kit does that; ``KILN_CHECK_KERNELS=1``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _dispatch, _plugins
from kiln._dispatch import OPS


class KernelPlugin:
    """A plugin object registering one kernel (``kernel(spec, *args)``) for ``op`` on ``device_type``."""

    def __init__(self, op: str, kernel, device_type: str = "cpu", dtypes=None):
        self.op, self.kernel, self.device_type, self.dtypes = op, kernel, device_type, dtypes

    def kiln_register_kernels(self, register):
        register(self.op, self.device_type, self.kernel, dtypes=self.dtypes)


@pytest.fixture(autouse=True)
def check_once():
    """Each test starts from the default, checking once (the suite may run under KILN_CHECK_KERNELS=1)."""
    before = _dispatch.kernel_outputs_checked_always()
    _dispatch.check_kernel_outputs(False)
    yield
    _dispatch.check_kernel_outputs(before)


@pytest.fixture
def plugin():
    """``plugin(name, op, kernel, ...)`` registers a kernel plugin for the test; all are removed after it."""
    names = []

    def register(name, op, kernel, device_type="cpu", dtypes=None):
        _plugins.register_plugin(KernelPlugin(op, kernel, device_type, dtypes), name=name)
        names.append(name)

    yield register
    for name in reversed(names):
        _plugins.unregister_plugin(name)


@pytest.fixture
def check_spy(monkeypatch):
    """The output checks the dispatcher runs for ``neg``, as (op, device type, dtype)."""
    calls = []
    real = _dispatch._check_output

    def spy(opdef, spec, out, dev_type, dtype):
        if opdef.name == "neg":  # (creating the operands runs ops too)
            calls.append((opdef.name, dev_type, dtype))
        return real(opdef, spec, out, dev_type, dtype)

    monkeypatch.setattr(_dispatch, "_check_output", spy)
    return calls


@pytest.fixture
def always_check(check_once):
    """Checking on every call for one test (``check_once`` restores the setting after it)."""
    _dispatch.check_kernel_outputs(True)


def ref_neg(spec, a):
    """A correct neg kernel on the CPU."""
    return kiln.from_numpy(np.negative(a.numpy()).astype(spec[1].numpy))


# ---------------------------------------------------------------------------------------- wrong outputs

WRONG = {
    "shape": lambda spec, a: kiln.from_numpy(np.zeros((1,), np.float32)),
    "dtype": lambda spec, a: kiln.from_numpy(-a.numpy().astype(np.float64)),
    "numpy": lambda spec, a: np.negative(a.numpy()),
    "none": lambda spec, a: None,
    "list": lambda spec, a: [-x for x in a.tolist()],
}
EXPECTED = {
    "shape": r"shape \(1,\), expected \(3,\)",
    "dtype": r"dtype kiln\.float64, expected kiln\.float32",
    "numpy": r"returned a numpy\.ndarray, expected a kiln\.Tensor of shape \(3,\), dtype kiln\.float32 on cpu",
    "none": r"returned None, expected a kiln\.Tensor",
    "list": r"returned a list of 3, expected a kiln\.Tensor",
}


@pytest.mark.parametrize("bug", sorted(WRONG))
def test_a_wrong_result_raises_on_the_first_call_naming_op_device_and_plugin(plugin, bug):
    plugin(f"bad-neg-{bug}", "neg", WRONG[bug])
    with pytest.raises(RuntimeError) as info:
        -kiln.ones(3)
    msg = str(info.value)
    assert "op 'neg'" in msg and "device type 'cpu'" in msg and "(kiln.float32)" in msg
    assert f"plugin 'bad-neg-{bug}' (registered at run time)" in msg
    assert re.search(EXPECTED[bug], msg), msg
    # not remembered as checked: the next call fails the same way
    with pytest.raises(RuntimeError, match=f"bad-neg-{bug}"):
        kiln.neg(kiln.ones(3))


class NumpyDevice:
    """Device type ``chkdev`` (NumPy storage) whose ``neg`` kernel leaves its result on the CPU."""

    def kiln_register_devices(self, register):
        def write(storage, start, array):
            storage[start : start + array.size] = array

        register(
            "chkdev",
            empty=lambda n, dtype, index=None: np.zeros(n, dtype.numpy),
            to_host=lambda s: s,
            from_host=lambda a, index=None: np.array(a, copy=True),
            write=write,
        )

    def kiln_register_kernels(self, register):
        register("neg", "chkdev", lambda spec, a: kiln.from_numpy(-a.cpu().numpy()))


@pytest.fixture
def chkdev():
    _plugins.register_plugin(NumpyDevice(), name="numpy-device")
    yield "chkdev"
    _plugins.unregister_plugin("numpy-device")


def test_a_result_on_the_wrong_device_is_caught(chkdev):
    x = kiln.ones(3, device=chkdev)
    with pytest.raises(RuntimeError) as info:
        -x
    msg = str(info.value)
    assert "device type 'chkdev'" in msg and "plugin 'numpy-device'" in msg
    assert "device cpu, expected chkdev:0" in msg
    # the core's device-generic kernels (views, copies) pass on the same device
    assert x.view(3, 1).shape == (3, 1) and x.t().device.type == "chkdev"


def test_several_problems_are_listed_together(plugin):
    plugin("bad-neg-all", "neg", lambda spec, a: kiln.zeros(2, 2, dtype=kiln.int64))
    with pytest.raises(
        RuntimeError, match=r"shape \(2, 2\), expected \(3,\); dtype kiln\.int64, expected kiln\.float32"
    ):
        -kiln.ones(3)


def test_a_multi_output_op_must_return_a_tuple_of_tensors(plugin):
    x = kiln.tensor([[1.0, 3.0], [2.0, 0.0]])
    plugin("bad-max-single", "_max_dim", lambda spec, a, dim, keepdim=False: kiln.zeros(2))
    with pytest.raises(RuntimeError, match=r"returned a single kiln\.Tensor, expected a tuple of 2 tensors"):
        x.max(dim=1)
    plugin(  # registered later: takes precedence
        "bad-max-indices",
        "_max_dim",
        lambda spec, a, dim, keepdim=False: (kiln.tensor([3.0, 2.0]), kiln.tensor([1.0, 0.0])),
    )
    with pytest.raises(RuntimeError) as info:
        x.max(dim=1)
    msg = str(info.value)
    assert "output 1: dtype kiln.float32, expected kiln.int64" in msg and "plugin 'bad-max-indices'" in msg
    assert "output 0" not in msg


def test_a_dtype_narrowed_kernel_is_named_for_its_dtype_only(plugin):
    plugin("bad-neg-f32", "neg", WRONG["shape"], dtypes=(kiln.float32,))
    assert (-kiln.ones(3, dtype=kiln.float64)).tolist() == [-1.0, -1.0, -1.0]  # served by an earlier plugin
    with pytest.raises(RuntimeError, match=r"\(kiln\.float32\) from plugin 'bad-neg-f32'"):
        -kiln.ones(3)


def test_a_new_kernel_is_checked_again(plugin):
    plugin("good-neg", "neg", ref_neg)
    assert (-kiln.ones(3)).tolist() == [-1.0] * 3  # (cpu, float32) checked and remembered
    plugin("bad-neg-later", "neg", WRONG["none"])  # the kernel table changes: checked anew
    with pytest.raises(RuntimeError, match="bad-neg-later"):
        -kiln.ones(3)


def test_a_table_change_during_a_first_call_is_not_hidden_by_it(plugin):
    """As when another thread registers a plugin while a kernel runs for the first time."""
    later = []

    def registering(spec, a):
        plugin("later-neg", "neg", lambda spec, a: later.append(1) or ref_neg(spec, a))
        return ref_neg(spec, a)

    plugin("registering-neg", "neg", registering)
    -kiln.ones(3)  # checked, but no longer in the table: not remembered
    -kiln.ones(3)
    assert later == [1]


def test_the_reference_backend_is_described_with_its_distribution():
    neg = OPS["neg"]
    _plugins.refresh_kernels()
    -kiln.ones(1, dtype=kiln.float64)
    owner = _plugins.kernel_owner("neg", "cpu", kiln.float64)
    source = _plugins.describe_kernel_source(neg, "cpu", kiln.float64)
    assert source.startswith(f"plugin '{owner}' (")
    if owner == _plugins.REFERENCE_PLUGIN:
        assert source == f"plugin 'kiln.reference' (distribution kiln {kiln.__version__})"


def test_a_device_generic_kernel_is_described_with_the_device_plugin(chkdev):
    kiln.ones(2, device=chkdev).view(2, 1)
    source = _plugins.describe_kernel_source(OPS["view"], chkdev)
    assert (
        source
        == "kiln's device-generic kernel on the device contract of plugin 'numpy-device' (registered at run time)"
    )


# ---------------------------------------------------------------------------------------- cost: once per key


def test_a_correct_kernel_is_checked_once_per_device_type_and_dtype(plugin, check_spy):
    plugin("good-neg", "neg", ref_neg)
    for _ in range(5):
        assert (-kiln.ones(3)).tolist() == [-1.0] * 3
    assert check_spy == [("neg", "cpu", kiln.float32)]
    for _ in range(3):
        -kiln.ones(2, dtype=kiln.float64)
    assert check_spy == [("neg", "cpu", kiln.float32), ("neg", "cpu", kiln.float64)]
    checked = OPS["neg"]._checked
    assert checked[kiln.float32]["cpu"] is checked[kiln.float64]["cpu"] is OPS["neg"].kernels["cpu"]


def test_always_checking_checks_every_call(plugin, check_spy, always_check):
    plugin("good-neg", "neg", ref_neg)
    for _ in range(4):
        -kiln.ones(3)
    assert check_spy.count(("neg", "cpu", kiln.float32)) == 4
    assert not OPS["neg"]._checked


def test_always_checking_catches_a_kernel_wrong_after_its_first_call(plugin, always_check):
    calls = []

    def flaky(spec, a):
        calls.append(1)
        return ref_neg(spec, a) if len(calls) == 1 else WRONG["shape"](spec, a)

    plugin("flaky-neg", "neg", flaky)
    -kiln.ones(3)
    with pytest.raises(RuntimeError, match="flaky-neg"):
        -kiln.ones(3)


def test_switching_always_on_forgets_what_was_checked(plugin, check_spy):
    plugin("good-neg", "neg", ref_neg)
    -kiln.ones(3)
    -kiln.ones(3)
    assert len(check_spy) == 1
    _dispatch.check_kernel_outputs(True)
    -kiln.ones(3)
    -kiln.ones(3)
    _dispatch.check_kernel_outputs(False)
    assert len(check_spy) == 3
    -kiln.ones(3)  # back to once: checked one more time, then remembered
    -kiln.ones(3)
    assert len(check_spy) == 4


def test_the_environment_variable_switches_always_on_at_import():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    code = "from kiln import _dispatch; print(_dispatch.kernel_outputs_checked_always())"
    for value, expected in (("1", "True"), ("0", "False"), (None, "False")):
        run_env = dict(env) if value is None else {**env, "KILN_CHECK_KERNELS": value}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == expected, (value, out.stdout, out.stderr)


def test_kiln_doctor_mentions_always_checking():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    out = subprocess.run(
        [sys.executable, "-m", "kiln", "doctor"],
        env={**env, "KILN_CHECK_KERNELS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "KILN_CHECK_KERNELS=1: every kernel call's result is checked" in out.stdout, out.stdout + out.stderr


def test_an_empty_view_past_its_storage_copies_to_the_host(chkdev):
    """An empty view's offset may point past its storage's end (``zeros(0, 4)[:, 2:]``): copying it to
    the host (the CPU fallback, ``.cpu()``) reads nothing and must not ask NumPy for a view out of range."""
    x = kiln.zeros(0, 4, device=chkdev)[:, 2:]
    assert x.storage_offset() == 2
    assert tuple(x.cpu().shape) == (0, 2) and x.cpu().device.type == "cpu"
