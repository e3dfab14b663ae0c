"""``kiln.nn``: modules, parameters, containers and layers (``torch.nn``), from the kiln-nn distribution.

``kiln.nn.functional`` holds the stateless ops, ``kiln.nn.init`` the initialisers and ``kiln.nn.utils``
gradient clipping and parameter/vector conversion.
"""

from kiln.nn import functional, init, utils
from kiln.nn.modules import (
    Bilinear,
    Flatten,
    Identity,
    LazyLinear,
    Linear,
    Module,
    ModuleDict,
    ModuleList,
    ParameterDict,
    ParameterList,
    Sequential,
    Unflatten,
)
from kiln.nn.parameter import Buffer, Parameter, UninitializedParameter

__all__ = [
    "Module",
    "Parameter",
    "Buffer",
    "UninitializedParameter",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "ParameterList",
    "ParameterDict",
    "Identity",
    "Linear",
    "Bilinear",
    "LazyLinear",
    "Flatten",
    "Unflatten",
    "functional",
    "init",
    "utils",
]
