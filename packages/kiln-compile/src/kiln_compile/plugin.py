"""The module kiln's ``kiln`` entry point ``compile`` names: the compiler backends, and kiln.compile announced as
an extension. Importing it is cheap; kiln calls the hooks lazily."""

from __future__ import annotations

from kiln_compile import __version__


def kiln_register_compilers(register):
    """Register the backends ``kiln.compile(backend=...)`` selects: ``kiln``, ``eager`` and ``debug``."""
    from kiln.compile._backends import debug_backend, eager_backend, kiln_backend

    register("kiln", kiln_backend)
    register("eager", eager_backend)
    register("debug", debug_backend)


def kiln_register_extensions(register):
    """Announce ``kiln.compile``, ``kiln.export`` and ``kiln.onnx`` as feature namespaces of this distribution."""
    register("compile", __version__, distribution="kiln-compile", modules=["kiln.compile", "kiln.export", "kiln.onnx"])
