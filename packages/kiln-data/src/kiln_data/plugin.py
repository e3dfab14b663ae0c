"""kiln-data's plugin module (entry point ``data`` in group ``kiln``): announces ``kiln.data``."""

from __future__ import annotations

from kiln.hookspecs import hookimpl
from kiln_data import __version__


@hookimpl
def kiln_register_extensions(register):
    """Announce the ``data`` feature package (``kiln.data``)."""
    register("data", __version__, module="kiln.data")
