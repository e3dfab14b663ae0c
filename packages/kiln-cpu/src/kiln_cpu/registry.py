"""The table of every kernel kiln-cpu registers, gathered from the kernel families (``kernels_*.py``).

The one module that imports the families; none of them (nor :mod:`kiln_cpu._kernel_support`) imports it.
The families are imported when the table is built (:mod:`kiln_cpu.plugin`'s hook), not when this module
is.
"""

from __future__ import annotations


def kernels() -> dict[str, tuple]:
    """Every kernel kiln-cpu provides: op name -> (kernel, output dtypes served)."""
    from kiln_cpu import (
        kernels_amp,
        kernels_conv,
        kernels_elementwise,
        kernels_index,
        kernels_linalg,
        kernels_loss,
        kernels_nn,
        kernels_pool,
        kernels_pow,
        kernels_reduce,
        kernels_rnn,
        kernels_scan,
        kernels_ternary,
    )

    table = kernels_elementwise.kernels()
    table.update(kernels_reduce.kernels())
    modules = (kernels_nn, kernels_linalg, kernels_loss, kernels_conv, kernels_index, kernels_pool, kernels_scan)
    for module in (*modules, kernels_ternary, kernels_amp, kernels_pow, kernels_rnn):
        table.update(module.kernels())
    return table


def inplace_kernels(table: dict) -> dict[str, tuple]:
    """Every in-place kernel kiln-cpu provides (``register(..., inplace=True)``) for its kernel ``table``
    (:func:`kernels`): op name -> (kernel, dtypes served) (:func:`kiln_cpu._kernel_support.inplace_table`)."""
    from kiln_cpu._kernel_support import inplace_table

    return inplace_table(table)
