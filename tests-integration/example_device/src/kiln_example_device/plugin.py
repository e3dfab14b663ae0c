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
    """Register the example device's kernels: exactly kiln's primitive set (every other op runs through
    its decomposition into those, on the device). A hand-written kernel narrowed to some dtypes is backed
    by kiln's reference kernel for the others."""
    for op_name, (kernel, dtypes) in kernels.KERNELS.items():
        register(op_name, device.NAME, kernel, dtypes=dtypes)
        if dtypes is not None:
            register(op_name, device.NAME, kernels.reference_on_device(op_name))
