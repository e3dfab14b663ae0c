"""The functions of torch.nn.functional kiln-nn writes in kiln ops against torch: gumbel_softmax,
channel_shuffle, multilabel_margin_loss, triplet_margin_with_distance_loss, relu_, the upsample aliases and
multi_head_attention_forward (values, gradients, gradcheck, warnings, errors, signatures)."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from layer_twins import check_twin, same_error, seeded, to_np  # noqa: F401

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.autograd import gradcheck


def k(t: torch.Tensor, grad: bool = False) -> kiln.Tensor:
    return kiln.tensor(to_np(t), requires_grad=grad)


def grads_match(kout, tout, kin, tin, rtol=1e-7, atol=1e-10):
    g = torch.randn(tout.shape, dtype=tout.dtype)
    (tout * g).sum().backward()
    (kout * k(g)).sum().backward()
    for a, b in zip(kin, tin):
        np.testing.assert_allclose(to_np(a.grad), b.grad.numpy(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------- gumbel_softmax


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_gumbel_softmax_samples_and_straight_through_gradient(dim):
    logits = kiln.randn(4, 5, 3, dtype=kiln.float64, requires_grad=True)
    soft = F.gumbel_softmax(logits, tau=0.5, dim=dim)
    np.testing.assert_allclose(to_np(soft.sum(dim)), 1.0, rtol=1e-12)
    assert (to_np(soft) > 0).all()
    hard = F.gumbel_softmax(logits, hard=True, dim=dim)
    h = to_np(hard)
    assert set(np.unique(h)) <= {0.0, 1.0} and (h.sum(dim) == 1).all()
    # the gradient of the hard sample is the soft sample's (straight-through): not zero
    (hard * kiln.randn(4, 5, 3, dtype=kiln.float64)).sum().backward()
    assert np.abs(to_np(logits.grad)).sum() > 0


def test_gumbel_softmax_is_softmax_of_perturbed_logits_and_follows_the_seed():
    logits = torch.randn(3, 6, dtype=torch.float64)
    kiln.manual_seed(5)
    noise = -kiln.empty(3, 6, dtype=kiln.float64).exponential_().log()
    kiln.manual_seed(5)
    out = F.gumbel_softmax(k(logits), tau=2.0)
    expected = torch.softmax((logits + torch.from_numpy(to_np(noise))) / 2.0, -1)
    np.testing.assert_allclose(to_np(out), expected.numpy(), rtol=1e-12)
    kiln.manual_seed(5)
    hard = F.gumbel_softmax(k(logits), tau=2.0, hard=True)
    assert to_np(hard).argmax(-1).tolist() == expected.argmax(-1).tolist()
    # the distribution: argmax frequencies follow softmax(logits)
    kiln.manual_seed(0)
    lg = kiln.tensor([[1.0, 0.0, -1.0]]).expand(20000, 3)
    freq = to_np(F.gumbel_softmax(lg, hard=True).mean(0))
    np.testing.assert_allclose(freq, torch.softmax(torch.tensor([1.0, 0.0, -1.0]), 0).numpy(), atol=0.02)


def test_gumbel_softmax_eps_warns_like_torch():
    with warnings.catch_warnings(record=True) as kw:
        warnings.simplefilter("always")
        F.gumbel_softmax(kiln.randn(2, 3), eps=1e-5)
    with warnings.catch_warnings(record=True) as tw:
        warnings.simplefilter("always")
        TF.gumbel_softmax(torch.randn(2, 3), eps=1e-5)
    assert [str(w.message) for w in kw] == [str(w.message) for w in tw]


# ---------------------------------------------------------------------------------------- channel shuffle


@pytest.mark.parametrize("name", ["channel_shuffle", "native_channel_shuffle"])
@pytest.mark.parametrize(
    ("shape", "groups"), [((2, 6, 3), 2), ((1, 12, 2, 3), 3), ((2, 4, 1, 2, 2), 4), ((0, 6, 2), 3)]
)
def test_channel_shuffle_matches_torch(name, shape, groups):
    x = torch.randn(*shape, dtype=torch.float64)
    xt, xk = x.clone().requires_grad_(), k(x, True)
    tout, kout = getattr(TF, name)(xt, groups), getattr(F, name)(xk, groups)
    np.testing.assert_array_equal(to_np(kout), tout.detach().numpy())
    if (
        x.numel() and name == "channel_shuffle"
    ):  # torch has no derivative for native_channel_shuffle; kiln's is the same
        grads_match(kout, tout, [xk], [xt])


@pytest.mark.parametrize(("shape", "groups"), [((2, 6), 2), ((2, 6, 3), 4), ((2, 6, 3), 0), ((2, 6, 3), -2)])
def test_channel_shuffle_errors_match_torch(shape, groups):
    same_error(
        lambda: F.channel_shuffle(kiln.randn(*shape), groups), lambda: TF.channel_shuffle(torch.randn(*shape), groups)
    )
    same_error(
        lambda: nn.ChannelShuffle(groups)(kiln.randn(*shape)),
        lambda: torch.nn.ChannelShuffle(groups)(torch.randn(*shape)),
    )


# ---------------------------------------------------------------------------------------- losses

MLM_TARGETS = [
    [[3, 0, -1, 1], [0, 1, 2, 3], [1, -1, 2, 2]],
    [[-1, 0, 1, 2], [2, 2, 2, -1], [0, 3, -1, -1]],
]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target", MLM_TARGETS)
def test_multilabel_margin_loss_matches_torch(target, reduction):
    x = torch.randn(3, 4, dtype=torch.float64)
    y = torch.tensor(target)
    xt, xk = x.clone().requires_grad_(), k(x, True)
    tout = TF.multilabel_margin_loss(xt, y, reduction=reduction)
    kout = F.multilabel_margin_loss(xk, k(y), reduction=reduction)
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-12)
    assert tuple(kout.shape) == tuple(tout.shape)
    grads_match(kout, tout, [xk], [xt])
    assert gradcheck(lambda a: F.multilabel_margin_loss(a, k(y), reduction=reduction), (k(x, True),))
    # unbatched, the module, the legacy flags
    for i in range(3):
        np.testing.assert_allclose(
            to_np(F.multilabel_margin_loss(k(x[i]), k(y[i]), reduction=reduction)),
            TF.multilabel_margin_loss(x[i], y[i], reduction=reduction).numpy(),
        )
    check_twin(
        nn.MultiLabelMarginLoss(reduction=reduction), torch.nn.MultiLabelMarginLoss(reduction=reduction), x.float(), y
    )


def test_multilabel_margin_loss_edge_cases_match_torch():
    x, y = torch.randn(3, 4), torch.tensor(MLM_TARGETS[0])
    for kw in ({"size_average": False}, {"reduce": False}, {"size_average": True, "reduce": True}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_allclose(
                to_np(F.multilabel_margin_loss(k(x), k(y), **kw)),
                TF.multilabel_margin_loss(x, y, **kw).numpy(),
                rtol=1e-6,
            )
    for red in ("mean", "sum", "none"):
        xs, ys = torch.randn(()), torch.zeros((), dtype=torch.long)
        np.testing.assert_allclose(
            to_np(F.multilabel_margin_loss(k(xs), k(ys), reduction=red)),
            TF.multilabel_margin_loss(xs, ys, reduction=red).numpy(),
        )
        # an empty batch: torch's kernel leaves a reduced result unwritten (its value is whatever memory held);
        # kiln's is the sum of no losses, 0
        xs, ys = torch.randn(0, 4), torch.zeros(0, 4, dtype=torch.long)
        out = F.multilabel_margin_loss(k(xs), k(ys), reduction=red)
        assert tuple(out.shape) == tuple(TF.multilabel_margin_loss(xs, ys, reduction=red).shape)
        assert not to_np(out).any()
    # margins exactly 0 get no gradient, as torch's kernel (z > 0)
    xz = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64, requires_grad=True)
    yz = torch.tensor([[0, -1, -1]])
    xk = k(xz, True)
    grads_match(F.multilabel_margin_loss(xk, k(yz)), TF.multilabel_margin_loss(xz, yz), [xk], [xz])


MLM_ERRORS = [
    ((3, 4), lambda y: y, {"reduction": "bad"}),
    ((3, 4), lambda y: y.int(), {}),
    ((3, 4), lambda y: y.float(), {}),
    ((3, 4), lambda y: y[:, :3], {}),
    ((3, 4), lambda y: y[:2], {}),
    ((3, 4), lambda y: y + 2, {}),
    ((3, 4), lambda y: y - 2, {}),
    ((1,), lambda y: y[0, :1] + 3, {}),
    ((4,), lambda y: y[0, :2], {}),
    ((1, 3, 4), lambda y: y[None], {}),
    ((3, 0), lambda y: y[:, :0], {}),
    ((0,), lambda y: y[0, :0], {}),
]


@pytest.mark.parametrize(("xs", "target", "kwargs"), MLM_ERRORS)
def test_multilabel_margin_loss_errors_match_torch(xs, target, kwargs):
    x, y = torch.randn(*xs), target(torch.tensor(MLM_TARGETS[0]))
    ky = kiln.tensor(y.numpy())
    same_error(lambda: F.multilabel_margin_loss(k(x), ky, **kwargs), lambda: TF.multilabel_margin_loss(x, y, **kwargs))


@pytest.mark.parametrize("dtype", ["int64", "float16", "bfloat16"])
def test_multilabel_margin_loss_dtype_errors_match_torch(dtype):
    y = torch.tensor(MLM_TARGETS[0])
    same_error(
        lambda: F.multilabel_margin_loss(kiln.ones(3, 4, dtype=getattr(kiln, dtype)), k(y)),
        lambda: TF.multilabel_margin_loss(torch.ones(3, 4, dtype=getattr(torch, dtype)), y),
        NotImplementedError,
    )


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("distance", [None, "cosine", "l1"])
def test_triplet_margin_with_distance_loss_matches_torch(distance, reduction, swap):
    def dist(lib):
        if distance == "cosine":
            return lambda a, b: 1.0 - lib.cosine_similarity(a, b)
        if distance == "l1":
            return lambda a, b: (a - b).abs().sum(-1)
        return None

    a, p, n = (torch.randn(5, 4, dtype=torch.float64) for _ in range(3))
    tin = [t.clone().requires_grad_() for t in (a, p, n)]
    kin = [k(t, True) for t in (a, p, n)]
    kw = {"margin": 0.7, "swap": swap, "reduction": reduction}
    tout = TF.triplet_margin_with_distance_loss(*tin, distance_function=dist(TF), **kw)
    kout = F.triplet_margin_with_distance_loss(*kin, distance_function=dist(F), **kw)
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-10)
    grads_match(kout, tout, kin, tin)
    check_twin(
        nn.TripletMarginWithDistanceLoss(distance_function=dist(F), **kw),
        torch.nn.TripletMarginWithDistanceLoss(distance_function=dist(TF), **kw),
        a.float(),
        p.float(),
        n.float(),
    )


@pytest.mark.parametrize(
    ("shapes", "kwargs"),
    [
        (((3, 4), (3, 4), (3, 4)), {"margin": 0}),
        (((3, 4), (3, 4), (3, 4)), {"reduction": "max"}),
        (((3, 4), (4,), (3, 4)), {}),
    ],
)
def test_triplet_margin_with_distance_loss_errors_match_torch(shapes, kwargs):
    ts = [torch.randn(*s) for s in shapes]
    same_error(
        lambda: F.triplet_margin_with_distance_loss(*[k(t) for t in ts], **kwargs),
        lambda: TF.triplet_margin_with_distance_loss(*ts, **kwargs),
    )


# ---------------------------------------------------------------------------------------- relu_ and upsample


def test_relu_inplace_matches_torch():
    x = torch.randn(3, 4)
    xk = k(x)
    out = F.relu_(xk)
    assert out is xk
    np.testing.assert_array_equal(to_np(xk), TF.relu_(x.clone()).numpy())
    leaf = kiln.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        F.relu_(leaf)


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "shape"),
    [
        ("upsample", (), {"scale_factor": 2}, (1, 2, 3, 3)),
        ("upsample", (), {"size": (5, 7), "mode": "bilinear", "align_corners": False}, (1, 2, 3, 4)),
        ("upsample", ((4, 5, 6),), {"mode": "trilinear"}, (1, 1, 2, 3, 2)),
        ("upsample_nearest", (), {"scale_factor": 3}, (2, 3, 4)),
        ("upsample_nearest", ((5, 6),), {}, (1, 2, 3, 3)),
        ("upsample_bilinear", (), {"scale_factor": 2}, (1, 2, 3, 4)),
        ("upsample_bilinear", ((5, 3),), {}, (1, 2, 3, 4)),
    ],
)
def test_upsample_aliases_warn_and_match_torch(name, args, kwargs, shape):
    x = torch.randn(*shape, dtype=torch.float64)
    xt, xk = x.clone().requires_grad_(), k(x, True)
    with warnings.catch_warnings(record=True) as tw:
        warnings.simplefilter("always")
        tout = getattr(TF, name)(xt, *args, **kwargs)
    with warnings.catch_warnings(record=True) as kw:
        warnings.simplefilter("always")
        kout = getattr(F, name)(xk, *args, **kwargs)
    assert [str(w.message) for w in kw] == [str(w.message) for w in tw] and len(kw) == 1
    assert kw[0].filename == __file__  # the warning points at the caller
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-12)
    grads_match(kout, tout, [xk], [xt])


# ---------------------------------------------------------------------------------------- multi_head_attention_forward


def _mha_params(e: int, kdim: int, vdim: int, bias_kv: bool):
    g = torch.Generator().manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64) * 0.3

    return {
        "in_proj_weight": r(3 * e, e),
        "in_proj_bias": r(3 * e),
        "bias_k": r(1, 1, e) if bias_kv else None,
        "bias_v": r(1, 1, e) if bias_kv else None,
        "out_proj_weight": r(e, e),
        "out_proj_bias": r(e),
        "q_proj_weight": r(e, e),
        "k_proj_weight": r(e, kdim),
        "v_proj_weight": r(e, vdim),
    }


MHA_CASES = [
    ({}, (5, 2, 8), (6, 2, 8), {}),
    ({"bias_kv": True, "add_zero_attn": True}, (5, 2, 8), (6, 2, 8), {"need_weights": False}),
    ({"separate": True, "kdim": 3, "vdim": 5}, (4, 3, 8), (6, 3, 0), {"average_attn_weights": False}),
    ({}, (5, 8), (6, 8), {"key_padding_mask": "bool1", "attn_mask": "float2"}),
    ({}, (5, 2, 8), (6, 2, 8), {"key_padding_mask": "bool", "attn_mask": "bool3", "need_weights": False}),
    ({"add_zero_attn": True}, (5, 2, 8), (6, 2, 8), {"attn_mask": "causal", "is_causal": True, "need_weights": False}),
    ({"static": True}, (5, 2, 8), (6, 2, 8), {}),
]


def _mask(kind, tgt, src, bsz, heads):
    g = torch.Generator().manual_seed(2)
    if kind == "bool":
        m = torch.rand(bsz, src, generator=g) > 0.7
        m[:, 0] = False
        return m
    if kind == "bool1":
        m = torch.rand(src, generator=g) > 0.7
        m[0] = False
        return m
    if kind == "float2":
        return torch.randn(tgt, src, generator=g, dtype=torch.float64)
    if kind == "bool3":
        m = torch.rand(bsz * heads, tgt, src, generator=g) > 0.8
        m[..., 0] = False
        return m
    if kind == "causal":
        return torch.triu(torch.full((tgt, src), float("-inf"), dtype=torch.float64), 1)
    return None


@pytest.mark.parametrize(("opts", "qshape", "kvshape", "kwargs"), MHA_CASES)
def test_multi_head_attention_forward_matches_torch(opts, qshape, kvshape, kwargs):
    heads, e = 2, 8
    kdim, vdim = opts.get("kdim", e), opts.get("vdim", e)
    p = _mha_params(e, kdim, vdim, opts.get("bias_kv", False))
    batched = len(qshape) == 3
    bsz = qshape[1] if batched else 1
    q = torch.randn(*qshape, dtype=torch.float64)
    kv_lead = kvshape[:-1] if batched else kvshape[:1]
    key = torch.randn(*kv_lead, kdim, dtype=torch.float64)
    value = torch.randn(*kv_lead, vdim, dtype=torch.float64)
    tgt, src = qshape[0], kvshape[0]
    kw = dict(kwargs)
    for name in ("key_padding_mask", "attn_mask"):
        if name in kw:
            kw[name] = _mask(kw[name], tgt, src, bsz, heads)
    if opts.get("static"):
        kw["static_k"] = torch.randn(bsz * heads, src, e // heads, dtype=torch.float64)
        kw["static_v"] = torch.randn(bsz * heads, src, e // heads, dtype=torch.float64)
    tensors = {"query": q, "key": key, "value": value, **{n: v for n, v in p.items() if v is not None}}
    tt = {n: v.clone().requires_grad_() for n, v in tensors.items()}
    kt = {n: k(v, True) for n, v in tensors.items()}
    sep = opts.get("separate", False)

    def call(lib, t, extra):
        return lib.multi_head_attention_forward(
            t["query"], t["key"], t["value"], e, heads, None if sep else t["in_proj_weight"], t["in_proj_bias"],
            t.get("bias_k"), t.get("bias_v"), opts.get("add_zero_attn", False), 0.0, t["out_proj_weight"],
            t["out_proj_bias"], use_separate_proj_weight=sep, q_proj_weight=t["q_proj_weight"] if sep else None,
            k_proj_weight=t["k_proj_weight"] if sep else None, v_proj_weight=t["v_proj_weight"] if sep else None,
            **extra,
        )  # fmt: skip

    tout, tw = call(TF, tt, kw)
    kout, kwts = call(F, kt, {n: (k(v) if isinstance(v, torch.Tensor) else v) for n, v in kw.items()})
    np.testing.assert_allclose(to_np(kout), tout.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert (kwts is None) == (tw is None)
    if tw is not None:
        np.testing.assert_allclose(to_np(kwts), tw.detach().numpy(), rtol=1e-9, atol=1e-12)
    g = torch.randn(tout.shape, dtype=torch.float64)
    (tout * g).sum().backward()
    (kout * k(g)).sum().backward()
    for n in tt:
        if tt[n].grad is None:
            assert kt[n].grad is None or not to_np(kt[n].grad).any(), n
        else:
            np.testing.assert_allclose(to_np(kt[n].grad), tt[n].grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=n)


def test_multi_head_attention_forward_gradcheck_and_dropout():
    e, heads = 4, 2
    p = {n: k(v, True) for n, v in _mha_params(e, e, e, False).items() if v is not None}
    q = kiln.randn(3, 2, e, dtype=kiln.float64, requires_grad=True)
    args = (p["in_proj_weight"], p["in_proj_bias"], None, None, False, 0.0, p["out_proj_weight"], p["out_proj_bias"])
    assert gradcheck(
        lambda x, w: F.multi_head_attention_forward(x, x, x, e, heads, w, *args[1:])[0], (q, p["in_proj_weight"])
    )
    # dropout acts only in training
    a = F.multi_head_attention_forward(q, q, q, e, heads, *args[:5], 0.9, *args[6:], training=False)[0]
    b = F.multi_head_attention_forward(q, q, q, e, heads, *args[:5], 0.0, *args[6:])[0]
    np.testing.assert_array_equal(to_np(a), to_np(b))
    c = F.multi_head_attention_forward(q, q, q, e, heads, *args[:5], 0.9, *args[6:], training=True)[0]
    assert not np.allclose(to_np(c), to_np(b))


MHA_ERRORS = [
    ({"query": (5, 2, 6)}, {}),
    ({"key": (6, 8), "value": (6, 8)}, {}),
    ({"query": (2, 5, 2, 8)}, {}),
    ({"key": (6, 2, 8), "value": (7, 2, 8)}, {}),
    ({}, {"key_padding_mask": (2, 7)}),
    ({}, {"key_padding_mask": (2, 6, 1)}),
    ({}, {"attn_mask": (5, 7)}),
    ({}, {"attn_mask": (3, 5, 6)}),
    ({}, {"attn_mask": (1, 1, 5, 6)}),
    ({}, {"attn_mask_int": (5, 6)}),
    ({}, {"is_causal": True}),
    ({}, {"static_k": (3, 6, 4)}),
    ({}, {"static_k": (4, 6, 3)}),
    ({}, {"static_v": (4, 6, 5)}),
    ({}, {"heads": 3}),
]


@pytest.mark.parametrize(("shapes", "extra"), MHA_ERRORS)
def test_multi_head_attention_forward_errors_match_torch(shapes, extra):
    e = 8
    heads = extra.pop("heads", 2)
    p = _mha_params(e, e, e, False)
    q = torch.randn(*shapes.get("query", (5, 2, 8)))
    key = torch.randn(*shapes.get("key", (6, 2, 8)))
    value = torch.randn(*shapes.get("value", (6, 2, 8)))
    kw = {}
    for name, shape in extra.items():
        if name == "is_causal":
            kw[name] = shape
        elif name == "attn_mask_int":
            kw["attn_mask"] = torch.zeros(*shape, dtype=torch.int64)
        elif name == "key_padding_mask":
            kw[name] = torch.zeros(*shape, dtype=torch.bool)
        else:
            kw[name] = torch.randn(*shape)

    def call(lib, conv, mk):
        return lib.multi_head_attention_forward(
            conv(q), conv(key), conv(value), e, heads, conv(p["in_proj_weight"].float()), conv(p["in_proj_bias"].float()),
            None, None, False, 0.0, conv(p["out_proj_weight"].float()), conv(p["out_proj_bias"].float()),
            **{n: mk(v) for n, v in kw.items()},
        )  # fmt: skip

    same_error(
        lambda: call(F, k, lambda v: k(v) if isinstance(v, torch.Tensor) else v),
        lambda: call(TF, lambda t: t, lambda v: v),
    )


def test_multihead_attention_module_delegates_to_the_function():
    m = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, batch_first=True)
    tm = torch.nn.MultiheadAttention(8, 2, kdim=3, vdim=5, batch_first=True)
    check_twin(m, tm, torch.randn(2, 4, 8), torch.randn(2, 6, 3), torch.randn(2, 6, 5), structure=False)
    import kiln.nn.modules.activation as act

    assert act.MultiheadAttention is nn.MultiheadAttention


NEW_FUNCTIONS = [
    "gumbel_softmax", "channel_shuffle", "native_channel_shuffle", "multilabel_margin_loss",
    "triplet_margin_with_distance_loss", "relu_", "upsample", "upsample_nearest", "upsample_bilinear",
    "multi_head_attention_forward", "affine_grid", "grid_sample",
]  # fmt: skip


@pytest.mark.parametrize("name", NEW_FUNCTIONS)
def test_signatures_match_torch(name):
    kfn, tfn = getattr(F, name), getattr(TF, name)
    assert kfn.__doc__ and name in F.__all__
    kparams = [(p.name, p.kind, p.default) for p in inspect.signature(kfn).parameters.values()]
    try:
        tparams = [(p.name, p.kind, p.default) for p in inspect.signature(tfn).parameters.values()]
    except ValueError:  # a C++ builtin: its docstring's first line
        text = tfn.__doc__.strip().splitlines()[0]
        assert text.startswith(f"{name}(" + ", ".join(n for n, _, _ in kparams) + ")")
        return
    assert kparams == tparams
