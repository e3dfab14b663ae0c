"""nn primitives: ``scaled_dot_product_attention`` (``torch.nn.functional`` semantics), a composition of
kiln ops as in PyTorch's math backend.
"""

from __future__ import annotations

import math

from kiln import _dtype as dt
from kiln._dispatch import composite
from kiln._ops._meta import broadcast_pair, common_device, scalar_type_name, wrap_dim
from kiln._ops.activation import _need_tensor
from kiln._ops.elementwise import exp, where
from kiln._ops.math_args import _TYPEMETA_NAMES
from kiln._tensor import Tensor

__all__ = ["scaled_dot_product_attention"]


# ---------------------------------------------------------------------------------------- attention


def _ctype(d: dt.dtype) -> str:
    return _TYPEMETA_NAMES[d]


def _sdpa_check(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    for name, t, pos in (("query", query, 1), ("key", key, 2), ("value", value, 3)):
        _need_tensor(t, "scaled_dot_product_attention", name, pos)
    if attn_mask is not None and is_causal:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got query.dim: "
            f"{query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead."
        )
    if not (query._dtype is key._dtype is value._dtype):
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{_ctype(query._dtype)} key.dtype: {_ctype(key._dtype)} and value.dtype: {_ctype(value._dtype)} "
            "instead."
        )
    if not query._dtype.is_floating_point:
        raise RuntimeError(f"expected scalar type Float but found {scalar_type_name(query._dtype)}")
    if attn_mask is not None:
        _need_tensor(attn_mask, "scaled_dot_product_attention", "attn_mask", 4)
        md = attn_mask._dtype
        if md is not dt.bool and md is not dt.float32 and md is not query._dtype:
            raise RuntimeError(
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
                f"{_ctype(md)} and  query.dtype: {_ctype(query._dtype)} instead."
            )
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    common_device("scaled_dot_product_attention", query, key, value, attn_mask)
    k_batch = key._shape[:-2]
    if enable_gqa:
        for t in (query, key, value):
            wrap_dim(-3, t.dim())
        hq, hk, hv = query._shape[-3], key._shape[-3], value._shape[-3]
        if hq % hk or hq % hv:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in ")
        k_batch = k_batch[:-1] + (hq,)
    batch = math.prod(broadcast_pair(query._shape[:-2], k_batch))
    if key._shape[-1] != query._shape[-1]:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{batch}, {query._shape[-1]}] "
            f"but got: [{batch}, {key._shape[-1]}]."
        )
    if value._shape[-2] != key._shape[-2]:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{batch}, {key._shape[-2]}] "
            f"but got: [{batch}, {value._shape[-2]}]."
        )


def _repeat_heads(t: Tensor, groups: int) -> Tensor:
    """``t.repeat_interleave(groups, dim=-3)`` as a view-and-reshape."""
    if groups == 1:
        return t
    s = t.shape
    e = t.unsqueeze(-3).expand(*s[:-3], s[-3], groups, s[-2], s[-1])
    return e.reshape(*s[:-3], s[-3] * groups, s[-2], s[-1])


def _masked_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last dim that gives 0 (not NaN) in rows where every score is ``-inf``, as
    PyTorch's math path does."""
    from kiln._ops.reduction import amax

    if scores.shape[-1] == 0:  # no keys: every row is empty, the result is all zeros
        return scores * 0.0
    m = amax(scores.detach(), -1, True)
    m = where(m == -math.inf, 0.0, m)
    e = exp(scores - m)
    s = e.sum(-1, keepdim=True)
    return e / where(s == 0, 1.0, s)


@composite(autocast="lower")
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over the last two dims, batch dims broadcasting.

    ``attn_mask``: bool (True = attend) or additive float, broadcastable to ``(..., L, S)``;
    ``is_causal``: a top-left aligned lower-triangular mask; fully masked rows give zeros (PyTorch's
    CPU math path); ``dropout_p > 0`` drops attention weights with kiln's RNG; ``enable_gqa``: key and
    value heads (dim -3) are repeated to match the query's.
    """
    from kiln._ops.creation import ones
    from kiln._ops.linalg import matmul
    from kiln._ops.random_ops import rand
    from kiln._ops.shape import tril

    _sdpa_check(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    L, S = query.shape[-2], key.shape[-2]
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
        value = _repeat_heads(value, query.shape[-3] // value.shape[-3])
    scores = matmul(query, key.transpose(-2, -1)) * factor
    if is_causal:
        attn_mask = tril(ones((L, S), dtype=dt.bool, device=query.device))
    if attn_mask is not None:
        broadcast_pair(scores._shape, attn_mask._shape)
        if attn_mask._dtype is dt.bool:
            scores = where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask.to(scores.dtype)
    weights = _masked_softmax(scores)
    if dropout_p > 0.0:
        keep = rand(weights.shape, dtype=dt.float32, device=weights.device) >= dropout_p
        weights = where(keep, weights, 0.0) * (1.0 / (1.0 - dropout_p)) if dropout_p < 1.0 else weights * 0.0
    return matmul(weights, value)
