"""``kiln.nn.functional``: the stateless counterparts of the layers (``torch.nn.functional``).

The primitives (convolution, pooling, normalisation, losses, activations) are core ops; the core's
public module :mod:`kiln.nn_functional` holds them and this module re-exports every name of it. ``linear`` and ``bilinear``
are composed here from core matmul ops (each with PyTorch's autocast policy for it, a composite); ``relu`` (with PyTorch's ``inplace=``), ``sigmoid`` and
``tanh`` wrap the core's elementwise ops.
"""

from __future__ import annotations

import kiln
from kiln import Tensor, addmm, einsum
from kiln import nn_functional as _core
from kiln.backend import composite
from kiln.nn import _attention, _fractional, _functional_misc, _grid, _pooling
from kiln.nn._attention import *  # noqa: F403
from kiln.nn._fractional import *  # noqa: F403
from kiln.nn._functional_misc import *  # noqa: F403
from kiln.nn._grid import *  # noqa: F403
from kiln.nn._linear_cross_entropy import *  # noqa: F403
from kiln.nn._pooling import *  # noqa: F403
from kiln.nn_functional import *  # noqa: F403 - every name of the core's literal __all__ (IDEs resolve it)

__all__ = [
    *_core.__all__,
    "linear",
    "bilinear",
    "relu",
    "sigmoid",
    "tanh",
    *_pooling.__all__,
    *_fractional.__all__,
    *_grid.__all__,
    *_functional_misc.__all__,
    *_attention.__all__,
]


@composite(autocast="lower")
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` over the last dimension of ``input`` (``torch.nn.functional.linear``).

    ``weight`` is ``(out_features, in_features)``; a mismatch raises the matmul error
    ``"mat1 and mat2 shapes cannot be multiplied (...)"`` with ``input`` flattened to 2-D, as PyTorch does.
    """
    if input.ndim == 2:
        if bias is not None:
            return addmm(bias, input, weight.t())
        return input.matmul(weight.t())
    if input.ndim <= 1:
        out = input.matmul(weight.t())
        return out + bias if bias is not None else out
    lead = input.shape[:-1]
    flat = input.reshape(-1, input.shape[-1])
    out = addmm(bias, flat, weight.t()) if bias is not None else flat.matmul(weight.t())
    return out.reshape(*lead, weight.shape[0])


@composite(autocast="promote")
def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y[..., o] = Σ_ij input1[..., i] weight[o, i, j] input2[..., j] + bias[o]`` (``torch.nn.functional.bilinear``)."""
    if input1.shape[:-1] != input2.shape[:-1]:
        raise RuntimeError(
            f"bilinear(): input batch dimensions do not match: got {list(input1.shape[:-1])} and "
            f"{list(input2.shape[:-1])}"
        )
    if weight.ndim != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]:
        raise RuntimeError(
            f"bilinear(): input sizes {input1.shape[-1]} and {input2.shape[-1]} do not match weight of shape "
            f"{list(weight.shape)}"
        )
    lead = input1.shape[:-1]
    x1 = input1.reshape(-1, input1.shape[-1])
    x2 = input2.reshape(-1, input2.shape[-1])
    out = einsum("bi,oij,bj->bo", x1, weight, x2)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(input, 0)`` elementwise; ``inplace=True`` writes into ``input``."""
    return input.relu_() if inplace else kiln.relu(input)


def sigmoid(input: Tensor) -> Tensor:
    """``1 / (1 + exp(-input))`` elementwise."""
    return kiln.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return kiln.tanh(input)
