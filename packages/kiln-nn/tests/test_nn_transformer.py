"""MultiheadAttention and the Transformer layers against torch: structure, masks, outputs, gradients, init."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


def _bool_mask(*shape, p=0.3):
    m = torch.rand(*shape) < p
    m[..., 0] = False  # keep one position unmasked per row so no softmax row is all -inf
    return m


MHA_CASES = [
    ({}, (4, 2, 8), (5, 2, 8), {}),
    ({"batch_first": True}, (2, 4, 8), (2, 5, 8), {"key_padding_mask": _bool_mask(2, 5)}),
    ({}, (4, 2, 8), (5, 2, 8), {"attn_mask": _bool_mask(4, 5), "average_attn_weights": False}),
    ({}, (4, 2, 8), (5, 2, 8), {"attn_mask": torch.randn(4, 5), "key_padding_mask": _bool_mask(2, 5)}),
    ({}, (4, 2, 8), (5, 2, 8), {"attn_mask": _bool_mask(4, 4, 5)}),
    ({"bias": False}, (4, 2, 8), (5, 2, 8), {"need_weights": False}),
    ({"kdim": 3, "vdim": 5}, (4, 2, 8), None, {}),
    ({"add_bias_kv": True, "add_zero_attn": True}, (4, 2, 8), (5, 2, 8), {"key_padding_mask": _bool_mask(2, 5)}),
    ({"add_bias_kv": True}, (4, 2, 8), (5, 2, 8), {"attn_mask": _bool_mask(4, 5)}),
    ({}, (4, 8), (5, 8), {"key_padding_mask": _bool_mask(5)}),
]


@pytest.mark.parametrize(("kwargs", "qshape", "kvshape", "fkw"), MHA_CASES)
def test_multihead_attention_matches_torch(kwargs, qshape, kvshape, fkw):
    k, t = nn.MultiheadAttention(8, 2, **kwargs), torch.nn.MultiheadAttention(8, 2, **kwargs)
    k.eval()
    t.eval()
    q = torch.randn(*qshape)
    if kvshape is None:
        key, value = torch.randn(5, 2, 3), torch.randn(5, 2, 5)
    else:
        key, value = torch.randn(*kvshape), torch.randn(*kvshape)
    check_twin(k, t, q, key, value, kwargs=fkw)


def test_self_attention_with_causal_mask_and_is_causal_hint():
    k, t = nn.MultiheadAttention(8, 4, batch_first=True), torch.nn.MultiheadAttention(8, 4, batch_first=True)
    x = torch.randn(2, 5, 8)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    check_twin(k, t, x, x, x, kwargs={"attn_mask": mask, "is_causal": True, "need_weights": False})
    same_error(
        lambda: k(kiln.randn(2, 5, 8), kiln.randn(2, 5, 8), kiln.randn(2, 5, 8), is_causal=True),
        lambda: t(x, x, x, is_causal=True),
        RuntimeError,
    )


def test_generate_square_subsequent_mask():
    km = nn.Transformer.generate_square_subsequent_mask(4)
    tm = torch.nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(to_np(km), tm.numpy())
    assert km.dtype == kiln.float32


def test_multihead_attention_init_and_names():
    m = nn.MultiheadAttention(64, 4)
    assert [n for n, _ in m.named_parameters()] == [
        "in_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    ]
    bound = math.sqrt(6 / (64 + 3 * 64))  # xavier_uniform on (3E, E)
    w = to_np(m.in_proj_weight)
    assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.05 * bound
    assert not to_np(m.in_proj_bias).any() and not to_np(m.out_proj.bias).any()
    assert np.abs(to_np(m.out_proj.weight)).max() <= 1 / math.sqrt(64)
    s = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True)
    assert [n for n, _ in s.named_parameters()][:3] == ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
    assert s.in_proj_weight is None and tuple(s.bias_k.shape) == (1, 1, 8)


def test_multihead_attention_errors_match_torch():
    same_error(lambda: nn.MultiheadAttention(8, 3), lambda: torch.nn.MultiheadAttention(8, 3), AssertionError)
    same_error(lambda: nn.MultiheadAttention(0, 3), lambda: torch.nn.MultiheadAttention(0, 3), ValueError)
    k, t = nn.MultiheadAttention(8, 2), torch.nn.MultiheadAttention(8, 2)
    for shapes in [((2, 2, 2, 8), (2, 2, 8), (2, 2, 8)), ((2, 2, 6),) * 3, ((2, 2, 8), (2, 8), (2, 8))]:
        same_error(
            lambda s=shapes: k(*[kiln.randn(*x) for x in s]),
            lambda s=shapes: t(*[torch.randn(*x) for x in s]),
            AssertionError,
        )
    same_error(
        lambda: k(kiln.randn(4, 2, 8), kiln.randn(5, 2, 8), kiln.randn(5, 2, 8), attn_mask=kiln.zeros(4, 4)),
        lambda: t(torch.randn(4, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8), attn_mask=torch.zeros(4, 4)),
        RuntimeError,
    )


LAYER_CASES = [
    ("TransformerEncoderLayer", {}, "enc"),
    ("TransformerEncoderLayer", {"batch_first": True, "norm_first": True, "activation": "gelu"}, "enc"),
    ("TransformerEncoderLayer", {"activation": torch.nn.functional.silu, "bias": False}, "enc"),
    ("TransformerDecoderLayer", {}, "dec"),
    ("TransformerDecoderLayer", {"batch_first": True, "norm_first": True, "activation": "gelu"}, "dec"),
]


def _kiln_activation(kwargs):
    out = dict(kwargs)
    if out.get("activation") is torch.nn.functional.silu:
        out["activation"] = kiln.nn.functional.silu
    return out


@pytest.mark.parametrize(("name", "kwargs", "kind"), LAYER_CASES)
def test_transformer_layers_match_torch(name, kwargs, kind):
    k = getattr(nn, name)(8, 2, 16, dropout=0.1, **_kiln_activation(kwargs))
    t = getattr(torch.nn, name)(8, 2, 16, dropout=0.1, **kwargs)
    k.eval()
    t.eval()
    bf = kwargs.get("batch_first", False)
    src = torch.randn(2, 5, 8) if bf else torch.randn(5, 2, 8)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    pad = _bool_mask(2, 5)
    if kind == "enc":
        check_twin(k, t, src, kwargs={"src_mask": mask, "src_key_padding_mask": pad})
    else:
        mem = torch.randn(2, 6, 8) if bf else torch.randn(6, 2, 8)
        check_twin(k, t, src, mem, kwargs={"tgt_mask": mask, "memory_key_padding_mask": _bool_mask(2, 6)})


def test_transformer_encoder_decoder_stacks_match_torch():
    kl, tl = nn.TransformerEncoderLayer(8, 2, 16), torch.nn.TransformerEncoderLayer(8, 2, 16)
    k = nn.TransformerEncoder(kl, 2, norm=nn.LayerNorm(8))
    t = torch.nn.TransformerEncoder(tl, 2, norm=torch.nn.LayerNorm(8))
    k.eval()
    t.eval()
    check_twin(k, t, torch.randn(5, 2, 8), kwargs={"mask": torch.nn.Transformer.generate_square_subsequent_mask(5)})
    kd = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 2)
    td = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 2)
    kd.eval()
    td.eval()
    check_twin(kd, td, torch.randn(2, 4, 8), torch.randn(2, 5, 8))


@pytest.mark.parametrize("norm_first", [False, True])
def test_full_transformer_matches_torch(norm_first):
    kw = {"d_model": 8, "nhead": 2, "num_encoder_layers": 2, "num_decoder_layers": 1, "dim_feedforward": 12}
    k, t = nn.Transformer(**kw, norm_first=norm_first), torch.nn.Transformer(**kw, norm_first=norm_first)
    k.eval()
    t.eval()
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(4)
    check_twin(k, t, torch.randn(5, 2, 8), torch.randn(4, 2, 8), kwargs={"tgt_mask": tgt_mask})
    same_error(
        lambda: k(kiln.randn(5, 2, 8), kiln.randn(4, 3, 8)),
        lambda: t(torch.randn(5, 2, 8), torch.randn(4, 3, 8)),
        RuntimeError,
    )
    same_error(
        lambda: k(kiln.randn(5, 2, 6), kiln.randn(4, 2, 6)),
        lambda: t(torch.randn(5, 2, 6), torch.randn(4, 2, 6)),
        RuntimeError,
    )


def test_transformer_init_is_xavier_and_errors():
    m = nn.Transformer(32, 4, 1, 1, 64)
    w = to_np(m.encoder.layers[0].linear1.weight)  # (64, 32)
    bound = math.sqrt(6 / (32 + 64))
    assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
    same_error(
        lambda: nn.TransformerEncoderLayer(8, 2, activation="tanh"),
        lambda: torch.nn.TransformerEncoderLayer(8, 2, activation="tanh"),
        RuntimeError,
    )


def test_transformer_dropout_active_in_training():
    m = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5)
    x = kiln.randn(5, 2, 8)
    m.eval()
    np.testing.assert_array_equal(to_np(m(x)), to_np(m(x)))
    m.train()
    assert not np.allclose(to_np(m(x)), to_np(m(x)))


def test_module_activation_is_registered_like_torch():
    k = nn.TransformerEncoderLayer(8, 2, 16, activation=nn.GELU())
    t = torch.nn.TransformerEncoderLayer(8, 2, 16, activation=torch.nn.GELU())
    k.eval()
    t.eval()
    check_twin(k, t, torch.randn(5, 2, 8))
    assert k.activation_relu_or_gelu == t.activation_relu_or_gelu == 2


def test_attention_and_recurrent_gradcheck_float64():
    """The composed layers are differentiable twice over in float64 (finite differences)."""
    from kiln.autograd import gradcheck, gradgradcheck

    m = nn.MultiheadAttention(4, 2).double()
    q = kiln.randn(3, 1, 4, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda q: m(q, q, q)[0], (q,))
    cell = nn.LSTMCell(3, 4).double()
    x = kiln.randn(1, 3, dtype=kiln.float64, requires_grad=True)
    assert gradgradcheck(lambda x: cell(x)[1], (x,))
    gru = nn.GRU(2, 3, bidirectional=True).double()
    s = kiln.randn(3, 1, 2, dtype=kiln.float64, requires_grad=True)
    assert gradcheck(lambda s: gru(s)[0], (s,))
