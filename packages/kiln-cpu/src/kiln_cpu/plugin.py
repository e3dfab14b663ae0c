"""The module the ``kiln`` entry point ``cpu`` names: kiln-cpu's kernels for device ``"cpu"``.

Importing it is cheap and compiles nothing; the hook builds the kernel table (plain Python wrappers) and
Numba compiles a loop the first time a large enough tensor needs it.
"""

from __future__ import annotations


def kiln_register_kernels(register):
    """Register kiln-cpu's Numba kernels for ``cpu``, narrowed to the output dtypes they serve (and set
    glibc's allocator thresholds for tensor-sized arrays: :mod:`kiln_cpu._malloc`)."""
    from kiln_cpu._malloc import tune
    from kiln_cpu.registry import inplace_kernels, kernels

    tune()

    table = kernels()
    for op_name, (kernel, dtypes) in table.items():
        register(op_name, "cpu", kernel, dtypes=dtypes)
    for op_name, (kernel, dtypes) in inplace_kernels(table).items():
        register(op_name, "cpu", kernel, dtypes=dtypes, inplace=True)


def kiln_register_threading(register):
    """``kiln.set_num_threads`` / ``kiln.get_num_threads`` drive kiln-cpu's thread pool."""
    from kiln_cpu._threads import get_num_threads, set_num_threads

    register("cpu", set_num_threads=set_num_threads, get_num_threads=get_num_threads)


def kiln_register_fused_updates(register):
    """kiln.optim's SGD and Adam/AdamW run as one Numba pass per parameter on ``cpu``."""
    from kiln_cpu.optim import fused_updates

    for name, fn in fused_updates().items():
        register(name, "cpu", fn)


def kiln_register_compilers(register):
    """kiln-compile's code generator for ``cpu``: a fused group of pointwise ops becomes one Numba loop."""
    from kiln_cpu.fusion import codegen

    register("cpu-fused", codegen)
