"""The hooks a kiln plugin implements (entry-point group ``kiln``).

Each hook receives a ``register`` callback; a plugin calls it once per thing it provides. Hooks run
once, lazily, the first time kiln needs a device, kernel or extension, never at ``import kiln``.
A plugin module implements any subset of them as plain functions decorated with ``kiln.hookimpl``.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("kiln")
hookimpl = pluggy.HookimplMarker("kiln")


@hookspec
def kiln_register_devices(register):
    """Register device types: ``register(name, *, empty, to_host, from_host, write, ...)``."""


@hookspec
def kiln_register_kernels(register):
    """Register kernels: ``register(op_name, device_type, kernel, dtypes=None)`` (``dtypes``: output dtypes)."""


@hookspec
def kiln_register_modes(register):
    """Register dispatch modes (autocast, tracing, profiling): ``register(name, mode_class)``."""


@hookspec
def kiln_register_collectives(register):
    """Register process-group backends (gloo, mpi, nccl, ...): ``register(name, factory)``."""


@hookspec
def kiln_register_compilers(register):
    """Register compile and export targets: ``register(name, compiler)``."""


@hookspec
def kiln_register_threading(register):
    """Register a backend's intra-op thread control: ``register(name, set_num_threads=fn, get_num_threads=fn)``.

    ``kiln.set_num_threads(n)`` calls every registered setter; ``kiln.get_num_threads()`` asks the first
    registered getter."""


@hookspec
def kiln_register_extensions(register):
    """Announce a feature package: ``register(name, version, **info)``."""
