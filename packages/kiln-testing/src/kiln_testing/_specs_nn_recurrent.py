"""Conformance specs of the nn primitives: the fused recurrent layers ``_rnn_layer`` and
``_rnn_layer_backward`` (merged into ``_specs.SPECS``).

Every mode (LSTM, GRU, tanh and ReLU RNN), padded and packed, both directions, with and without biases, an
LSTM projection, and non-contiguous operands. The backward op's saved outputs are drawn like any other
input: device and reference compute the same formula of the same values.
"""

from __future__ import annotations

from kiln_testing._specs import Case, Ctx, OpSpec, explicit

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_HIDDEN = 3


def _layer_args(c: Ctx, mode: str, packed: bool, bias: bool, proj: int = 0, layout: str = "contiguous"):
    """The tensors of one layer (input gates, hx, cx, w_hh, b_hh, w_hr) and the batch sizes."""
    width = _GATES[mode] * _HIDDEN
    state = proj or _HIDDEN
    sizes = (3, 2, 1) if packed else None  # few steps: the CUDA simulator runs the decomposition op by op
    lead = (sum(sizes),) if packed else (3, 3)
    batch = 3
    tensors = (
        c.t((*lead, width), low=-1.5, high=1.5, layout=layout),
        c.t((batch, state), low=-1.0, high=1.0),
        c.t((batch, _HIDDEN), low=-1.0, high=1.0) if mode == "LSTM" else None,
        c.t((width, state), low=-0.8, high=0.8, layout=layout),
        c.t((width,), low=-0.5, high=0.5) if bias else None,
        c.t((state, _HIDDEN), low=-0.8, high=0.8) if proj else None,
    )
    return tensors, sizes


_VARIANTS = [
    # label, mode, packed, bias, reverse, projection, layout
    ("lstm", "LSTM", False, True, False, 0, "contiguous"),
    ("lstm-packed-reverse-projection", "LSTM", True, True, True, 2, "contiguous"),
    ("gru-transposed", "GRU", False, True, True, 0, "transposed"),
    ("gru-packed-no-bias", "GRU", True, False, False, 0, "contiguous"),
    ("rnn-tanh-strided", "RNN_TANH", False, True, False, 0, "strided"),
    ("rnn-relu-packed-reverse", "RNN_RELU", True, False, True, 0, "contiguous"),
]


def _layer(c: Ctx) -> list[Case]:
    out = []
    for label, mode, packed, bias, reverse, proj, layout in _VARIANTS:
        tensors, sizes = _layer_args(c, mode, packed, bias, proj, layout)
        out.append(Case(label, (*tensors, mode, reverse, sizes)))
    tensors, _ = _layer_args(c, "GRU", False, True)
    out.append(Case("bad-mode", (*tensors, "GRUX", False, None), grad=False))
    return out


def _layer_backward(c: Ctx) -> list[Case]:
    out = []
    for label, mode, packed, bias, reverse, proj, layout in _VARIANTS:
        tensors, sizes = _layer_args(c, mode, packed, bias, proj, layout)
        lead, state = tensors[0].shape[:-1], proj or _HIDDEN
        lstm = mode == "LSTM"
        grads = (
            c.t((*lead, state)),
            c.t(tensors[1].shape),
            c.t((3, _HIDDEN)) if lstm else None,
        )
        saved = (
            c.t((*lead, state), low=-0.9, high=0.9, grad=False),
            c.t((*lead, _HIDDEN), low=-1.0, high=1.0, grad=False) if lstm else None,
            c.t((*lead, 4 * _HIDDEN), low=0.05, high=0.95, grad=False) if mode in ("LSTM", "GRU") else None,
        )
        out.append(Case(label, (*grads, *tensors, *saved, mode, reverse, sizes)))
    return out


SPECS: dict[str, OpSpec] = {
    "_rnn_layer": explicit(_layer),
    "_rnn_layer_backward": explicit(_layer_backward),
}
