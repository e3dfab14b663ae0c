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


def inplace_kernels() -> dict[str, tuple]:
    """Every in-place kernel kiln-cpu provides (``register(..., inplace=True)``): op name -> (kernel,
    dtypes served)."""
    from kiln_cpu import kernels_elementwise, kernels_index, kernels_ternary

    return {
        **kernels_elementwise.inplace_kernels(),
        **kernels_ternary.inplace_kernels(),
        **kernels_index.inplace_kernels(),
    }
