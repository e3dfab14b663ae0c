"""``kiln doctor`` lists the collective engines plugins register, and whether each can run."""

from __future__ import annotations

import argparse

from kiln import _cli, _plugins


class _Engine:
    devices = ("cpu",)

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def is_available(self) -> bool:
        return self.ok


class _Plugin:
    def kiln_register_collectives(self, register):
        register("fastnet", _Engine(True))
        register("slownet", _Engine(False))


def test_doctor_reports_each_engine(capsys):
    _plugins.register_plugin(_Plugin(), name="test-collectives")
    try:
        _cli.cmd_doctor(argparse.Namespace())
    finally:
        _plugins.unregister_plugin("test-collectives")
    out = capsys.readouterr().out
    assert "collective engines (kiln.distributed backends):" in out
    assert "  fastnet: usable, for cpu tensors" in out
    assert "  slownet: not usable (its library is missing), for cpu tensors" in out
    assert "no collective engine is usable" not in out
