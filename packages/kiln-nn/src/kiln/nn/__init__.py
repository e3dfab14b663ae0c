"""``kiln.nn``: modules, parameters, containers and layers (``torch.nn``), from the kiln-nn distribution.

``kiln.nn.functional`` holds the stateless ops, ``kiln.nn.init`` the initialisers and ``kiln.nn.utils``
gradient clipping and parameter/vector conversion.
"""

from kiln.nn import functional, init, modules, parallel, utils
from kiln.nn.modules import *  # noqa: F403
from kiln.nn.modules.utils import factory_kwargs
from kiln.nn.parallel import DataParallel
from kiln.nn.parameter import Buffer, Parameter, UninitializedBuffer, UninitializedParameter

__all__ = [
    *modules.__all__,
    "DataParallel",
    "Parameter",
    "Buffer",
    "UninitializedParameter",
    "UninitializedBuffer",
    "factory_kwargs",
    "functional",
    "init",
    "parallel",
    "utils",
]
