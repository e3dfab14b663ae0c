"""Public plugin API: what a plugin author and a curious user need.

A plugin is a module named by an entry point in group ``kiln`` that defines any of the hook
functions in :mod:`kiln.hookspecs` (plain functions named ``kiln_register_*``, or decorated with
:data:`hookimpl`). See the "Writing a device plugin" guide.
"""

from __future__ import annotations

from kiln._plugins import (
    DeviceType,
    PluginInfo,
    collectives,
    compilers,
    device_type,
    devices,
    extensions,
    fallback_counts,
    fused_update,
    kernel_owner,
    op_coverage,
    plugins,
    refresh_kernels,
    register_plugin,
    unregister_plugin,
)


def __getattr__(name: str):
    if name in ("hookimpl", "hookspec"):  # pluggy is imported only when a plugin asks for the markers
        from kiln import hookspecs

        return getattr(hookspecs, name)
    raise AttributeError(f"module 'kiln.plugins' has no attribute '{name}'")


__all__ = [
    "DeviceType",
    "PluginInfo",
    "collectives",
    "compilers",
    "device_type",
    "devices",
    "extensions",
    "fallback_counts",
    "fused_update",
    "hookimpl",  # noqa: F822 - provided lazily by __getattr__
    "hookspec",  # noqa: F822
    "kernel_owner",
    "op_coverage",
    "plugins",
    "refresh_kernels",
    "register_plugin",
    "unregister_plugin",
]
