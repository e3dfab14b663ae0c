"""Flatten parameters into one vector and back (``torch.nn.utils.parameters_to_vector``)."""

from __future__ import annotations

from collections.abc import Iterable

from kiln import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _check_same_device(param: Tensor, old_device):
    if old_device is None:
        return param.device
    if param.device != old_device:
        raise TypeError("Found two parameters on different devices, this is currently not supported.")
    return old_device


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All ``parameters`` flattened and concatenated into one 1-D tensor (differentiable)."""
    from kiln import cat

    if isinstance(parameters, Tensor):
        raise TypeError(f"expected an iterable of Tensors, but got: {parameters.type()}")
    param_device = None
    vec = []
    for param in parameters:
        param_device = _check_same_device(param, param_device)
        vec.append(param.view(-1))
    return cat(vec)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``vec`` into ``parameters`` (their ``.data``)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected kiln.Tensor, but got: {type(vec).__name__}")
    param_device = None
    pointer = 0
    for param in parameters:
        param_device = _check_same_device(param, param_device)
        num_param = param.numel()
        param.data = vec[pointer : pointer + num_param].view_as(param).data
        pointer += num_param
