"""Plugins whose hooks raise: recorded with the error, their registrations discarded, the rest working.

architecture page, "Plugins": a plugin whose hook raises is recorded with its traceback (``kiln plugins`` shows it); what it
registered is discarded and everything else keeps working; ``KILN_STRICT_PLUGINS=1`` fails fast instead.
"""

from __future__ import annotations

NEG_PROBE = """
import json
import kiln
from kiln import _plugins
x = kiln.tensor([1.0, -2.0, 3.0])
print(json.dumps({
    "neg": kiln.neg(x).tolist(),
    "add": (x + 1).tolist(),
    "owner": _plugins.kernel_owner("neg", "cpu"),
    "extensions": sorted(_plugins.extensions()),
}))
"""
REFERENCE_NEG = [-1.0, 2.0, -3.0]


def test_plugin_whose_kernel_hook_raises(venv, hookfail_plugin, helpers):
    with venv.installed(hookfail_plugin.wheel, hookfail_plugin.name):
        report = venv.plugins_json()
        row = helpers.row(report, "hookfail")
        assert row["status"] == "error"
        assert "kernel hook exploded on purpose" in row["error"]
        assert "RuntimeError" in row["error"]
        assert row["distribution"] == "kiln-hookfail-plugin"
        # what the failing hook registered before raising is discarded; later hooks are not called
        assert row["kernels"] == {} and row["op_coverage"] == {}
        assert row["extensions"] == []
        r = venv.py_json(NEG_PROBE)
        assert r["neg"] == REFERENCE_NEG and r["owner"] == "kiln.reference"
        assert r["add"] == [2.0, -1.0, 4.0]
        assert r["extensions"] == ["kiln"]
        out = venv.kiln("plugins").stdout
        assert "hookfail  [error]" in out and "kernel hook exploded on purpose" in out
        proc = venv.py(NEG_PROBE, env={"KILN_STRICT_PLUGINS": "1"}, check=False)
        assert proc.returncode != 0
        assert "'hookfail'" in proc.stderr and "kiln_register_kernels" in proc.stderr


def test_plugin_whose_later_hook_raises_is_reported(venv, halfbroken_plugin, helpers):
    with venv.installed(halfbroken_plugin.wheel, halfbroken_plugin.name):
        row = helpers.row(venv.plugins_json(), "halfbroken")
        assert row["status"] == "error"
        assert "extension hook exploded on purpose" in row["error"]
        assert venv.py("import kiln; print((kiln.ones(2) + 1).tolist())").stdout.strip() == "[2.0, 2.0]"


def test_plugin_whose_later_hook_raises_loses_its_kernels(venv, halfbroken_plugin):
    with venv.installed(halfbroken_plugin.wheel, halfbroken_plugin.name):
        r = venv.py_json(NEG_PROBE)
        assert r["owner"] == "kiln.reference"
        assert r["neg"] == REFERENCE_NEG
