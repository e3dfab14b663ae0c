"""Every core op. Importing this package defines them all (in the op registry) and binds their
``Tensor`` methods; the reference backend imports it when it first registers kernels."""

import warnings as _warnings

from kiln._ops import copy, creation, elementwise, linalg, reduction, strided, views
from kiln._ops.inplace import install_inplace_methods

install_inplace_methods()

# IEEE results (inf, nan) are values, not events: PyTorch computes 1/0 and log(-1) silently, so the
# NumPy reference kernels must not warn either. Scoped to the modules that hold those kernels.
_warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"kiln\._ops\.")
