"""Out-of-tree plugins: a working one (extension + kernel override) and ones whose hooks raise.

architecture page, "Plugins": third-party plugins are ordinary distributions with an entry point in group ``kiln``; their
kernels for ``"cpu"`` take precedence over the reference backend, which is loaded last. A plugin whose
hook raises is recorded with the error and what it registered is discarded; the rest keeps working.
"""

from __future__ import annotations

import pytest

NEG_PROBE = """
import json, sys
import kiln
from kiln import _plugins
x = kiln.tensor([1.0, -2.0, 3.0])
out = {
    "neg": kiln.neg(x).tolist(),
    "operator": (-x).tolist(),
    "method": x.neg().tolist(),
    "add": (x + 1).tolist(),
    "owner": _plugins.kernel_owner("neg", "cpu"),
    "calls": getattr(sys.modules.get("kiln_dummy_plugin"), "NEG_CALLS", None),
    "extensions": sorted(_plugins.extensions()),
}
print(json.dumps(out))
"""
REFERENCE_NEG = [-1.0, 2.0, -3.0]
DUMMY_NEG = [42.0, 42.0, 42.0]


@pytest.fixture(scope="module")
def with_dummy(venv, dummy_plugin):
    with venv.installed(dummy_plugin.wheel, dummy_plugin.name):
        yield venv


def test_kernel_override_takes_precedence(with_dummy):
    r = with_dummy.py_json(NEG_PROBE)
    assert r["neg"] == DUMMY_NEG
    assert r["operator"] == DUMMY_NEG
    assert r["method"] == DUMMY_NEG
    assert r["calls"] == 3
    assert r["owner"] == "dummy"
    assert r["add"] == [2.0, -1.0, 4.0]  # ops the plugin does not register still use the reference
    assert r["extensions"] == ["kiln", "kiln-dummy"]


def test_override_works_under_autograd(with_dummy):
    # The kernel is swapped, the autograd formula stays the core's: grad_x = neg(grad_y), itself written
    # in kiln ops, so the backward pass runs the plugin's (deliberately wrong) kernel too.
    r = with_dummy.py_json(
        """
        import json, kiln
        x = kiln.tensor([1.0, 2.0], requires_grad=True)
        y = kiln.neg(x)
        y.sum().backward()
        print(json.dumps([y.tolist(), x.grad.tolist()]))
        """
    )
    assert r == [DUMMY_NEG[:2], DUMMY_NEG[:2]]


@pytest.mark.parametrize("via", ["module", "script"])
def test_plugins_json_reports_distribution_hooks_and_coverage(with_dummy, helpers, via):
    report = with_dummy.plugins_json(via=via)
    row = helpers.row(report, "dummy")
    assert row["status"] == "loaded" and row["error"] is None
    assert row["distribution"] == "kiln-dummy-plugin"
    assert row["version"] == "0.3.0"
    assert row["module"] == "kiln_dummy_plugin"
    assert row["hooks"] == ["kiln_register_kernels", "kiln_register_extensions"]
    assert row["kernels"] == {"cpu": ["neg"]}
    assert row["op_coverage"] == {"cpu": ["neg"]}
    assert row["extensions"] == [{"name": "kiln-dummy", "version": "1.2.3", "plugin": "dummy"}]
    assert row["devices"] == []
    ref = helpers.row(report, "kiln.reference")
    # the reference still registers neg, but the plugin owns it; the reference covers the rest
    assert "neg" in ref["kernels"]["cpu"]
    assert "neg" not in ref["op_coverage"]["cpu"]
    assert "add" in ref["op_coverage"]["cpu"]
    assert set(ref["op_coverage"]["cpu"]) == set(ref["kernels"]["cpu"]) - {"neg"}
    assert set(ref["kernels"]["cpu"]) <= set(report["ops"])
    # the reference backend is listed last (architecture page, "Plugins": loaded last so plugins take precedence)
    assert report["plugins"][-1]["name"] == "kiln.reference"


def test_plugins_text_output(with_dummy):
    out = with_dummy.kiln("plugins").stdout
    assert "dummy  [loaded]  kiln-dummy-plugin 0.3.0" in out
    assert "provides: kiln-dummy 1.2.3" in out
    assert "hooks:   kernels, extensions" in out
    assert "kernels: cpu: 1/" in out


def test_doctor_lists_the_extension(with_dummy):
    proc = with_dummy.kiln("doctor")
    assert "kiln-dummy 1.2.3" in proc.stdout


def test_disabling_restores_the_reference_kernel(with_dummy, helpers):
    env = {"KILN_DISABLE_PLUGINS": "dummy"}
    r = with_dummy.py_json(NEG_PROBE, env=env)
    assert r["neg"] == REFERENCE_NEG and r["owner"] == "kiln.reference"
    assert r["calls"] is None  # the plugin module was never imported
    assert r["extensions"] == ["kiln"]
    assert helpers.row(with_dummy.plugins_json(env=env), "dummy")["status"] == "disabled"


def test_allow_list_picks_the_good_plugin_over_a_broken_one(with_dummy, broken_plugin, helpers):
    with with_dummy.installed(broken_plugin.wheel, broken_plugin.name):
        env = {"KILN_PLUGINS": "dummy"}
        report = with_dummy.plugins_json(env=env)
        assert helpers.row(report, "dummy")["status"] == "loaded"
        assert helpers.row(report, "broken")["status"] == "disabled"
        assert not any(r["error"] for r in report["plugins"])
        assert with_dummy.py_json(NEG_PROBE, env=env)["neg"] == DUMMY_NEG
        # without the allow list the broken one is reported and the good one still works
        report = with_dummy.plugins_json()
        assert helpers.row(report, "broken")["status"] == "error"
        assert helpers.row(report, "dummy")["status"] == "loaded"
        assert with_dummy.py_json(NEG_PROBE)["neg"] == DUMMY_NEG
        # strict mode: a plugin is broken, so first use fails even though the good one loads
        proc = with_dummy.py(NEG_PROBE, env={"KILN_STRICT_PLUGINS": "1"}, check=False)
        assert proc.returncode != 0 and "'broken'" in proc.stderr
