"""kiln-data's distribution module: the plugin entry point lives in :mod:`kiln_data.plugin`.

The public API is :mod:`kiln.data`.
"""

__version__ = "0.1.0"
