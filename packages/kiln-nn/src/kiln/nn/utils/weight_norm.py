"""The forward-pre-hook weight normalisation (``torch.nn.utils.weight_norm``), deprecated in favour of
:func:`kiln.nn.utils.parametrizations.weight_norm` as in torch.

``weight_norm(module)`` replaces the parameter ``weight`` by ``weight_g`` (magnitude) and ``weight_v``
(direction) and recomputes ``module.weight = weight_v * weight_g / ||weight_v||`` before every forward.
"""

from __future__ import annotations

import warnings
from typing import Any

from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter, UninitializedParameter
from kiln.nn.utils.parametrizations import _norm_except_dim, _weight_norm

__all__ = ["WeightNorm", "weight_norm", "remove_weight_norm"]


class WeightNorm:
    """The forward pre-hook that recomputes ``module.<name>`` from ``<name>_g`` and ``<name>_v``."""

    name: str
    dim: int

    def __init__(self, name: str, dim: int) -> None:
        if dim is None:
            dim = -1
        self.name = name
        self.dim = dim

    def compute_weight(self, module: Module) -> Any:
        """``v * g / norm_except_dim(v, 2, dim)``."""
        g = getattr(module, self.name + "_g")
        v = getattr(module, self.name + "_v")
        return _weight_norm(v, g, self.dim)

    @staticmethod
    def apply(module: Module, name: str, dim: int) -> WeightNorm:
        """Split ``module.<name>`` into ``<name>_g``/``<name>_v`` and register the hook."""
        warnings.warn(
            "`kiln.nn.utils.weight_norm` is deprecated in favor of `kiln.nn.utils.parametrizations.weight_norm`.",
            FutureWarning,
            stacklevel=3,
        )
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        if dim is None:
            dim = -1
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        if isinstance(weight, UninitializedParameter):
            raise ValueError(
                "The module passed to `WeightNorm` can't have uninitialized parameters. "
                "Make sure to run the dummy forward before applying weight normalization"
            )
        del module._parameters[name]
        module.register_parameter(name + "_g", Parameter(_norm_except_dim(weight, 2, dim).detach()))
        module.register_parameter(name + "_v", Parameter(weight.detach()))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module: Module) -> None:
        """Fold ``<name>_g``/``<name>_v`` back into the parameter ``<name>``."""
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.detach()))

    def __call__(self, module: Module, inputs: Any) -> None:
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module: Module, name: str = "weight", dim: int = 0) -> Module:
    """Weight-normalise ``module.<name>`` with a forward pre-hook (``dim=None``: one norm for the whole tensor).

    Emits torch's ``FutureWarning`` pointing to :func:`kiln.nn.utils.parametrizations.weight_norm`.
    """
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Remove the weight normalisation hook of ``name``, leaving the current weight as a parameter."""
    for k, hook in module._forward_pre_hooks.items():
        if isinstance(hook, WeightNorm) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")
