"""The module kiln's ``kiln`` entry point ``amp`` names: the autocast dispatch mode, and kiln.amp announced
as an extension.

Importing it is cheap; kiln calls the hooks lazily, the first time an autocast region opens (never at
``import kiln``).
"""

from __future__ import annotations

from kiln_amp import __version__


def kiln_register_modes(register):
    """Register the autocast dispatch mode that ``kiln.autocast`` regions push."""
    from kiln.amp.autocast_mode import AutocastMode

    register("autocast", AutocastMode)


def kiln_register_extensions(register):
    """Announce ``kiln.amp`` as a feature namespace of this distribution."""
    register("amp", __version__, distribution="kiln-amp", modules=["kiln.amp"])
