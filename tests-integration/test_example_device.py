"""The out-of-tree example device plugin (tests-integration/example_device), installed from wheels.

architecture page, "Plugins": third-party devices are first-class. The plugin's wheel and kiln's are installed in a fresh
venv; kiln lists the plugin with its version and ops, tensors on "example" compute and backpropagate, a
second device plugin works beside it, a broken one is reported and harms nothing, uninstalling or
disabling it leaves kiln working, and the conformance suite (kiln-testing, from its wheel) passes on it.
"""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PROJECT = REPO / "tests-integration" / "example_device"
TESTING_PROJECT = REPO / "packages" / "kiln-testing"
EXAMPLE_DIST = "kiln-example-device"

SECOND_SOURCE = '''
"""A second device plugin (integration tests): device "second", memory in array.array blocks, a mul kernel."""
import array

import numpy as np

import kiln


class Block:
    def __init__(self, raw, np_dtype):
        self.raw = array.array("B", raw)
        self.np_dtype = np.dtype(np_dtype)

    def __len__(self):
        return len(self.raw) // self.np_dtype.itemsize

    def view(self):
        return np.frombuffer(self.raw, dtype=self.np_dtype)


def _elements(t):
    if t.device.type != "second":
        return t.numpy()
    mem = t.untyped_storage().view()
    isz = mem.itemsize
    return np.lib.stride_tricks.as_strided(
        mem[t.storage_offset():], tuple(t.shape), tuple(s * isz for s in t.stride())
    )


def _write(block, start, a):
    block.view()[start:start + a.size] = a


def kiln_register_devices(register):
    """Device "second"."""
    register(
        "second",
        empty=lambda n, dtype, index=None: Block(bytes(n * dtype.itemsize), dtype.numpy),
        to_host=lambda b: b.view().copy(),
        from_host=lambda a, index=None: Block(np.ascontiguousarray(a).tobytes(), a.dtype),
        write=_write,
    )


def kiln_register_kernels(register):
    """Only mul."""

    def mul(spec, input, other):
        out = kiln.empty(spec[0], dtype=spec[1], device=spec[2])
        c = np.dtype(spec[1].numpy)
        b = _elements(other).astype(c) if isinstance(other, kiln.Tensor) else np.array(other).astype(c)[()]
        _elements(out)[...] = _elements(input).astype(c) * b
        return out

    register("mul", "second", mul)
'''

BROKEN_DEVICE_SOURCE = '''
"""A device plugin whose device hook fails (integration tests)."""


def kiln_register_devices(register):
    """Fails the way a missing driver would."""
    raise RuntimeError("kiln_brokendev_plugin: the brokendev driver is not loaded")
'''

COMPUTE_AND_BACKPROP = """
import json, warnings
import kiln
warnings.simplefilter("error")  # registered kernels only: no CPU fallback may be needed here
x = kiln.tensor([[1.0, -2.0], [3.0, 0.5]], device="example", requires_grad=True)
w = kiln.tensor([[0.5], [-1.0]], device="example", requires_grad=True)
loss = ((x @ w).tanh() + x.relu().sum(dim=1, keepdim=True)).sum()
loss.backward()
print(json.dumps({
    "device": str(x.grad.device),
    "storage": type(x.untyped_storage()).__module__,
    "loss": loss.item(),
    "x_grad": x.grad.cpu().tolist(),
    "w_grad": w.grad.cpu().tolist(),
    "on_cpu": ((x.detach().cpu() @ w.detach().cpu()).tanh() + x.detach().cpu().relu().sum(dim=1, keepdim=True)).sum().item(),
}))
"""


@pytest.fixture(scope="module")
def example_wheel(dists):
    """kiln-example-device's wheel, built with the running interpreter's hatchling."""
    return _build_wheel(dists, EXAMPLE_DIST, EXAMPLE_PROJECT)


@pytest.fixture(scope="module")
def with_example(venv, example_wheel):
    """The example plugin installed (from its wheel) for this module."""
    with venv.installed(example_wheel, EXAMPLE_DIST):
        yield venv


def _build_wheel(dists, name: str, project: Path) -> Path:
    # the DistFactory builds any project directory; here a real one, not a generated one
    dist = types.SimpleNamespace(name=name, project=project, wheel=None)
    t0 = time.perf_counter()
    built = dists.wheel(dist)
    print(f"\n[integration] built {built.wheel.name} in {time.perf_counter() - t0:.2f}s")
    return built.wheel


def test_kiln_plugins_lists_it_with_version_and_ops(with_example, helpers):
    report = with_example.plugins_json()
    row = helpers.row(report, "example")
    assert row["status"] == "loaded" and row["error"] is None
    assert row["distribution"] == EXAMPLE_DIST and row["version"] == "0.1.0"
    assert row["module"] == "kiln_example_device.plugin"
    assert row["devices"] == ["example"]
    assert row["hooks"] == ["kiln_register_devices", "kiln_register_kernels"]
    registered = with_example.py_json(
        "import json; from kiln_example_device.kernels import KERNELS; print(json.dumps(sorted(KERNELS)))"
    )
    assert sorted(row["kernels"]["example"]) == registered
    assert sorted(row["op_coverage"]["example"]) == registered
    assert "example" in report["devices"]
    text = with_example.kiln("plugins").stdout
    assert "example  [loaded]  kiln-example-device 0.1.0" in text
    assert f"example: {len(registered)}/" in text


def test_tensors_compute_and_backpropagate_on_example(with_example):
    r = with_example.py_json(COMPUTE_AND_BACKPROP)
    assert r["device"] == "example:0"
    assert r["storage"] == "kiln_example_device.memory"  # the plugin's own storage type
    assert r["loss"] == pytest.approx(r["on_cpu"], rel=1e-6)
    # d/dx and d/dw of sum(tanh(x @ w)) + sum(relu(x)), computed by hand
    h = [1 * 0.5 + -2.0 * -1.0, 3 * 0.5 + 0.5 * -1.0]
    d = [1 - math.tanh(v) ** 2 for v in h]
    expected_x = [[d[0] * 0.5 + 1.0, d[0] * -1.0 + 0.0], [d[1] * 0.5 + 1.0, d[1] * -1.0 + 1.0]]
    expected_w = [[d[0] * 1.0 + d[1] * 3.0], [d[0] * -2.0 + d[1] * 0.5]]
    for got, want in ((r["x_grad"], expected_x), (r["w_grad"], expected_w)):
        for got_row, want_row in zip(got, want):
            assert got_row == pytest.approx(want_row, rel=1e-5)


def test_every_op_runs_without_the_fallback(with_example):
    """The device implements exactly kiln's primitive set: ``pow`` (a primitive) runs its registered kernel,
    ``silu`` (decomposed) runs as other ops on the device, and the opt-in CPU fallback never runs."""
    code = """
        import json, warnings
        import kiln
        import kiln.backend as kb
        from kiln import plugins
        from kiln_example_device.kernels import KERNELS
        warnings.simplefilter("error")
        x = kiln.tensor([1.0, 2.0, 3.0], device="example")
        y = x ** 2
        z = kb.op("silu").public(x)
        print(json.dumps({
            "pow": [str(y.device), y.cpu().tolist()],
            "silu_device": str(z.device),
            "fallbacks": len(plugins.fallback_counts()),
            "primitives": sorted(KERNELS) == kb.primitives(),
        }))
    """
    r = with_example.py_json(code)
    assert r["pow"] == ["example:0", [1.0, 4.0, 9.0]]
    assert r["silu_device"] == "example:0"
    assert r["fallbacks"] == 0 and r["primitives"]


def test_two_device_plugins_work_together(with_example, dists, helpers):
    second = dists.plugin("kiln-second-device", "kiln_second_device", SECOND_SOURCE, ep="second", version="2.0.0")
    with with_example.installed(second.wheel, second.name):
        report = with_example.plugins_json()
        assert helpers.row(report, "example")["devices"] == ["example"]
        assert helpers.row(report, "second")["devices"] == ["second"]
        assert helpers.row(report, "second")["kernels"] == {"second": ["mul"]}
        r = with_example.py_json(
            """
            import json
            import kiln
            a = kiln.tensor([1.0, 2.0, 3.0], device="example")
            b = kiln.tensor([4.0, 5.0, 6.0], device="second")
            moved = (a + 1).cpu().to("second")           # example -> host -> second
            try:
                a * b
                mixed = None
            except RuntimeError as e:
                mixed = str(e)
            print(json.dumps({
                "example": (a + a).cpu().tolist(),
                "second": (b * b).cpu().tolist(),
                "moved": (moved * b).cpu().tolist(),
                "devices": [str(moved.device), str((moved * b).device)],
                "mixed": mixed,
                "counts": [kiln.example.device_count(), kiln.second.device_count()],
            }))
            """
        )
    assert r["example"] == [2.0, 4.0, 6.0]
    assert r["second"] == [16.0, 25.0, 36.0]
    assert r["moved"] == [8.0, 15.0, 24.0] and r["devices"] == ["second:0", "second:0"]
    assert r["mixed"].startswith("Expected all tensors to be on the same device") and "example:0" in r["mixed"]
    assert r["counts"] == [2, 1]


def test_a_broken_plugin_is_reported_not_fatal(with_example, dists, broken_plugin, helpers):
    brokendev = dists.plugin("kiln-brokendev-plugin", "kiln_brokendev_plugin", BROKEN_DEVICE_SOURCE, ep="brokendev")
    with (
        with_example.installed(broken_plugin.wheel, broken_plugin.name),
        with_example.installed(brokendev.wheel, brokendev.name),
    ):
        report = with_example.plugins_json()
        assert helpers.row(report, "broken")["status"] == "error"  # fails at import
        row = helpers.row(report, "brokendev")
        assert row["status"] == "error" and "brokendev driver is not loaded" in row["error"]
        assert row["devices"] == []
        assert helpers.row(report, "example")["status"] == "loaded"
        r = with_example.py_json(COMPUTE_AND_BACKPROP)
        assert r["device"] == "example:0"
        proc = with_example.py(
            """
            import kiln
            try:
                kiln.zeros(1, device="brokendev")
            except RuntimeError as e:
                print(e)
            """
        )
        assert "'brokendev' is not registered" in proc.stdout and "failed to load" in proc.stdout
        assert "brokendev" in proc.stdout.split("failed to load")[1]
        doctor = with_example.kiln("doctor", check=False)
        assert doctor.returncode == 1 and "brokendev" in doctor.stdout


def test_disable_plugins_hides_it(with_example, helpers):
    env = {"KILN_DISABLE_PLUGINS": "example"}
    row = helpers.row(with_example.plugins_json(env=env), "example")
    assert row["status"] == "disabled" and row["devices"] == [] and row["kernels"] == {}
    proc = with_example.py(
        """
        import sys, kiln
        print((kiln.ones(2) + 1).tolist())
        try:
            kiln.zeros(1, device="example")
        except RuntimeError as e:
            print(e)
        print(hasattr(kiln, "example"), "kiln_example_device" in sys.modules)
        """,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "[2.0, 2.0]"
    assert "Device type 'example' is not registered" in lines[1]
    assert "Disabled by KILN_PLUGINS/KILN_DISABLE_PLUGINS: example" in lines[1]
    assert lines[2] == "False False"  # never imported


def test_conformance_suite_passes_from_wheels(with_example, dists, tmp_path):
    """kiln-testing's wheel and its pytest plugin, run against the installed example device."""
    testing_wheel = _build_wheel(dists, "kiln-testing", TESTING_PROJECT)
    venv = with_example
    venv.pip("install", "-q", "pytest>=8", "hypothesis>=6.100")
    with venv.installed(testing_wheel, "kiln-testing"):
        out = tmp_path / "coverage.json"
        proc = venv.run(
            [
                venv.python,
                "-m",
                "pytest",
                "--kiln-device=example",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--kiln-coverage-json={out}",
            ],
            check=False,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert (
            "kiln conformance coverage: device 'example' from plugin 'example' (kiln-example-device 0.1.0)"
            in proc.stdout
        )
        cov = json.loads(out.read_text())
        forward = cov["tables"]["forward"]
        registered = venv.py_json(
            "import json; from kiln_example_device.kernels import KERNELS; print(json.dumps(sorted(KERNELS)))"
        )
        for op in registered:  # every op it registers passes in every dtype its kernel serves
            cells = set(forward[op]["cells"].values())
            assert forward[op]["source"] == "example" and "pass" in cells and cells <= {"pass", "n/a"}, op
        # every other op runs through its decomposition on the device, without the CPU fallback
        assert forward["silu"]["source"] == "decomposed" and "pass" in set(forward["silu"]["cells"].values())
        assert "missing" not in {c for row in forward.values() for c in row["cells"].values()}
        assert "float16" not in cov["dtypes"]  # the device does not declare half precision


def test_uninstalling_leaves_kiln_working(with_example, example_wheel, helpers):
    venv = with_example
    venv.uninstall(EXAMPLE_DIST)
    try:
        assert venv.py("import kiln; print((kiln.ones(2) * 3).tolist())").stdout.strip() == "[3.0, 3.0]"
        report = venv.plugins_json()
        assert "example" not in {r["name"] for r in report["plugins"]}
        assert "example" not in report["devices"]
        proc = venv.py(
            """
            import kiln
            try:
                kiln.zeros(1, device="example")
            except RuntimeError as e:
                print(e)
            """
        )
        assert "Device type 'example' is not registered by any installed kiln plugin" in proc.stdout
        assert venv.kiln("doctor").returncode == 0
        assert venv.py("import importlib.util as u; print(u.find_spec('kiln_example_device'))").stdout.strip() == "None"
    finally:
        venv.install(example_wheel)  # leave the module fixture's state as it was
