"""``kiln.nn``: modules, parameters, containers and layers (``torch.nn``), from the kiln-nn distribution.

``kiln.nn.functional`` holds the stateless ops, ``kiln.nn.init`` the initialisers and ``kiln.nn.utils``
gradient clipping and parameter/vector conversion.
"""

from kiln.nn import functional, init, modules, utils
from kiln.nn.modules import *  # noqa: F403
from kiln.nn.parameter import Buffer, Parameter, UninitializedParameter

__all__ = [
    *modules.__all__,
    "Parameter",
    "Buffer",
    "UninitializedParameter",
    "functional",
    "init",
    "utils",
]
