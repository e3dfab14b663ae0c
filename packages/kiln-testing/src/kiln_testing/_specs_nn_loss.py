"""Conformance specs of the nn primitives: losses (merged into ``_specs.SPECS``).

The fused loss ops of ``kiln._ops.classification_loss`` and ``kiln._ops.ctc_loss``; the composed losses
(mse, l1, kl_div...) are made of ops that have their own specs. Class weights and ``pos_weight`` never require grad: the ops refuse that,
as PyTorch does.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln_testing._specs import Case, Ctx, OpSpec, T, explicit


def _ix(values, dtype=None) -> T:
    a = np.asarray(values, dtype=np.int64)
    return T(base=a.astype((dtype or kiln.int64).numpy), dtype=dtype or kiln.int64, shape=a.shape, grad=False)


def _weight(c: Ctx, n: int) -> T:
    return c.t((n,), low=0.2, high=2.0, grad=False)


def _nll(c: Ctx) -> list[Case]:
    t = _ix([0, 4, 2, -100])
    return [
        Case("mean", (c.t((4, 5)), t, None, -100, "mean")),
        Case("weighted-sum", (c.t((4, 5)), t, _weight(c, 5), -100, "sum")),
        Case("weighted-mean-ignore", (c.t((4, 5), layout="transposed"), _ix([0, 1, 1, 3]), _weight(c, 5), 1, "mean")),
        Case("none", (c.t((4, 5), layout="strided"), t, None, -100, "none")),
        Case("uint8-target", (c.t((3, 5)), _ix([1, 0, 4], kiln.uint8), None, -100, "mean")),
        Case("unbatched", (c.t((5,)), _ix(3), None, -100, "none")),
        Case("kdim", (c.t((2, 3, 4)), _ix([[0, 1, 2, 0], [2, 2, 1, 0]]), _weight(c, 3), -100, "mean")),
        Case("4d-none", (c.t((2, 3, 2, 2)), _ix(np.arange(8).reshape(2, 2, 2) % 3), None, -100, "none")),
        Case("empty-sum", (c.t((0, 3)), _ix(np.zeros(0)), None, -100, "sum")),
        Case("out-of-bounds", (c.t((2, 3)), _ix([0, 3]), None, -100, "mean"), grad=False),
    ]


def _nll_backward(c: Ctx) -> list[Case]:
    t = _ix([0, 4, 2, -100])
    return [
        Case("mean", (c.t(()), c.t((4, 5)), t, None, -100, "mean")),
        Case("weighted-sum", (c.t(()), c.t((4, 5)), t, _weight(c, 5), -100, "sum")),
        Case("none", (c.t((4,)), c.t((4, 5)), t, _weight(c, 5), 2, "none")),
        Case("kdim-none", (c.t((2, 4)), c.t((2, 3, 4)), _ix([[0, 1, 2, 0], [2, 2, 1, 0]]), None, -100, "none")),
        Case("unbatched", (c.t(()), c.t((5,)), _ix(1), None, -100, "mean")),
    ]


def _probs(c: Ctx, shape, **k) -> T:
    return c.t(shape, low=0.05, high=0.95, **k)


def _bce(c: Ctx) -> list[Case]:
    return [
        Case("mean", (_probs(c, (3, 4)), c.t((3, 4), low=0.0, high=1.0), None, "mean")),
        Case("weighted-none", (_probs(c, (3, 4)), c.t((3, 4), low=0.0, high=1.0), _weight(c, 4), "none")),
        Case(
            "strided-sum",
            (_probs(c, (3, 4), layout="strided"), c.t((3, 4), low=0.0, high=1.0, layout="transposed"), None, "sum"),
        ),
        Case("0-d", (_probs(c, ()), c.t((), low=0.0, high=1.0), None, "none")),
        Case("empty", (_probs(c, (0, 3)), c.t((0, 3), low=0.0, high=1.0), None, "sum")),
        Case("out-of-range", (c.t((3,), low=1.5, high=2.0), c.t((3,), low=0.0, high=1.0), None, "mean"), grad=False),
    ]


def _bce_logits(c: Ctx) -> list[Case]:
    y = c.t((3, 4), low=0.0, high=1.0)
    return [
        Case("mean", (c.t((3, 4)), y, None, None, "mean")),
        Case("weights-none", (c.t((3, 4)), y, _weight(c, 4), _weight(c, 4), "none")),
        Case("pos-weight-sum", (c.t((3, 4), layout="transposed"), y, None, _weight(c, 4), "sum")),
        Case(
            "strided",
            (c.t((3, 4), layout="strided"), c.t((3, 4), low=0.0, high=1.0, layout="expanded"), None, None, "mean"),
        ),
        Case("large-logits", (c.t((3, 4), low=-90.0, high=90.0), y, None, None, "none")),
        Case("empty", (c.t((0, 3)), c.t((0, 3), low=0.0, high=1.0), None, None, "mean")),
    ]


def _log_probs(c: Ctx, shape, **k) -> T:
    """Normalised log-probabilities over the last dim (what CTC's gradient formula assumes)."""
    x = c.t(shape, **k)
    if x.dtype.is_floating_point:
        z = x.base.astype(np.float64)
        x.base = (z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(x.dtype.numpy)
    return x


def _ctc(c: Ctx) -> list[Case]:
    padded = _ix([[1, 2, 2], [3, 1, 0]])
    return [
        Case("padded", (_log_probs(c, (6, 2, 4)), padded, (6, 5), (3, 2), 0, False)),
        Case("concatenated", (_log_probs(c, (6, 2, 4)), _ix([1, 2, 2, 3, 1]), (6, 4), (3, 2), 0, False)),
        Case(
            "int32-targets-blank3",
            (_log_probs(c, (5, 2, 4)), _ix([[1, 1], [0, 2]], kiln.int32), (5, 5), (2, 1), 3, False),
        ),
        Case("empty-target", (_log_probs(c, (4, 2, 3)), _ix([[1], [2]]), (4, 3), (0, 1), 0, False)),
        Case("infeasible-zero-infinity", (_log_probs(c, (3, 2, 4)), padded, (2, 3), (3, 2), 0, True)),
        Case("input-too-long", (_log_probs(c, (3, 2, 4)), padded, (4, 3), (3, 2), 0, False), grad=False),
    ]


def _ctc_backward(c: Ctx) -> list[Case]:
    padded = _ix([[1, 2, 2], [3, 1, 0]])
    return [
        Case("padded", (c.t((2,)), _log_probs(c, (6, 2, 4)), padded, (6, 5), (3, 2), 0, False)),
        Case("concatenated", (c.t((2,)), _log_probs(c, (6, 2, 4)), _ix([1, 2, 2, 3, 1]), (6, 4), (3, 2), 0, False)),
        Case("zero-infinity", (c.t((2,)), _log_probs(c, (3, 2, 4)), padded, (2, 3), (3, 2), 0, True)),
    ]


SPECS: dict[str, OpSpec] = {
    "_ctc_loss": explicit(_ctc, rtol=1e-4, atol=1e-5),
    "_ctc_loss_backward": explicit(_ctc_backward, rtol=1e-4, atol=1e-5),
    "_nll_loss": explicit(_nll),
    "_nll_loss_backward": explicit(_nll_backward),
    "_binary_cross_entropy": explicit(_bce, rtol=1e-4, atol=1e-5),
    "_binary_cross_entropy_with_logits": explicit(_bce_logits),
}
