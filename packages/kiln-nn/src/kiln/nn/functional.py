"""``kiln.nn.functional``: the stateless counterparts of the layers (``torch.nn.functional``).

The primitives (convolution, pooling, normalisation, losses, activations) are core ops defined in
``kiln._ops`` (``nn_conv``, ``pool``, ``resample``, ``pad``, ``softmax``, ``normalization``, ``embedding``,
``dropout``, the ``*_loss`` modules, ``activation``, ``attention``, ``distance``, ``one_hot``); this module
re-exports each of those modules' ``__all__``. ``linear`` and ``bilinear``
are composed here from core matmul ops; ``relu`` (with PyTorch's ``inplace=``), ``sigmoid`` and
``tanh`` wrap the core's elementwise ops.
"""

from __future__ import annotations

from kiln._ops import activation as _activation
from kiln._ops import attention as _attention
from kiln._ops import classification_loss as _classification_loss
from kiln._ops import ctc_loss as _ctc_loss
from kiln._ops import distance as _distance
from kiln._ops import dropout as _dropout
from kiln._ops import elementwise as _ew
from kiln._ops import embedding as _embedding
from kiln._ops import margin_loss as _margin_loss
from kiln._ops import nn_conv as _nn_conv
from kiln._ops import normalization as _normalization
from kiln._ops import one_hot as _one_hot
from kiln._ops import pad as _pad
from kiln._ops import pool as _pool
from kiln._ops import regression_loss as _regression_loss
from kiln._ops import resample as _resample
from kiln._ops import softmax as _softmax
from kiln._ops.products import addmm as _addmm
from kiln._tensor import Tensor

__all__ = ["linear", "bilinear", "relu", "sigmoid", "tanh"]


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` over the last dimension of ``input`` (``torch.nn.functional.linear``).

    ``weight`` is ``(out_features, in_features)``; a mismatch raises the matmul error
    ``"mat1 and mat2 shapes cannot be multiplied (...)"`` with ``input`` flattened to 2-D, as PyTorch does.
    """
    if input.ndim == 2:
        if bias is not None:
            return _addmm(bias, input, weight.t())
        return input.matmul(weight.t())
    if input.ndim <= 1:
        out = input.matmul(weight.t())
        return out + bias if bias is not None else out
    lead = input.shape[:-1]
    flat = input.reshape(-1, input.shape[-1])
    out = _addmm(bias, flat, weight.t()) if bias is not None else flat.matmul(weight.t())
    return out.reshape(*lead, weight.shape[0])


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
    from kiln._ops.einsum import einsum

    out = einsum("bi,oij,bj->bo", x1, weight, x2)
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(input, 0)`` elementwise; ``inplace=True`` writes into ``input``."""
    return input.relu_() if inplace else _ew.relu(input)


def sigmoid(input: Tensor) -> Tensor:
    """``1 / (1 + exp(-input))`` elementwise."""
    return _ew.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return _ew.tanh(input)


def _reexport_core() -> None:
    for module in (
        _nn_conv,
        _pool,
        _resample,
        _pad,
        _softmax,
        _normalization,
        _embedding,
        _dropout,
        _classification_loss,
        _regression_loss,
        _margin_loss,
        _ctc_loss,
        _activation,
        _attention,
        _distance,
        _one_hot,
    ):
        for name in module.__all__:
            globals()[name] = getattr(module, name)
            if name not in __all__:
                __all__.append(name)


_reexport_core()
