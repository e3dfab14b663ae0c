"""The ``kiln_register_fused_updates`` hook: registrations are collected lazily with the other hooks,
the latest plugin registered at run time wins, and a plugin's registrations leave with it."""

from __future__ import annotations

import kiln  # noqa: F401 - the core a plugin registers into
from kiln import _plugins


def _plugin(fn, name="toy", device_type="toydev"):
    class Plugin:
        def kiln_register_fused_updates(self, register):
            register(name, device_type, fn)

    return Plugin()


def test_a_plugin_registers_a_fused_update():
    def toy_update(params, grads, **hyper):
        return None

    assert _plugins.fused_update("toy", "toydev") is None
    info = _plugins.register_plugin(_plugin(toy_update), name="fused-toy")
    try:
        assert info.error is None
        assert "kiln_register_fused_updates" in info.hooks
        assert info.fused_updates == ["toy@toydev"]
        assert _plugins.fused_update("toy", "toydev") is toy_update
        assert _plugins.fused_update("toy", "cpu") is None
        assert info.as_dict()["fused_updates"] == ["toy@toydev"]
    finally:
        _plugins.unregister_plugin("fused-toy")
    assert _plugins.fused_update("toy", "toydev") is None


def test_the_plugin_registered_last_wins_until_it_leaves():
    def first(params, grads, **hyper):
        return None

    def second(params, grads, **hyper):
        return False

    _plugins.register_plugin(_plugin(first), name="fused-first")
    try:
        _plugins.register_plugin(_plugin(second), name="fused-second")
        assert _plugins.fused_update("toy", "toydev") is second
        _plugins.unregister_plugin("fused-second")
        assert _plugins.fused_update("toy", "toydev") is first
    finally:
        _plugins.unregister_plugin("fused-first")


def test_a_non_callable_update_is_a_plugin_error():
    info = _plugins.register_plugin(_plugin("not a function"), name="fused-broken")
    try:
        assert "not callable" in info.error
        assert info.fused_updates == []
        assert _plugins.fused_update("toy", "toydev") is None
    finally:
        _plugins.unregister_plugin("fused-broken")


def test_the_public_plugin_api_finds_the_fused_update():
    import kiln.plugins

    def toy_update(params, grads, **hyper):
        return None

    assert "fused_update" in kiln.plugins.__all__
    assert kiln.plugins.fused_update("toy", "toydev") is None
    kiln.plugins.register_plugin(_plugin(toy_update), name="fused-public")
    try:
        assert kiln.plugins.fused_update("toy", "toydev") is toy_update
        assert kiln.plugins.fused_update("toy", "cpu") is None
    finally:
        kiln.plugins.unregister_plugin("fused-public")
    assert kiln.plugins.fused_update("toy", "toydev") is None
