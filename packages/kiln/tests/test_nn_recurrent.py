"""The fused recurrent layers against PyTorch: ``kiln.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (padded,
batch-first, packed; several layers, both directions, with and without biases, LSTM projections) and the
``*_cell`` functions, forward and backward against torch's functions of the same names; gradcheck and
gradgradcheck of the fused op in float64; the op's decompositions (what a device without kernels runs)
against the kernels; empty sequences; torch's errors for mismatched cells and the op's own checks."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln._ops import recurrent

MODES = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN_TANH", "rnn_relu": "RNN_RELU"}


def _params(rng, mode: str, input_size: int, hidden: int, layers: int, directions: int, bias: bool, proj: int = 0):
    """Per layer and direction: w_ih, w_hh[, b_ih, b_hh][, w_hr] as float64 arrays (torch's layout)."""
    gates = recurrent.GATES[mode] * hidden
    state = proj or hidden
    out = []
    for layer in range(layers):
        for _ in range(directions):
            width = input_size if layer == 0 else state * directions
            out += [rng.uniform(-0.5, 0.5, (gates, width)), rng.uniform(-0.5, 0.5, (gates, state))]
            if bias:
                out += [rng.uniform(-0.5, 0.5, gates), rng.uniform(-0.5, 0.5, gates)]
            if proj:
                out += [rng.uniform(-0.5, 0.5, (proj, hidden))]
    return out


def _pair(arrays, dtype):
    return [U.both(a, dtype, requires_grad=True) for a in arrays]


def _run_both(name: str, x, hx, params, flags, packed_sizes=None):
    """(kiln results, torch results, kiln leaves, torch leaves) of ``name`` with the same arguments."""
    mode = MODES[name]
    k_fn, t_fn = getattr(kiln, name), getattr(torch, name)
    kx, tx = x
    k_params, t_params = [p[0] for p in params], [p[1] for p in params]
    k_h = tuple(h[0] for h in hx) if mode == "LSTM" else hx[0][0]
    t_h = tuple(h[1] for h in hx) if mode == "LSTM" else hx[0][1]
    if packed_sizes is None:
        k_out = k_fn(kx, k_h, k_params, *flags)
        t_out = t_fn(tx, t_h, t_params, *flags)
    else:
        sizes = torch.tensor(packed_sizes)
        k_out = k_fn(kx, kiln.tensor(packed_sizes), k_h, k_params, *flags[:-1])
        t_out = t_fn(tx, sizes, t_h, t_params, *flags[:-1])
    leaves = [x, *hx, *params]
    return k_out, t_out, [p[0] for p in leaves], [p[1] for p in leaves]


def _compare(k_out, t_out, k_leaves, t_leaves, dtype, rng):
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype is kiln.float32 else {"rtol": 1e-9, "atol": 1e-11}
    for k, t in zip(k_out, t_out):
        U.assert_close(k, t, **tol)
    grads = [rng.standard_normal(tuple(t.shape)) for t in t_out]
    k_loss = sum((k * kiln.tensor(g, dtype=dtype)).sum() for k, g in zip(k_out, grads))
    t_loss = sum((t * torch.tensor(g, dtype=t.dtype)).sum() for t, g in zip(t_out, grads))
    k_loss.backward()
    t_loss.backward()
    for k, t in zip(k_leaves, t_leaves):
        U.assert_close(k.grad, t.grad, **tol)


CONFIGS = [
    # layers, bidirectional, batch_first, bias
    (1, False, False, True),
    (2, True, False, True),
    (2, False, True, False),
    (1, True, True, True),
]


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=U.dtype_id)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"L{c[0]}-bi{int(c[1])}-bf{int(c[2])}-b{int(c[3])}")
@pytest.mark.parametrize("name", list(MODES))
def test_layers_match_torch(name, config, dtype):
    layers, bidirectional, batch_first, bias = config
    rng = U.rng_for(hash((name, config)) % 1000)
    directions = 2 if bidirectional else 1
    steps, batch, inp, hidden = 5, 3, 4, 6
    shape = (batch, steps, inp) if batch_first else (steps, batch, inp)
    kx, tx = U.both(rng.standard_normal(shape[::-1]), dtype, requires_grad=True)
    x = (kx, tx)
    # a transposed (non-contiguous) input: the leaf is laid out the other way round
    x_view = (kx.permute(2, 1, 0), tx.permute(2, 1, 0))
    states = 2 if name == "lstm" else 1
    hx = [U.both(rng.standard_normal((layers * directions, batch, hidden)), dtype, requires_grad=True)]
    hx *= 1
    if states == 2:
        hx.append(U.both(rng.standard_normal((layers * directions, batch, hidden)), dtype, requires_grad=True))
    params = _pair(_params(rng, MODES[name], inp, hidden, layers, directions, bias), dtype)
    flags = (bias, layers, 0.0, True, bidirectional, batch_first)
    k_out, t_out, k_leaves, t_leaves = _run_both(name, x_view, hx, params, flags)
    k_leaves[0], t_leaves[0] = x[0], x[1]
    _compare(k_out, t_out, k_leaves, t_leaves, dtype, rng)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("name", list(MODES))
def test_packed_layers_match_torch(name, bidirectional):
    rng = U.rng_for(7)
    sizes = [4, 4, 3, 1]  # four sequences of lengths 4, 3, 3, 2 (sorted longest first)
    directions = 2 if bidirectional else 1
    hidden, inp = 5, 3
    x = U.both(rng.standard_normal((sum(sizes), inp)), kiln.float64, requires_grad=True)
    hx = [U.both(rng.standard_normal((2 * directions, sizes[0], hidden)), kiln.float64, requires_grad=True)]
    if name == "lstm":
        hx.append(U.both(rng.standard_normal((2 * directions, sizes[0], hidden)), kiln.float64, requires_grad=True))
    params = _pair(_params(rng, MODES[name], inp, hidden, 2, directions, True), kiln.float64)
    flags = (True, 2, 0.0, True, bidirectional, False)
    _compare(*_run_both(name, x, hx, params, flags, packed_sizes=sizes), kiln.float64, rng)


@pytest.mark.parametrize("packed", [False, True])
def test_lstm_projection_matches_torch(packed):
    rng = U.rng_for(11)
    hidden, proj, inp = 6, 3, 4
    sizes = [3, 2, 2] if packed else None
    x_shape = (sum(sizes), inp) if packed else (3, 2, inp)
    batch = sizes[0] if packed else 2
    x = U.both(rng.standard_normal(x_shape), kiln.float64, requires_grad=True)
    hx = [
        U.both(rng.standard_normal((4, batch, proj)), kiln.float64, requires_grad=True),
        U.both(rng.standard_normal((4, batch, hidden)), kiln.float64, requires_grad=True),
    ]
    params = _pair(_params(rng, "LSTM", inp, hidden, 2, 2, True, proj=proj), kiln.float64)
    flags = (True, 2, 0.0, True, True, False)
    _compare(*_run_both("lstm", x, hx, params, flags, packed_sizes=sizes), kiln.float64, rng)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", ["lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"])
def test_cells_match_torch(name, bias):
    rng = U.rng_for(3)
    mode = MODES[name[: -len("_cell")]]
    params = _pair(_params(rng, mode, 4, 5, 1, 1, bias), kiln.float32)
    x = U.both(rng.standard_normal((3, 4)), kiln.float32, requires_grad=True)
    states = [U.both(rng.standard_normal((3, 5)), kiln.float32, requires_grad=True) for _ in range(2)]
    k_h = (states[0][0], states[1][0]) if mode == "LSTM" else states[0][0]
    t_h = (states[0][1], states[1][1]) if mode == "LSTM" else states[0][1]
    k_out = getattr(kiln, name)(x[0], k_h, *[p[0] for p in params])
    t_out = getattr(torch, name)(x[1], t_h, *[p[1] for p in params])
    k_out, t_out = (k_out, t_out) if mode == "LSTM" else ((k_out,), (t_out,))
    leaves = [x, *(states if mode == "LSTM" else states[:1]), *params]
    _compare(k_out, t_out, [p[0] for p in leaves], [p[1] for p in leaves], kiln.float32, rng)


def _layer_inputs(mode: str, packed: bool, proj: int = 0, seed: int = 0, hidden: int = 3, steps: int = 3):
    """Small float64 leaves of one ``_rnn_layer`` call (batch 2 padded, 3 packed), and its other arguments."""
    rng = np.random.default_rng(seed)
    state = proj or hidden
    width = recurrent.GATES[mode] * hidden
    sizes = (3, 2, 2, 1)[:steps] if packed else None
    lead = (sum(sizes),) if packed else (steps, 2)
    batch = sizes[0] if packed else 2

    def leaf(*shape):
        return kiln.tensor(rng.uniform(-1, 1, shape), dtype=kiln.float64, requires_grad=True)

    tensors = (
        leaf(*lead, width),
        leaf(batch, state),
        leaf(batch, hidden) if mode == "LSTM" else None,
        leaf(width, state),
        leaf(width),
        leaf(proj, hidden) if proj else None,
    )
    return tensors, (mode, True, sizes)


CASES = [(mode, packed, 0) for mode in recurrent.GATES for packed in (False, True)] + [("LSTM", True, 2)]


def _case_id(case) -> str:
    return f"{case[0]}-{'packed' if case[1] else 'padded'}" + ("-proj" if case[2] else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gradcheck_and_gradgradcheck(case):
    mode, packed, proj = case

    def check(tensors, rest, order):
        def fn(*args):
            it = iter(args)
            full = [next(it) if t is not None else None for t in tensors]
            out, h_n, c_n, _, _ = recurrent._rnn_layer(*full, *rest)
            return (out, h_n, c_n) if mode == "LSTM" else (out, h_n)

        present = [t for t in tensors if t is not None]
        assert (kiln.autograd.gradcheck if order == 1 else kiln.autograd.gradgradcheck)(fn, present)

    check(*_layer_inputs(mode, packed, proj), 1)
    # the second order on fewer, smaller steps: its cost grows with the square of the inputs' size
    check(*_layer_inputs(mode, packed, proj, hidden=2, steps=2), 2)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_decompositions_match_the_kernels(case):
    """What a device without kernels runs (the ops in kiln ops) computes what this device's kernels do."""
    mode, packed, proj = case
    tensors, rest = _layer_inputs(mode, packed, proj, seed=5)
    plain = [None if t is None else t.detach() for t in tensors]
    fused = recurrent._rnn_layer(*plain, *rest)
    composed = recurrent._layer_decomposed(*plain, *rest)
    for a, b in zip(fused, composed):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-13)
    rng = np.random.default_rng(1)
    lstm = mode == "LSTM"
    g_out = kiln.tensor(rng.standard_normal(tuple(fused[0].shape)))
    g_h = kiln.tensor(rng.standard_normal(tuple(fused[1].shape)))
    g_c = kiln.tensor(rng.standard_normal(tuple(fused[2].shape))) if lstm else None
    saved = (fused[0], fused[3] if lstm else None, fused[4] if mode in ("LSTM", "GRU") else None)
    args = (g_out, g_h, g_c, *plain, *saved, *rest)
    for a, b in zip(recurrent._rnn_layer_backward(*args), recurrent._layer_bwd_decomposed(*args)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", list(MODES))
def test_empty_sequence_raises_torchs_error(name):
    rng = U.rng_for(2)
    params = _pair(_params(rng, MODES[name], 3, 4, 1, 1, True), kiln.float32)
    x = U.both(np.zeros((0, 2, 3)), kiln.float32)
    hx = [U.both(rng.standard_normal((1, 2, 4)), kiln.float32) for _ in range(2 if name == "lstm" else 1)]
    flags = (True, 1, 0.0, False, False, False)
    U.assert_same_error(
        lambda: getattr(kiln, name)(
            x[0], tuple(h[0] for h in hx) if len(hx) == 2 else hx[0][0], [p[0] for p in params], *flags
        ),
        lambda: getattr(torch, name)(
            x[1], tuple(h[1] for h in hx) if len(hx) == 2 else hx[0][1], [p[1] for p in params], *flags
        ),
    )


def test_empty_layer_op_keeps_the_initial_state():
    """The op itself (a zero-step packed or padded call from other code) returns the initial states."""
    (ig, h, c, w, b, _), _ = _layer_inputs("LSTM", False)
    out, h_n, c_n, _, _ = recurrent._rnn_layer(ig[:0].detach(), h, c, w, b, None, "LSTM")
    assert tuple(out.shape) == (0, 2, 3)
    np.testing.assert_array_equal(h_n.detach().numpy(), h.detach().numpy())
    np.testing.assert_array_equal(c_n.detach().numpy(), c.detach().numpy())


def test_cells_raise_torchs_errors():
    def both(fn_name, x_shape, h_shape, w_ih_shape, w_hh_shape):
        def call(lib):
            t = lib.zeros
            h = t(h_shape)
            return getattr(lib, fn_name)(
                t(x_shape), (h, h) if fn_name == "lstm_cell" else h, t(w_ih_shape), t(w_hh_shape)
            )

        U.assert_same_error(lambda: call(kiln), lambda: call(torch))

    both("gru_cell", (2, 3), (2, 4), (12, 5), (12, 4))  # input_size
    both("gru_cell", (2, 3), (3, 4), (12, 3), (12, 4))  # batch
    both("rnn_tanh_cell", (2, 3), (2, 5), (4, 3), (4, 4))  # hidden size
    both("lstm_cell", (2, 3), (3, 4), (16, 3), (16, 4))


def test_layer_op_checks_its_arguments():
    (ig, h, c, w, b, _), _ = _layer_inputs("LSTM", False)
    ig, h, c, w, b = (t.detach() for t in (ig, h, c, w, b))
    with pytest.raises(ValueError, match="Unrecognized RNN mode: LSTMX"):
        recurrent._rnn_layer(ig, h, c, w, b, None, "LSTMX")
    with pytest.raises(RuntimeError, match="an LSTM needs cx"):
        recurrent._rnn_layer(ig, h, None, w, b, None, "LSTM")
    with pytest.raises(RuntimeError, match="hx must be"):
        recurrent._rnn_layer(ig, h[:, :2], c, w, b, None, "LSTM")
    with pytest.raises(RuntimeError, match="input_gates must be"):
        recurrent._rnn_layer(ig[..., :5], h, c, w, b, None, "LSTM")
    with pytest.raises(RuntimeError, match="batch_sizes must be positive and non-increasing"):
        recurrent._rnn_layer(ig.reshape(6, -1), h, c, w, b, None, "LSTM", False, (1, 3, 2))
    with pytest.raises(RuntimeError, match="do not fit"):
        recurrent._rnn_layer(ig.reshape(6, -1), h, c, w, b, None, "LSTM", False, (2, 2, 1))
    with pytest.raises(RuntimeError, match=r"expected kiln\.float64"):
        recurrent._rnn_layer(ig, h.float(), c, w, b, None, "LSTM")
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        recurrent._rnn_layer(*(t.long() for t in (ig, h, c, w, b)), None, "LSTM")
    with pytest.raises(RuntimeError, match="expected 8 parameters"):
        kiln.lstm(
            kiln.zeros(2, 1, 3), (kiln.zeros(2, 1, 3), kiln.zeros(2, 1, 3)), [w], True, 2, 0.0, False, False, False
        )


def test_lstm_records_one_node_per_layer_and_direction():
    """The point of the fused op: a whole sequence is one autograd record per layer and direction."""
    rng = U.rng_for(4)
    params = [kiln.tensor(a, dtype=kiln.float32, requires_grad=True) for a in _params(rng, "LSTM", 4, 5, 2, 2, True)]
    h0 = kiln.zeros(4, 2, 5)
    out, _, _ = kiln.lstm(kiln.randn(7, 2, 4), (h0, h0), params, True, 2, 0.0, True, True, False)
    names, stack, seen = [], [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.append(node.name())
        stack += [f for f, _ in node.next_functions]
    assert names.count("MkldnnRnnLayerBackward0") == 4
