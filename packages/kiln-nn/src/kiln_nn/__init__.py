"""kiln-nn's distribution-level package: the plugin module the ``kiln`` entry point names.

The public API lives in :mod:`kiln.nn` and :mod:`kiln.optim`.
"""

__version__ = "0.1.0"
