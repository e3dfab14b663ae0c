"""kiln-cpu's recurrent-layer kernels against the reference kernels: ``_rnn_layer`` and
``_rnn_layer_backward`` for LSTM, GRU and both Elman RNNs, padded and packed, both directions, with and
without bias, in float32 and float64, with non-contiguous operands, and LSTMs with a projection; the
kernel is the one that runs; the cases handed back to the reference (other dtypes, no steps) give the
reference's results.

The loops do the reference's arithmetic in the same order, but the per-step products go to BLAS in other
blocks, and float32's sigmoid and tanh are kiln-cpu's (within an ulp): the tolerances allow for that."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import reference

import kiln
from kiln._ops import recurrent
from kiln_cpu import _jit_rnn

MODES = tuple(recurrent.GATES)
FLOAT = [kiln.float32, kiln.float64]


def _tol(dtype):
    return {"rtol": 2e-5, "atol": 2e-6} if dtype is kiln.float32 else {"rtol": 1e-12, "atol": 1e-13}


def _inputs(mode, dtype, packed, bias, seed=0, transposed=False, proj=0):
    """(input gates, hx, cx, w_hh, b_hh, w_hr) and the packed batch sizes; ``proj``: an LSTM's projection
    width (its state's), 0 for none."""
    rng = np.random.default_rng(seed)
    hidden, batch = 7, 4
    state = proj or hidden
    width = recurrent.GATES[mode] * hidden
    sizes = (4, 4, 3, 1, 1) if packed else None
    lead = (sum(sizes),) if packed else (5, batch)

    def t(*shape):
        return kiln.from_numpy(rng.uniform(-1.5, 1.5, shape).astype(dtype.numpy))

    gates = t(*lead, width)
    if transposed:  # a non-contiguous view of the same values
        gates = kiln.from_numpy(np.ascontiguousarray(gates.numpy().T)).T
    hx = t(batch, state)
    cx = t(batch, hidden) if mode == "LSTM" else None
    w = t(width, state)
    if transposed:
        w = kiln.from_numpy(np.ascontiguousarray(w.numpy().T)).T
    b = t(width) if bias else None
    w_hr = t(state, hidden) if proj else None
    if proj and transposed:
        w_hr = kiln.from_numpy(np.ascontiguousarray(w_hr.numpy().T)).T
    return (gates, hx, cx, w, b, w_hr), sizes


def _close(a, b, dtype):
    np.testing.assert_allclose(a.numpy(), b.numpy(), **_tol(dtype))


def _kernel_name(op_name, dtype):
    return kiln.backend.op(op_name)._checked[dtype]["cpu"].__name__


@pytest.fixture
def loops(monkeypatch):
    """The set of the Numba step loops the kernels call."""
    called: set[str] = set()
    for name in ("lstm_step", "gru_step", "rnn_step", "lstm_back", "gru_back", "rnn_back"):
        real = getattr(_jit_rnn, name)
        monkeypatch.setattr(_jit_rnn, name, lambda *a, _real=real, _name=name: called.add(_name) or _real(*a))
    return called


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("mode", [*MODES, "LSTM-proj"])
def test_forward_and_backward_match_the_reference(mode, packed, dtype, loops):
    proj = 3 if mode == "LSTM-proj" else 0
    mode = mode.removesuffix("-proj")
    for reverse, bias, transposed in ((False, True, False), (True, False, True)):
        tensors, sizes = _inputs(mode, dtype, packed, bias, seed=len(mode), transposed=transposed, proj=proj)
        rest = (mode, reverse, sizes)
        got = recurrent._rnn_layer(*tensors, *rest)
        want = reference(recurrent._rnn_layer, *tensors, *rest)
        for a, b in zip(got, want):
            _close(a, b, dtype)
        rng = np.random.default_rng(3)
        lstm = mode == "LSTM"
        g_out = kiln.from_numpy(rng.standard_normal(tuple(got[0].shape)).astype(dtype.numpy))
        g_h = kiln.from_numpy(rng.standard_normal(tuple(got[1].shape)).astype(dtype.numpy))
        g_c = kiln.from_numpy(rng.standard_normal(tuple(got[2].shape)).astype(dtype.numpy)) if lstm else None
        saved = (want[0], want[3] if lstm else None, want[4] if mode in ("LSTM", "GRU") else None)
        args = (g_out, g_h, g_c, *tensors, *saved, *rest)
        for a, b in zip(recurrent._rnn_layer_backward(*args), reference(recurrent._rnn_layer_backward, *args)):
            _close(a, b, dtype)
    assert _kernel_name("_rnn_layer", dtype) == "kiln_cpu__rnn_layer"
    assert _kernel_name("_rnn_layer_backward", dtype) == "kiln_cpu__rnn_layer_backward"
    prefix = {"LSTM": "lstm", "GRU": "gru"}.get(mode, "rnn")
    assert loops == {f"{prefix}_step", f"{prefix}_back"}


def test_a_bidirectional_two_layer_lstm_trains_through_the_kernels():
    """``kiln.lstm`` (what ``nn.LSTM`` calls) forward and backward on kiln-cpu equal the same call run on the
    reference kernels."""
    rng = np.random.default_rng(0)
    params = []
    for layer in range(2):
        for _ in range(2):
            width = 5 if layer == 0 else 12
            for shape in ((24, width), (24, 6), (24,), (24,)):
                params.append(kiln.from_numpy(rng.uniform(-0.4, 0.4, shape).astype(np.float32)).requires_grad_())
    x = kiln.from_numpy(rng.standard_normal((8, 3, 5)).astype(np.float32))
    h0 = kiln.zeros(4, 3, 6)

    def grads():
        for p in params:
            p.grad = None
        out, h, c = kiln.lstm(x, (h0, h0), params, True, 2, 0.0, True, True, False)
        (out.square().sum() + h.sum() + c.sum()).backward()
        return [p.grad.clone() for p in params]

    for a, b in zip(grads(), reference(grads)):
        _close(a, b, kiln.float32)


def test_a_projected_lstm_module_trains_through_the_kernels(loops):
    """``nn.LSTM(proj_size=...)``, two layers, both directions, packed: its gradients on kiln-cpu equal the
    same module's on the reference kernels."""
    nn = pytest.importorskip("kiln.nn")  # kiln-nn: a test-time extra of kiln-cpu
    from kiln.nn.utils.rnn import pack_padded_sequence

    kiln.manual_seed(0)
    lstm = nn.LSTM(5, 6, num_layers=2, bidirectional=True, proj_size=3)
    x = kiln.randn(7, 3, 5)

    def grads():
        lstm.zero_grad()
        out, (h, c) = lstm(pack_padded_sequence(x, [7, 5, 2]))
        (out.data.square().sum() + h.sum() + c.sum()).backward()
        return [p.grad.clone() for p in lstm.parameters()]

    got = grads()
    assert loops == {"lstm_step", "lstm_back"}
    for a, b in zip(got, reference(grads)):
        _close(a, b, kiln.float32)


@pytest.mark.parametrize("case", ["projection in float16", "float16", "no steps"])
def test_cases_handed_to_the_reference(case):
    dtype = kiln.float16 if "float16" in case else kiln.float32
    mode = "LSTM"
    (gates, hx, cx, w, b, w_hr), _ = _inputs(mode, kiln.float32, False, True, proj=3 if "projection" in case else 0)
    if case == "no steps":
        gates = gates[:0]
    tensors = tuple(t.to(dtype) if t is not None else None for t in (gates, hx, cx, w, b, w_hr))
    got = recurrent._rnn_layer(*tensors, mode)
    want = reference(recurrent._rnn_layer, *tensors, mode)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
