"""kiln-nn announces itself to kiln's plugin manager through the ``kiln`` entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import kiln_nn.plugin


def test_entry_point_is_installed():
    names = {ep.name: ep.value for ep in entry_points(group="kiln")}
    assert names.get("nn") == "kiln_nn.plugin"


def test_hook_registers_extension():
    got = []
    kiln_nn.plugin.kiln_register_extensions(lambda name, version, **info: got.append((name, version, info)))
    assert got[0][0] == "nn" and got[0][1] == "0.1.0" and "kiln.optim" in got[0][2]["modules"]


def test_kiln_lists_the_extension():
    import kiln.plugins

    info = kiln.plugins.extensions()["nn"]
    assert info["version"] == "0.1.0" and info["distribution"] == "kiln-nn"
