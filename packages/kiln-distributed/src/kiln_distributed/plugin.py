"""The module kiln's ``kiln`` entry point ``distributed`` names: the gloo and mpi engines, and
kiln.distributed announced as an extension.

Importing it is cheap: neither engine's library (PyTorch's Gloo, mpi4py) is imported until a process
group of that backend is made.
"""

from __future__ import annotations

from kiln_distributed import __version__


def kiln_register_collectives(register):
    """Register the gloo and mpi engines (process-group backends for cpu tensors)."""
    from kiln_distributed.gloo import GlooEngine
    from kiln_distributed.mpi import MPIEngine

    register("gloo", GlooEngine)
    register("mpi", MPIEngine)


def kiln_register_extensions(register):
    """Announce ``kiln.distributed`` as a feature namespace of this distribution."""
    register("distributed", __version__, distribution="kiln-distributed", modules=["kiln.distributed"])
