"""Autocast against PyTorch's: the same calls under ``kiln.autocast("cpu")`` and ``torch.autocast("cpu")``
give the same output dtype and, within bfloat16's precision, the same values, for every op category.

PyTorch keeps two policy lists, one for its CPU and one for its CUDA kernels; kiln keeps one policy per op
on the op record and keys the range-sensitive part to the dtype instead of the device (see
``kiln.backend.AUTOCAST_POLICIES``): exp, log, softmax, sums and norms run in float32 under float16 (as
PyTorch's CUDA list has them) and as given under bfloat16 (as its CPU list has them). The CPU oracle
therefore checks every op under bfloat16; the float16 rules are checked against the policy table itself.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import kiln
import kiln.backend as kb

_DATA: dict[tuple, np.ndarray] = {}


def data(shape: tuple, low: float = 0.5, high: float = 1.5) -> np.ndarray:
    """Fixed random float32 values for ``shape`` (the same array in both frameworks), drawn from a generator
    seeded by the arguments: the same values whichever tests ran before in the process (under pytest-xdist,
    a worker's earlier tests drew first, and a bfloat16 batch norm of two close values came out apart)."""
    key = (shape, low, high)
    if key not in _DATA:
        seed = zlib.crc32(repr(key).encode())
        _DATA[key] = np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)
    return _DATA[key]


class Maker:
    """Builds a framework's tensors of one floating dtype (or per-argument dtypes)."""

    def __init__(self, lib, dtype):
        self.lib, self.dtype = lib, dtype

    def __call__(self, *shape, low=0.5, high=1.5, dtype=None):
        t = self.lib.tensor(data(shape, low, high))
        return t.to(dtype or self.dtype)

    def index(self, values):
        return self.lib.tensor(values)


def _f(lib):
    return lib.nn.functional


CASES = {
    # matrix products and convolutions: "lower"
    "mm": lambda L, t: L.mm(t(3, 4), t(4, 5)),
    "matmul": lambda L, t: L.matmul(t(3, 4), t(4, 5)),
    "matmul-operator": lambda L, t: t(2, 3, 4) @ t(4, 5),
    "bmm": lambda L, t: L.bmm(t(2, 3, 4), t(2, 4, 5)),
    "addmm": lambda L, t: L.addmm(t(3, 5), t(3, 4), t(4, 5)),
    "baddbmm": lambda L, t: L.baddbmm(t(2, 3, 5), t(2, 3, 4), t(2, 4, 5)),
    "einsum": lambda L, t: L.einsum("ij,jk->ik", t(3, 4), t(4, 5)),
    "linear": lambda L, t: _f(L).linear(t(3, 4), t(5, 4), t(5)),
    "linear-nobias": lambda L, t: _f(L).linear(t(3, 4), t(5, 4)),
    "conv1d": lambda L, t: _f(L).conv1d(t(1, 2, 5), t(3, 2, 3)),
    "conv2d": lambda L, t: _f(L).conv2d(t(1, 2, 5, 5), t(3, 2, 3, 3), t(3), padding=1),
    "conv_transpose2d": lambda L, t: _f(L).conv_transpose2d(t(1, 2, 4, 4), t(2, 3, 3, 3)),
    "prelu": lambda L, t: _f(L).prelu(t(2, 3), t(3)),
    "sdpa": lambda L, t: _f(L).scaled_dot_product_attention(t(1, 2, 3, 4), t(1, 2, 3, 4), t(1, 2, 3, 4)),
    # range-sensitive math, reductions and normalisations: float32 only under float16
    "exp": lambda L, t: L.exp(t(3)),
    "log": lambda L, t: L.log(t(3)),
    "log1p": lambda L, t: L.log1p(t(3)),
    "pow": lambda L, t: L.pow(t(3), 2.5),
    "reciprocal": lambda L, t: L.reciprocal(t(3)),
    "rsqrt": lambda L, t: L.rsqrt(t(3)),
    "tan": lambda L, t: L.tan(t(3)),
    "acos": lambda L, t: L.acos(t(3, low=-0.9, high=0.9)),
    "sinh": lambda L, t: L.sinh(t(3)),
    "erfinv": lambda L, t: L.erfinv(t(3, low=-0.9, high=0.9)),
    "sum": lambda L, t: L.sum(t(3, 4)),
    "sum-dim": lambda L, t: t(3, 4).sum(1),
    "cumsum": lambda L, t: L.cumsum(t(3, 4), 1),
    "cumprod": lambda L, t: L.cumprod(t(3, 4), 1),
    "softmax": lambda L, t: L.softmax(t(3, 4), 1),
    "log_softmax": lambda L, t: _f(L).log_softmax(t(3, 4), dim=1),
    "logsumexp": lambda L, t: L.logsumexp(t(3, 4), 1),
    "layer_norm": lambda L, t: _f(L).layer_norm(t(2, 4), (4,), t(4), t(4)),
    "group_norm": lambda L, t: _f(L).group_norm(t(2, 4, 3), 2),
    "vector_norm": lambda L, t: L.linalg.vector_norm(t(3, 4)),
    "softplus": lambda L, t: _f(L).softplus(t(3)),
    # as given under every dtype
    "sin": lambda L, t: L.sin(t(3)),
    "sqrt": lambda L, t: L.sqrt(t(3)),
    "mean": lambda L, t: L.mean(t(3, 4)),
    "std": lambda L, t: L.std(t(3, 4)),
    "batch_norm": lambda L, t: _f(L).batch_norm(t(2, 3), None, None, training=True),
    "relu": lambda L, t: _f(L).relu(t(3)),
    "gelu": lambda L, t: _f(L).gelu(t(3)),
    "sigmoid": lambda L, t: L.sigmoid(t(3)),
    "tanh": lambda L, t: L.tanh(t(3)),
    "dropout-eval": lambda L, t: _f(L).dropout(t(3), training=False),
    "max_pool2d": lambda L, t: _f(L).max_pool2d(t(1, 1, 4, 4), 2),
    "avg_pool2d": lambda L, t: _f(L).avg_pool2d(t(1, 1, 4, 4), 2),
    "embedding": lambda L, t: _f(L).embedding(t.index([0, 2]), t(3, 4)),
    "add": lambda L, t: t(3) + t(3),
    "mul-scalar": lambda L, t: t(3) * 2.0,
    "transpose": lambda L, t: t(3, 4).t(),
    # float32 under every dtype: losses and linear algebra
    "prod": lambda L, t: L.prod(t(3, 4)),
    "mse_loss": lambda L, t: _f(L).mse_loss(t(3), t(3, low=0.0, high=1.0)),
    "l1_loss": lambda L, t: _f(L).l1_loss(t(3), t(3, low=0.0, high=1.0)),
    "smooth_l1_loss": lambda L, t: _f(L).smooth_l1_loss(t(3), t(3, low=0.0, high=1.0)),
    "huber_loss": lambda L, t: _f(L).huber_loss(t(3), t(3, low=0.0, high=1.0)),
    "kl_div": lambda L, t: _f(L).kl_div(t(3), t(3), reduction="sum"),
    "nll_loss": lambda L, t: _f(L).nll_loss(t(2, 3), t.index([0, 1])),
    "cross_entropy": lambda L, t: _f(L).cross_entropy(t(2, 3), t.index([0, 2])),
    "cross_entropy-smoothing": lambda L, t: _f(L).cross_entropy(t(2, 3), t.index([0, 2]), label_smoothing=0.1),
    "bce_with_logits": lambda L, t: _f(L).binary_cross_entropy_with_logits(t(3), t(3, low=0.0, high=1.0)),
    "margin_ranking_loss": lambda L, t: _f(L).margin_ranking_loss(t(3), t(3), t(3, low=-1, high=1).sign()),
    "soft_margin_loss": lambda L, t: _f(L).soft_margin_loss(t(3), t(3, low=-1, high=1).sign()),
    "cosine_embedding_loss": lambda L, t: _f(L).cosine_embedding_loss(t(2, 3), t(2, 3), t.index([1, -1])),
    "hinge_embedding_loss": lambda L, t: _f(L).hinge_embedding_loss(t(3), t.index([1, -1, 1])),
    "poisson_nll_loss": lambda L, t: _f(L).poisson_nll_loss(t(3), t(3)),
    "triplet_margin_loss": lambda L, t: _f(L).triplet_margin_loss(t(2, 3), t(2, 3), t(2, 3)),
    "multi_margin_loss": lambda L, t: _f(L).multi_margin_loss(t(2, 3), t.index([0, 2])),
    "trace": lambda L, t: L.trace(t(3, 3)),
    "inv": lambda L, t: L.linalg.inv(t(3, 3) + 3 * L.eye(3)),
    "pad-reflect": lambda L, t: _f(L).pad(t(1, 1, 4, 4), (1, 1, 1, 1), mode="reflect"),
    "pad-replicate": lambda L, t: _f(L).pad(t(1, 1, 4, 4), (1, 1, 1, 1), mode="replicate"),
    # promotion to the widest input
    "cat": lambda L, t: L.cat([t(3), t(3, dtype=L.float32)]),
    "stack": lambda L, t: L.stack([t(3), t(3, dtype=L.float32)]),
    "addcmul": lambda L, t: L.addcmul(t(3), t(3), t(3, dtype=L.float32)),
    "atan2": lambda L, t: L.atan2(t(3), t(3, dtype=L.float32)),
    "index_put": lambda L, t: t(3).index_put((t.index([0]),), t(1, dtype=L.float32)),
    "scatter_add": lambda L, t: t(3).scatter_add(0, t.index([0]), t(1, dtype=L.float32)),
    "where": lambda L, t: L.where(t(3) > 1, t(3), t(3, dtype=L.float32)),
}

# More products and distances, where PyTorch's CPU and CUDA lists differ (see test_autocast_policy).
CASES.update(
    {
        "addbmm": lambda L, t: L.addbmm(t(3, 5), t(2, 3, 4), t(2, 4, 5)),
        "mv": lambda L, t: L.mv(t(3, 4), t(4)),
        "dot": lambda L, t: L.dot(t(4), t(4)),
        "addmv": lambda L, t: L.addmv(t(3), t(3, 4), t(4)),
        "outer": lambda L, t: L.outer(t(3), t(4)),
        "tensordot": lambda L, t: L.tensordot(t(3, 4), t(4, 5), 1),
        "cosine_similarity": lambda L, t: _f(L).cosine_similarity(t(2, 3), t(2, 3)),
        "pairwise_distance": lambda L, t: _f(L).pairwise_distance(t(2, 3), t(2, 3)),
        "binary_cross_entropy": lambda L, t: _f(L).binary_cross_entropy(t(3, low=0.1, high=0.9), t(3, low=0, high=1)),
        "gaussian_nll_loss": lambda L, t: _f(L).gaussian_nll_loss(t(3), t(3), t(3)),
        "multilabel_soft_margin_loss": lambda L, t: _f(L).multilabel_soft_margin_loss(t(2, 3), t(2, 3, low=0, high=1)),
        "pad-circular": lambda L, t: _f(L).pad(t(1, 1, 4, 4), (1, 1, 1, 1), mode="circular"),
        "pad-constant": lambda L, t: _f(L).pad(t(1, 1, 4, 4), (1, 1, 1, 1)),
        "interpolate": lambda L, t: _f(L).interpolate(t(1, 1, 4, 4), scale_factor=2),
    }
)


# PyTorch's CPU autocast leaves these alone and then rejects the mixed dtypes; kiln promotes them as
# PyTorch's CUDA autocast does (its "promote" list), so the same code runs on every device.
PROMOTED_WHERE_TORCH_CPU_RAISES = {"index_put", "scatter_add"}


def _name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _run(lib, label: str, input_dtype: str, autocast_dtype: str = "bfloat16"):
    with lib.autocast("cpu", dtype=getattr(lib, autocast_dtype)):
        return CASES[label](lib, Maker(lib, getattr(lib, input_dtype)))


@pytest.mark.parametrize("input_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("label", sorted(CASES))
def test_dtype_and_values_match_pytorch(label, input_dtype):
    ours = _run(kiln, label, input_dtype)
    if label in PROMOTED_WHERE_TORCH_CPU_RAISES and input_dtype == "bfloat16":
        with pytest.raises(RuntimeError):
            _run(torch, label, input_dtype)
        assert ours.dtype is kiln.float32
        return
    theirs = _run(torch, label, input_dtype)
    assert _name(ours.dtype) == _name(theirs.dtype), f"{label}: kiln {ours.dtype}, PyTorch {theirs.dtype}"
    a = ours.float().detach().numpy()
    b = theirs.float().detach().numpy()
    half = theirs.dtype in (torch.bfloat16, torch.float16) or input_dtype != "float32"
    tol = 4e-2 if half else 1e-5
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=label)


def test_outside_a_region_nothing_is_cast():
    for label in ("mm", "exp", "mse_loss", "cat"):
        out = CASES[label](kiln, Maker(kiln, kiln.float32))
        assert out.dtype is kiln.float32, label


@pytest.mark.parametrize("label", ["exp", "log", "sum", "softmax", "log_softmax", "layer_norm", "vector_norm", "pow"])
def test_range_sensitive_ops_run_in_float32_under_float16_only(label):
    with kiln.autocast("cpu", dtype=kiln.float16):
        assert CASES[label](kiln, Maker(kiln, kiln.float16)).dtype is kiln.float32
    with kiln.autocast("cpu", dtype=kiln.bfloat16):
        assert CASES[label](kiln, Maker(kiln, kiln.bfloat16)).dtype is kiln.bfloat16


def test_every_policy_in_the_record_is_known_and_the_table_covers_each():
    policies = {o.autocast for o in kb.ops().values()} | {c.autocast for c in kb.composites().values()}
    assert policies - {None} == set(kb.AUTOCAST_POLICIES)


def test_binary_cross_entropy_is_unsafe_under_float16_and_float32_under_bfloat16():
    p = kiln.full((3,), 0.25)
    y = kiln.full((3,), 1.0)
    with kiln.autocast("cpu", dtype=kiln.float16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            kiln.nn.functional.binary_cross_entropy(p, y)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            kiln.nn.BCELoss()(p, y)
        # the logits form is the safe one
        assert kiln.nn.functional.binary_cross_entropy_with_logits(p, y).dtype is kiln.float32
    with kiln.autocast("cpu"):
        out = kiln.nn.functional.binary_cross_entropy(p.bfloat16(), y)
    assert out.dtype is kiln.float32
    assert abs(out.item() - float(-np.log(0.25))) < 1e-6
