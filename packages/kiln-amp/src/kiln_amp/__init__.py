"""kiln-amp's distribution module: the plugin entry point lives in :mod:`kiln_amp.plugin`.

The public API is :mod:`kiln.amp` (and ``kiln.autocast``, ``kiln.cpu.amp``, ``kiln.cuda.amp``).
"""

__version__ = "0.1.0"
