"""Every core op. Importing this package defines them all (in the op registry) and binds their
``Tensor`` methods; the reference backend imports it when it first registers kernels."""

from kiln._ops import (
    copy,
    creation,
    elementwise,
    indexing,
    linalg,
    linalg_extra,
    math,
    nn_activation,
    nn_conv,
    nn_loss,
    nn_norm,
    nn_pool,
    reduction,
    scans,
    shape,
    strided,
    subscript,
    views,
)
from kiln._ops.inplace import install_inplace_methods

install_inplace_methods()
