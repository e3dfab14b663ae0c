"""kiln-cuda: kiln's ``cuda`` device on numba.cuda.

Importing this package is cheap: numba.cuda loads the first time a ``cuda`` tensor is made or
``kiln.cuda`` is asked something (:mod:`kiln_cuda._driver`). Users reach it through kiln itself —
``device="cuda"``, ``tensor.cuda()``, ``kiln.cuda.*`` — never by importing it.
"""

__version__ = "0.1.0"
