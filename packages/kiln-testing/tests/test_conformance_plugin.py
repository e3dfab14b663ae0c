"""``pytest --kiln-device=NAME`` end to end, in subprocesses: a sound device passes and gets its coverage
table; deliberately broken devices fail exactly where they are broken; the plugin loads with ``-p``;
bad options are usage errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

CONFTEST = """
import kiln.plugins
import toydev_plugin

kiln.plugins.register_plugin(toydev_plugin.Plugin(bugs={bugs!r}), name="toy")
"""


def run_pytest(tmp_path, toy_source, *args, bugs=(), env=None, files=None):
    """Run pytest in ``tmp_path`` with the toy device registered (and ``bugs`` switched on)."""
    (tmp_path / "toydev_plugin.py").write_text(toy_source)
    (tmp_path / "conftest.py").write_text(CONFTEST.format(bugs=tuple(bugs)))
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "PYTEST_"))}
    full_env.update({"PYTHONPATH": str(tmp_path), "KILN_CPU_FALLBACK": "1", **(env or {})})
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--import-mode=importlib", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=600)


def table_row(output: str, table: str, op: str) -> list[str]:
    """The cells of ``op``'s row in the ``table`` ("forward"/"backward") section of the output."""
    section = output.split(f"\n{table} (op x dtype)")[1]
    for line in section.splitlines()[2:]:
        parts = line.split()
        if parts and parts[0] == op:
            return parts[1:]
        if not parts:
            break
    raise AssertionError(f"no row for {op} in the {table} table:\n{section}")


DECOY = "def test_decoy():\n    raise AssertionError('collected although no test path was given')\n"


@pytest.fixture(scope="module")
def sound_run(tmp_path_factory, toy_source):
    tmp = tmp_path_factory.mktemp("sound")
    args = ("--kiln-device=toydev", f"--kiln-coverage-json={tmp / 'cov.json'}")
    return run_pytest(tmp, toy_source, *args, files={"test_decoy.py": DECOY}), tmp


def test_sound_device_passes_with_a_coverage_table(sound_run):
    proc, tmp = sound_run
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    assert "kiln conformance coverage: device 'toydev' from plugin 'toy' (registered at run time)" in out
    assert table_row(out, "forward", "add") == ["toy"] + ["pass"] * 10
    assert table_row(out, "forward", "div") == ["-"] + ["missing"] * 10  # served only by the fallback
    # no kernel, but a decomposition into ops the device runs (add with -alpha): it runs on the device
    assert table_row(out, "forward", "sub") == ["decomposed", "n/a"] + ["pass"] * 9
    assert table_row(out, "forward", "view") == ["generic"] + ["pass"] * 10
    assert table_row(out, "forward", "relu") == ["toy", "n/a"] + ["pass"] * 9  # bool relu: the reference refuses
    assert table_row(out, "backward", "relu") == ["toy"] + ["pass"] * 4
    assert "ops without a kernel on 'toydev'" in out
    cov = json.loads((tmp / "cov.json").read_text())
    assert cov["device"] == "toydev" and cov["plugin"] == "toy"
    assert cov["tables"]["forward"]["add"] == {"source": "toy", "cells": dict.fromkeys(cov["dtypes"], "pass")}


def test_only_the_suite_runs_without_paths(sound_run):
    proc, _ = sound_run
    assert proc.returncode == 0 and "test_decoy" not in proc.stdout  # test_decoy.py in the cwd was not collected
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\d{3} passed", summary) and not re.search(r"\d+ (failed|errors?)\b", summary), summary


def test_wrong_kernel_fails_exactly_its_cells(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, "--kiln-device=toydev", bugs={"add-int32"})
    out = proc.stdout
    assert proc.returncode == 1
    failed = sorted(line.split("::")[-1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED"))
    # exactly the add cell in int32 (the backward table has floating dtypes only), and the int32 cells of the
    # ops that run on the device through decompositions into add
    decomposed = ["addcmul", "addmm", "baddbmm", "bitwise_not", "gcd", "lcm", "sub"]
    assert failed == sorted(f"test_forward[{op}-int32]" for op in ["add", *decomposed]), failed
    assert table_row(out, "forward", "add")[5] == "FAIL"  # kernel, bool, uint8, int8, int16, int32
    assert table_row(out, "forward", "add")[6] == "pass"
    assert "add (forward, kiln.int32):" in out and "[same-shape" in out and "Mismatched elements" in out


def test_wrong_host_copy_fails_round_trips(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, "--kiln-device=toydev", "-k", "round_trip or pickle", bugs={"to_host"})
    assert proc.returncode == 1
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert any("test_to_round_trip[" in line for line in failed)
    assert any("test_pickle_round_trip[" in line for line in failed)
    assert "values differ" in proc.stdout


def test_wrong_gradient_kernel_fails_backward(tmp_path, toy_source):
    proc = run_pytest(
        tmp_path, toy_source, "--kiln-device=toydev", "-k", "relu or threshold", bugs={"threshold_backward"}
    )
    assert proc.returncode == 1
    failed = {line.split("::")[-1].split(" ")[0] for line in proc.stdout.splitlines() if line.startswith("FAILED")}
    assert "test_backward[relu-float32]" in failed
    assert "test_forward[_threshold_backward-float32]" in failed
    assert "test_forward[relu-float32]" not in failed
    assert "grad of input 0" in proc.stdout


def test_user_tests_run_beside_the_suite_with_the_device_fixture(tmp_path, toy_source):
    user_test = """
        def test_mine(kiln_device, kiln_device_dtypes):
            assert str(kiln_device) == "toydev:0"
            assert len(kiln_device_dtypes) == 10
    """
    args = ("--kiln-device=toydev", "test_mine.py", "-k", "mine or add", "-rA")
    proc = run_pytest(tmp_path, toy_source, *args, files={"test_mine.py": user_test})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "PASSED test_mine.py::test_mine" in proc.stdout
    assert "test_ops.py::test_forward[add-float32]" in proc.stdout  # and the suite ran too
    assert "kiln conformance coverage" in proc.stdout


def test_explicit_plugin_option_without_autoload(tmp_path, toy_source):
    proc = run_pytest(
        tmp_path,
        toy_source,
        "-p",
        "kiln_testing",
        "--kiln-device=toydev",
        "-k",
        "add",
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "kiln conformance coverage" in proc.stdout


def test_unknown_device_is_a_usage_error(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, "--kiln-device=nodev")
    assert proc.returncode == 4  # pytest's usage-error exit code
    assert "--kiln-device=nodev" in proc.stderr and "Device type 'nodev' is not registered" in proc.stderr
    assert "toydev" in proc.stderr  # the registered device types are listed


def test_kiln_dtypes_narrows_the_run(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, "--kiln-device=toydev", "--kiln-dtypes=float32,int64", "-k", "add")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    header = proc.stdout.split("\nforward (op x dtype)")[1].splitlines()[1].split()
    assert header[-2:] == ["int64", "float32"] and "float64" not in header  # only the chosen dtypes
    assert len(table_row(proc.stdout, "forward", "add")) == 3  # its kernel, then one cell per dtype


def test_kiln_dtypes_unknown_name_is_a_usage_error(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, "--kiln-device=toydev", "--kiln-dtypes=float32,complex64")
    assert proc.returncode == 4
    assert "--kiln-dtypes=float32,complex64: complex64 is not among the device's dtypes" in proc.stderr


def test_idle_without_the_option(tmp_path, toy_source):
    proc = run_pytest(tmp_path, toy_source, files={"test_plain.py": "def test_plain():\n    pass\n"})
    assert proc.returncode == 0
    assert "1 passed" in proc.stdout and "kiln conformance" not in proc.stdout


CHECKS_USER_TEST = """
    import os

    from kiln import _dispatch


    def test_checks_always(kiln_device):
        assert _dispatch.kernel_outputs_checked_always()
        assert os.environ["KILN_CHECK_KERNELS"] == "1"
"""


def test_the_suite_checks_every_kernel_output_naming_the_plugin(tmp_path, toy_source):
    # add is right except where its result is 0-d: past the first call, which the dispatcher checks
    # anyway; the suite has it check every call, so the failure names the kernel's plugin
    args = ("--kiln-device=toydev", "test_checks.py", "-k", "checks_always or (test_forward and add)")
    proc = run_pytest(tmp_path, toy_source, *args, bugs={"add-0d-shape"}, files={"test_checks.py": CHECKS_USER_TEST})
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    failed = {line.split("::")[-1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED")}
    assert "test_checks_always" not in failed
    assert "test_forward[add-float32]" in failed
    assert (
        "raised RuntimeError: the kernel for op 'add' on device type 'toydev' (kiln.float32) from plugin 'toy' "
        "(registered at run time) returned a result that does not match the op's meta function: "
        "shape (1,), expected ()"
    ) in out


def test_kernel_outputs_are_checked_once_without_the_option(tmp_path, toy_source):
    user_test = CHECKS_USER_TEST.replace("assert _dispatch", "assert not _dispatch").replace(
        'os.environ["KILN_CHECK_KERNELS"] == "1"', '"KILN_CHECK_KERNELS" not in os.environ'
    )
    proc = run_pytest(tmp_path, toy_source, "test_checks.py", files={"test_checks.py": user_test})
    assert proc.returncode == 0, proc.stdout[-3000:]
