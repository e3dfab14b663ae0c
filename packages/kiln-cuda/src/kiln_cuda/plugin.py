"""The module the ``kiln`` entry point names: registers device type ``cuda`` and its kernels.

Importing it is cheap: numba.cuda loads when a cuda tensor is first made or ``kiln.cuda`` first asks the
driver something.
"""

from __future__ import annotations

import kiln
from kiln_cuda import api, device


def kiln_register_devices(register):
    """Register device type ``cuda``: device memory from a caching allocator, streams, events."""
    register(
        device.NAME,
        empty=device.empty,
        to_host=device.to_host,
        from_host=device.from_host,
        write=device.write,
        synchronize=device.synchronize,
        memory_stats=device.memory_stats,
        device_count=device.device_count,
        is_available=device.is_available,
        data_ptr=device.data_ptr,
        empty_cache=device.empty_cache,
        pin_memory=device.pin_memory,
        is_pinned=device.is_pinned,
        autocast_dtype=kiln.float16,
        module=api,
    )


def kiln_register_kernels(register):
    """Register kiln-cuda's generated kernels (every other op runs through its decomposition)."""
    from kiln_cuda import kernels, kernels_index, kernels_nn

    for op_name, (kernel, dtypes) in {**kernels.KERNELS, **kernels_index.KERNELS, **kernels_nn.KERNELS}.items():
        register(op_name, device.NAME, kernel, dtypes=dtypes)


def kiln_register_compilers(register):
    """Register kiln-cuda's code generator for kiln.compile's fused groups on device ``cuda``."""
    from kiln_cuda.fusion import codegen_fused

    register("cuda-fused", codegen_fused)
