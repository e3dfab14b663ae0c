"""The module kiln's ``kiln`` entry point ``nn`` names: kiln-nn announces itself as an extension.

Importing it is cheap and has no side effects; kiln calls the hook lazily (never at ``import kiln``).
"""

from __future__ import annotations

from kiln_nn import __version__


def kiln_register_extensions(register):
    """Announce ``kiln.nn`` and ``kiln.optim`` as feature namespaces of this distribution."""
    register(
        "nn",
        __version__,
        distribution="kiln-nn",
        modules=["kiln.nn", "kiln.nn.functional", "kiln.nn.init", "kiln.nn.utils", "kiln.optim"],
    )
