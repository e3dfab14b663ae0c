"""``MultiheadAttention`` (``torch.nn.MultiheadAttention``), written with kiln matmuls and softmax."""

from __future__ import annotations

import math

import kiln
from kiln import Tensor, empty, zeros
from kiln.nn import functional as F
from kiln.nn.init import constant_, xavier_normal_, xavier_uniform_
from kiln.nn.modules.linear import Linear
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter

__all__ = ["MultiheadAttention", "NonDynamicallyQuantizableLinear"]


class NonDynamicallyQuantizableLinear(Linear):
    """A :class:`Linear` under the name torch gives ``MultiheadAttention.out_proj`` (so reprs match)."""


def _canonical_mask(mask: Tensor | None, mask_name: str, target_dtype) -> Tensor | None:
    """A boolean mask (True = masked) as an additive float mask (``-inf`` where masked); floats pass through."""
    if mask is None:
        return None
    if mask.dtype == kiln.bool:
        return zeros(mask.shape, dtype=target_dtype, device=mask.device).masked_fill(mask, float("-inf"))
    if not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    return mask


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """torch's ``_mha_shape_check``: whether the input is batched, with torch's messages on mismatch."""
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
            f"{which} `key_padding_mask` to be `None` or {rank - 1}-D"
            f" but found {key_padding_mask.dim()}-D tensor instead"
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


class MultiheadAttention(Module):
    """Scaled dot-product attention over ``num_heads`` heads (``torch.nn.MultiheadAttention``).

    ``in_proj_weight`` ``(3*embed_dim, embed_dim)`` (or ``q/k/v_proj_weight`` when ``kdim``/``vdim`` differ),
    ``in_proj_bias``, ``out_proj``, and ``bias_k``/``bias_v`` with ``add_bias_kv``. ``forward`` returns
    ``(output, weights)``; weights are averaged over heads unless ``average_attn_weights=False`` and are
    ``None`` when ``need_weights=False``. Boolean masks mark positions that may *not* be attended.
    """

    __constants__ = ["batch_first"]

    def __init__(
        self,
        embed_dim,
        num_heads,
        dropout=0.0,
        bias=True,
        add_bias_kv=False,
        add_zero_attn=False,
        kdim=None,
        vdim=None,
        batch_first=False,
        device=None,
        dtype=None,
    ) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"embed_dim and num_heads must be greater than 0,"
                f" got embed_dim={embed_dim} and num_heads={num_heads} instead"
            )
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != self.embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty((embed_dim, embed_dim), **fk))
            self.k_proj_weight = Parameter(empty((embed_dim, self.kdim), **fk))
            self.v_proj_weight = Parameter(empty((embed_dim, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty((3 * embed_dim, embed_dim), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = Parameter(empty((1, 1, embed_dim), **fk))
            self.bias_v = Parameter(empty((1, 1, embed_dim), **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            xavier_uniform_(self.in_proj_weight)
        else:
            xavier_uniform_(self.q_proj_weight)
            xavier_uniform_(self.k_proj_weight)
            xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            constant_(self.in_proj_bias, 0.0)
            constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            xavier_normal_(self.bias_v)

    def _project(self, query, key, value):
        e = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:e], w[e : 2 * e], w[2 * e :]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """``(attn_output, attn_weights)`` for ``(L, N, E)`` queries (``(N, L, E)`` with ``batch_first``)."""
        is_batched = _shape_check(query, key, value, key_padding_mask, attn_mask, self.num_heads)
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
                "`generate_square_subsequent_mask` to create this mask."
            )
        if self.batch_first and is_batched:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, embed_dim = query.shape
        src_len = key.shape[0]
        if embed_dim != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got {embed_dim}")
        if key.shape[:2] != value.shape[:2]:
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}")
        key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask", query.dtype)
        attn_mask = _canonical_mask(attn_mask, "attn_mask", query.dtype)
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                if tuple(attn_mask.shape) != (tgt_len, src_len):
                    raise RuntimeError(
                        f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be {(tgt_len, src_len)}."
                    )
                attn_mask = attn_mask.unsqueeze(0)
            elif tuple(attn_mask.shape) != (bsz * self.num_heads, tgt_len, src_len):
                raise RuntimeError(
                    f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                    f"{(bsz * self.num_heads, tgt_len, src_len)}."
                )

        q, k, v = self._project(query, key, value)
        if self.bias_k is not None and self.bias_v is not None:
            k = kiln.cat([k, self.bias_k.expand(1, bsz, embed_dim)])
            v = kiln.cat([v, self.bias_v.expand(1, bsz, embed_dim)])
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))

        h, hd = self.num_heads, self.head_dim
        q = q.reshape(tgt_len, bsz * h, hd).transpose(0, 1)
        k = k.reshape(k.shape[0], bsz * h, hd).transpose(0, 1)
        v = v.reshape(v.shape[0], bsz * h, hd).transpose(0, 1)
        if self.add_zero_attn:
            k = kiln.cat([k, zeros((bsz * h, 1, hd), dtype=k.dtype, device=k.device)], 1)
            v = kiln.cat([v, zeros((bsz * h, 1, hd), dtype=v.dtype, device=v.device)], 1)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))
            if key_padding_mask is not None:
                key_padding_mask = F.pad(key_padding_mask, (0, 1))
        src_len = k.shape[1]
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (bsz, src_len):
                raise AssertionError(
                    f"expecting key_padding_mask shape of {(bsz, src_len)}, but got {key_padding_mask.shape}"
                )
            kpm = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(bsz, h, 1, src_len).reshape(bsz * h, 1, src_len)
            attn_mask = kpm if attn_mask is None else attn_mask + kpm

        scores = (q * (1.0 / math.sqrt(hd))).matmul(k.transpose(-2, -1))
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = F.softmax(scores, dim=-1)
        if self.dropout > 0.0 and self.training:
            weights = F.dropout(weights, p=self.dropout)
        out = weights.matmul(v)  # (bsz*h, tgt, hd)
        out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = self.out_proj(out).reshape(tgt_len, bsz, embed_dim)
        if self.batch_first and is_batched:
            out = out.transpose(0, 1)
        if not is_batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        weights = weights.reshape(bsz, h, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not is_batched:
            weights = weights.squeeze(0)
        return out, weights
