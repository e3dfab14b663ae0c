"""The module the ``kiln`` entry point names: the hooks kiln calls, once, the first time it needs a device.

Each hook receives a ``register`` callback. Importing this module is cheap and has no side effects;
kiln imports it lazily (never at ``import kiln``) and records any exception it raises instead of failing.
"""

from __future__ import annotations

from kiln_example_device import device, kernels


def kiln_register_devices(register):
    """Register device type ``example``: bytearray-backed memory with its own allocator."""
    register(
        device.NAME,
        empty=device.empty,
        to_host=device.to_host,
        from_host=device.from_host,
        write=device.write,
        synchronize=device.synchronize,
        memory_stats=device.memory_stats,
        device_count=device.device_count,
        data_ptr=device.data_ptr,
        dtypes=device.DTYPES,
    )


def kiln_register_kernels(register):
    """Register the example device's kernels; kiln's opt-in CPU fallback serves every other op."""
    for op_name, (kernel, dtypes) in kernels.KERNELS.items():
        register(op_name, device.NAME, kernel, dtypes=dtypes)
