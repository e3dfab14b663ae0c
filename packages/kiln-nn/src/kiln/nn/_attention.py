"""``multi_head_attention_forward`` (``torch.nn.functional.multi_head_attention_forward``): the
computation of :class:`kiln.nn.MultiheadAttention`, as a function of its parameters, in kiln ops."""

from __future__ import annotations

import math
import warnings

import kiln
from kiln import Tensor

__all__ = ["multi_head_attention_forward"]


def _F():
    from kiln.nn import functional

    return functional


def canonical_mask(mask: Tensor | None, mask_name: str, other_type, other_name: str, target_type, check_other=True):
    """A boolean mask (True = may not attend) as an additive float mask (``-inf`` there); float masks pass
    through. Other dtypes raise; a mask whose dtype differs from the other mask's warns, as in PyTorch."""
    if mask is None:
        return None
    is_float = mask.dtype.is_floating_point
    if mask.dtype != kiln.bool and not is_float:
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype != other_type:
        warnings.warn(
            f"Support for mismatched {mask_name} and {other_name} is deprecated. Use same type for both instead.",
            stacklevel=3,
        )
    if not is_float:
        mask = kiln.zeros(mask.shape, dtype=target_type, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask


def mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads: int) -> bool:
    """Whether the input is batched (3-D ``query``) or not (2-D), with PyTorch's messages on a mismatch."""
    rank = query.dim()
    if rank not in (2, 3):
        raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {rank}-D query tensor")
    which = f"For {'batched' if rank == 3 else 'unbatched'} ({rank}-D) `query`, expected"
    if key.dim() != rank or value.dim() != rank:
        raise AssertionError(
            f"{which} `key` and `value` to be {rank}-D but found {key.dim()}-D and {value.dim()}-D tensors respectively"
        )
    if key_padding_mask is not None and key_padding_mask.dim() != rank - 1:
        raise AssertionError(
            f"{which} `key_padding_mask` to be `None` or {rank - 1}-D but found {key_padding_mask.dim()}-D tensor instead"
        )
    if attn_mask is not None:
        if attn_mask.dim() not in (2, 3):
            raise AssertionError(
                f"{which} `attn_mask` to be `None`, 2-D or 3-D but found {attn_mask.dim()}-D tensor instead"
            )
        if rank == 2 and attn_mask.dim() == 3:
            expected = (num_heads, query.shape[0], key.shape[0])
            if tuple(attn_mask.shape) != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got {attn_mask.shape}")
    return rank == 3


def _project(query, key, value, w, b, separate, q_w, k_w, v_w, embed_dim):
    F = _F()
    bq = bk = bv = None
    if b is not None:
        bq, bk, bv = b[:embed_dim], b[embed_dim : 2 * embed_dim], b[2 * embed_dim :]
    if not separate:
        if w is None:
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        return (
            F.linear(query, w[:embed_dim], bq),
            F.linear(key, w[embed_dim : 2 * embed_dim], bk),
            F.linear(value, w[2 * embed_dim :], bv),
        )
    for name, t in (("q", q_w), ("k", k_w), ("v", v_w)):
        if t is None:
            raise AssertionError(f"use_separate_proj_weight is True but {name}_proj_weight is None")
    return F.linear(query, q_w, bq), F.linear(key, k_w, bk), F.linear(value, v_w, bv)


def _pad_last(mask: Tensor | None) -> Tensor | None:
    return None if mask is None else _F().pad(mask, (0, 1))


def multi_head_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention of ``(L, N, E)`` queries over ``(S, N, E_k)`` keys and ``(S, N, E_v)``
    values (unbatched ``(L, E)`` too) with the given projections (``torch.nn.functional.multi_head_attention_forward``).

    Returns ``(output, weights)``: ``output`` ``(L, N, E)``; ``weights`` ``(N, L, S)`` averaged over heads
    (``(N, num_heads, L, S)`` with ``average_attn_weights=False``), ``None`` unless ``need_weights``.
    Boolean masks mark the positions that may *not* be attended; float masks are added to the scores.
    ``static_k``/``static_v`` ``(N*num_heads, S, head_dim)`` replace the projected keys/values;
    ``bias_k``/``bias_v`` append one key/value position, ``add_zero_attn`` a zero one.
    """
    F = _F()
    is_batched = mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = canonical_mask(
        key_padding_mask, "key_padding_mask", None if attn_mask is None else attn_mask.dtype, "attn_mask", query.dtype
    )
    if is_causal and attn_mask is None:
        raise RuntimeError(
            "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
            "`generate_square_subsequent_mask` to create this mask."
        )
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the causal mask is applied by scaled_dot_product_attention
    else:
        attn_mask = canonical_mask(attn_mask, "attn_mask", None, "", query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(
                f"key's sequence and batch dims {key.shape[:2]} do not match value's {value.shape[:2]}"
            )
    elif tuple(key.shape) != tuple(value.shape):
        raise AssertionError(f"key shape {key.shape} does not match value shape {value.shape}")
    q, k, v = _project(
        query, key, value, in_proj_weight, in_proj_bias, use_separate_proj_weight,
        q_proj_weight, k_proj_weight, v_proj_weight, embed_dim,
    )  # fmt: skip
    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(
                    f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be {(tgt_len, src_len)}."
                )
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(
                    f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                    f"{(bsz * num_heads, tgt_len, src_len)}."
                )
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")
    if bias_k is not None and bias_v is not None:
        if static_k is not None:
            raise AssertionError("bias cannot be added to static key.")
        if static_v is not None:
            raise AssertionError("bias cannot be added to static value.")
        k = kiln.cat([k, bias_k.repeat(1, bsz, 1)])
        v = kiln.cat([v, bias_v.repeat(1, bsz, 1)])
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    elif bias_k is not None:
        raise AssertionError("bias_k is set but bias_v is None")
    elif bias_v is not None:
        raise AssertionError("bias_v is set but bias_k is None")
    heads = bsz * num_heads
    q = q.reshape(tgt_len, heads, head_dim).transpose(0, 1)
    k = _heads(k, static_k, "static_k", heads, head_dim)
    v = _heads(v, static_v, "static_v", heads, head_dim)
    if add_zero_attn:
        k = kiln.cat([k, kiln.zeros((heads, 1, head_dim), dtype=k.dtype, device=k.device)], dim=1)
        v = kiln.cat([v, kiln.zeros((heads, 1, head_dim), dtype=v.dtype, device=v.device)], dim=1)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    src_len = k.shape[1]
    if key_padding_mask is not None:
        for i, want in enumerate((bsz, src_len)):
            if key_padding_mask.shape[i] != want:
                raise AssertionError(
                    f"Expected key_padded_mask.shape[{i}] to be {want}, but got {key_padding_mask.shape[i]}"
                )
        kpm = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(bsz, num_heads, 1, src_len)
        kpm = kpm.reshape(heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if not training:
        dropout_p = 0.0
    if need_weights:
        scores = (q * math.sqrt(1.0 / float(head_dim))).bmm(k.transpose(-2, -1))
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = F.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = weights.bmm(v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = F.linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
        weights = weights.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            out, weights = out.squeeze(1), weights.squeeze(0)
        return out, weights
    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            attn_mask = attn_mask.reshape(bsz, num_heads, -1, src_len)
    q = q.reshape(bsz, num_heads, tgt_len, head_dim)
    k = k.reshape(bsz, num_heads, src_len, head_dim)
    v = v.reshape(bsz, num_heads, src_len, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = F.linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
    if not is_batched:
        out = out.squeeze(1)
    return out, None


def _heads(x: Tensor, static: Tensor | None, name: str, heads: int, head_dim: int) -> Tensor:
    """Keys or values as ``(N*num_heads, S, head_dim)``, or the ``static`` ones after checking their shape."""
    if static is None:
        return x.reshape(x.shape[0], heads, head_dim).transpose(0, 1)
    if static.shape[0] != heads:
        raise AssertionError(f"expecting {name}.size(0) of {heads}, but got {static.shape[0]}")
    if static.shape[2] != head_dim:
        raise AssertionError(f"expecting {name}.size(2) of {head_dim}, but got {static.shape[2]}")
    return static
