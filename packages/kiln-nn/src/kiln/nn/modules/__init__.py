"""The layer classes of :mod:`kiln.nn`."""

from kiln.nn.modules.container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from kiln.nn.modules.flatten import Flatten, Unflatten
from kiln.nn.modules.linear import Bilinear, Identity, LazyLinear, Linear
from kiln.nn.modules.module import Module

__all__ = [
    "Module",
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
]
