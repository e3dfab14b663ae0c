"""nn primitives: the recurrent layers as fused ops, one call per layer and direction over a whole sequence.

``_rnn_layer`` runs the hidden-state recurrence of an LSTM, GRU or Elman RNN (``mode``, torch's names
``"LSTM"``, ``"GRU"``, ``"RNN_TANH"``, ``"RNN_RELU"``) from the input projections of every step
(``input_gates = x @ w_ihᵀ + b_ih``, one matmul outside the op), and ``_rnn_layer_backward`` its
gradients. ``nn.LSTM``/``GRU``/``RNN`` and their cells call them (a cell is a one-step sequence); a
device with kernels for the two ops (kiln-cpu) runs the whole recurrence in one call instead of some
twenty ops and autograd records per step.

The recurrence is written once, over an array namespace: :class:`_NumPy` makes it the reference kernels,
:class:`_Kiln` the decompositions (what a device without kernels runs, in kiln ops) and, differentiated by
the engine, the backward op's own backward (:func:`kiln._ops.softmax._vjp_of_composite`), so gradients
of every order work.

Sequences are processed row-wise: ``input_gates`` is ``(T, B, G*H)`` for a padded batch or, with
``batch_sizes`` (a packed batch sorted by decreasing length), ``(N, G*H)`` whose step ``t`` is the next
``batch_sizes[t]`` rows. Only the first ``batch_sizes[t]`` sequences step at ``t``; the others keep their
state, so each sequence's final state is taken at its own last step (forward) or starts from its initial
state at its own last step (``reverse``), as torch's packed path does.
"""

from __future__ import annotations

import numpy as np

from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.softmax import _upcast, _vjp_of_composite
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__: list[str] = []

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
"""Gate blocks per mode: rows of ``w_hh`` are ``GATES[mode] * hidden_size`` (torch's layout and order:
LSTM ``i, f, g, o``; GRU ``r, z, n``)."""

_WORKSPACE = {"LSTM": 4, "GRU": 4, "RNN_TANH": 0, "RNN_RELU": 0}
# per step and row, what backward reads besides the outputs: LSTM its activated gates i, f, g, o; GRU
# r, z, n and the hidden part of n's pre-activation (h @ w_hnᵀ + b_hn); the RNNs nothing (the output)


# ---------------------------------------------------------------------------------------- checks


def _steps(shape: tuple, batch_sizes) -> tuple[tuple, tuple]:
    """(rows per step, first row of each step) of the 2-D row view of input gates of ``shape``."""
    if batch_sizes is None:
        t, b = shape[:2]
        return (b,) * t, tuple(range(0, t * b, b))
    offsets, at = [], 0
    for n in batch_sizes:
        offsets.append(at)
        at += n
    return tuple(batch_sizes), tuple(offsets)


def _sizes(w_hh_shape: tuple, mode: str) -> tuple[int, int]:
    """(hidden size, state size) from ``w_hh``'s shape: the cell's width and the carried hidden state's
    (an LSTM projection's size, else the same)."""
    return w_hh_shape[0] // GATES[mode], w_hh_shape[1]


def _check(name: str, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, batch_sizes) -> tuple[int, int, int]:
    """Validate a layer's arguments; returns (batch, hidden size, state size)."""
    if mode not in GATES:
        raise ValueError(f"Unrecognized RNN mode: {mode}")
    named = [("input_gates", input_gates), ("hx", hx), ("w_hh", w_hh), ("cx", cx), ("b_hh", b_hh), ("w_hr", w_hr)]
    for arg, t in named:
        if t is None and arg in ("b_hh", "w_hr", "cx"):
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(t).__name__}")
        if t._dtype is not input_gates._dtype:
            raise RuntimeError(f"{name}: {arg} is {t._dtype}, expected {input_gates._dtype} (input_gates' dtype)")
        if t._device != input_gates._device:
            raise RuntimeError(f"{name}: {arg} is on {t._device}, expected {input_gates._device}")
    lstm = mode == "LSTM"
    if (cx is not None) != lstm or (w_hr is not None and not lstm):
        raise RuntimeError(f"{name}: a cell state and a projection belong to LSTM, and an LSTM needs cx ({mode})")
    if not input_gates._dtype.is_floating_point:
        raise NotImplementedError(f"\"{name}\" not implemented for '{scalar_type_name(input_gates._dtype)}'")
    g = GATES[mode]
    if len(w_hh._shape) != 2 or w_hh._shape[0] % g:
        raise RuntimeError(f"{name}: w_hh must be ({g} * hidden_size, state size), got {list(w_hh._shape)}")
    hidden, state = _sizes(w_hh._shape, mode)
    if (state, hidden) != (w_hr._shape if w_hr is not None else (hidden, hidden)):
        raise RuntimeError(
            f"{name}: w_hh {list(w_hh._shape)} and w_hr {None if w_hr is None else list(w_hr._shape)} disagree"
        )
    if len(hx._shape) != 2 or hx._shape[1] != state:
        raise RuntimeError(f"{name}: hx must be (batch, {state}), got {list(hx._shape)}")
    batch = hx._shape[0]
    if cx is not None and cx._shape != (batch, hidden):
        raise RuntimeError(f"{name}: cx must be [{batch}, {hidden}], got {list(cx._shape)}")
    if b_hh is not None and b_hh._shape != (g * hidden,):
        raise RuntimeError(f"{name}: b_hh must be ({g * hidden},), got {list(b_hh._shape)}")
    shape = input_gates._shape
    if batch_sizes is None:
        if len(shape) != 3 or shape[1] != batch or shape[2] != g * hidden:
            raise RuntimeError(f"{name}: input_gates must be (steps, {batch}, {g * hidden}), got {list(shape)}")
    else:
        sizes = list(batch_sizes)
        if len(shape) != 2 or shape[1] != g * hidden:
            raise RuntimeError(f"{name}: packed input_gates must be (rows, {g * hidden}), got {list(shape)}")
        if any(type(n) is not int or n < 1 for n in sizes) or sizes != sorted(sizes, reverse=True):
            raise RuntimeError(f"{name}: batch_sizes must be positive and non-increasing, got {sizes}")
        if sum(sizes) != shape[0] or (sizes and sizes[0] != batch):
            raise RuntimeError(f"{name}: batch_sizes {sizes} do not fit {shape[0]} rows and a batch of {batch}")
    return batch, hidden, state


def _layer_specs(input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse=False, batch_sizes=None) -> tuple:
    batch, hidden, state = _check("_rnn_layer", input_gates, hx, cx, w_hh, b_hh, w_hr, mode, batch_sizes)
    lead = input_gates._shape[:-1]
    d, dev = input_gates._dtype, input_gates._device
    lstm = mode == "LSTM"
    ws = _WORKSPACE[mode] * hidden
    return (
        Spec((lead + (state,), d, dev)),
        Spec(((batch, state), d, dev)),
        Spec(((batch, hidden) if lstm else (0,), d, dev)),
        Spec((lead + (hidden,) if lstm else (0,), d, dev)),
        Spec((lead + (ws,) if ws else (0,), d, dev)),
    )


# ---------------------------------------------------------------------------------------- the recurrence


class _NumPy:
    """The array namespace of the reference kernels."""

    @staticmethod
    def cat(xs, dim):
        return np.concatenate(xs, dim)

    matmul = staticmethod(np.matmul)
    tanh = staticmethod(np.tanh)

    @staticmethod
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    @staticmethod
    def relu(x):
        return np.maximum(x, 0)

    @staticmethod
    def rows_sum(x):
        return np.sum(x, 0)

    @staticmethod
    def zeros(like, shape):
        return np.zeros(shape, like.dtype)


class _Kiln:
    """The array namespace of the decompositions: kiln ops."""

    @staticmethod
    def cat(xs, dim):
        from kiln._ops.shape import cat

        return cat(xs, dim)

    @staticmethod
    def matmul(a, b):
        return a @ b

    @staticmethod
    def tanh(x):
        return x.tanh()

    @staticmethod
    def sigmoid(x):
        return x.sigmoid()

    @staticmethod
    def relu(x):
        return x.relu()

    @staticmethod
    def rows_sum(x):
        return x.sum(0)

    @staticmethod
    def zeros(like, shape):
        return like.new_zeros(shape)


def _merge(new, old, xp):
    """The state after a step: the stepped rows, then the rows that did not step, unchanged."""
    n = new.shape[0]
    return new if n == old.shape[0] else xp.cat([new, old[n:]], 0)


def _order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _forward(xp, mode, ig, hx, cx, w, b, wr, sizes, offsets, reverse):
    """The recurrence over the 2-D rows ``ig``: (output rows, h_n, c_n, cell rows, workspace rows) with
    None for what the mode lacks."""
    hidden, state = _sizes(w.shape, mode)
    wt = w.T
    h, c = hx, cx
    steps = len(sizes)
    outs, cells, ws = [None] * steps, [None] * steps, [None] * steps
    for t in _order(steps, reverse):
        n, o = sizes[t], offsets[t]
        x = ig[o : o + n]
        hp = h[:n]
        hg = xp.matmul(hp, wt)
        if b is not None:
            hg = hg + b
        if mode == "LSTM":
            pre = x + hg
            i = xp.sigmoid(pre[:, :hidden])
            f = xp.sigmoid(pre[:, hidden : 2 * hidden])
            g = xp.tanh(pre[:, 2 * hidden : 3 * hidden])
            og = xp.sigmoid(pre[:, 3 * hidden :])
            cn = f * c[:n] + i * g
            hn = og * xp.tanh(cn)
            if wr is not None:
                hn = xp.matmul(hn, wr.T)
            ws[t] = xp.cat([i, f, g, og], 1)
            cells[t] = cn
            c = _merge(cn, c, xp)
        elif mode == "GRU":
            r = xp.sigmoid(x[:, :hidden] + hg[:, :hidden])
            z = xp.sigmoid(x[:, hidden : 2 * hidden] + hg[:, hidden : 2 * hidden])
            hpart = hg[:, 2 * hidden :]
            nn = xp.tanh(x[:, 2 * hidden :] + r * hpart)
            hn = (1 - z) * nn + z * hp
            ws[t] = xp.cat([r, z, nn, hpart], 1)
        else:
            pre = x + hg
            hn = xp.relu(pre) if mode == "RNN_RELU" else xp.tanh(pre)
        outs[t] = hn
        h = _merge(hn, h, xp)

    def rows(parts, width):
        return xp.cat(parts, 0) if steps else xp.zeros(ig, (0, width))

    lstm = mode == "LSTM"
    return (
        rows(outs, state),
        h,
        c if lstm else None,
        rows(cells, hidden) if lstm else None,
        rows(ws, 4 * hidden) if _WORKSPACE[mode] else None,
    )


def _backward(xp, mode, g_out, g_hn, g_cn, hx, cx, w, has_bias, wr, out, cells, ws, sizes, offsets, reverse):
    """Gradients of :func:`_forward` for the output rows' ``g_out`` and the final states' ``g_hn``/``g_cn``:
    (input gate rows, hx, cx, w_hh, b_hh, w_hr) with None for what the mode or layer lacks."""
    hidden, _ = _sizes(w.shape, mode)
    steps = len(sizes)
    order = _order(steps, reverse)
    lstm, gru = mode == "LSTM", mode == "GRU"
    # the state each step started from
    h_prev, c_prev = [None] * steps, [None] * steps
    h, c = hx, cx
    for t in order:
        n, o = sizes[t], offsets[t]
        h_prev[t] = h[:n]
        h = _merge(out[o : o + n], h, xp)
        if lstm:
            c_prev[t] = c[:n]
            c = _merge(cells[o : o + n], c, xp)
    dh, dc = g_hn, g_cn
    d_in, d_hid, d_top, raw = [None] * steps, [None] * steps, [None] * steps, [None] * steps
    for t in reversed(order):
        n, o = sizes[t], offsets[t]
        dht = dh[:n] + g_out[o : o + n]
        if lstm:
            gates = ws[o : o + n]
            i, f = gates[:, :hidden], gates[:, hidden : 2 * hidden]
            g, og = gates[:, 2 * hidden : 3 * hidden], gates[:, 3 * hidden :]
            tc = xp.tanh(cells[o : o + n])
            if wr is not None:  # the projection's gradients: dht is the projected state's
                d_top[t], raw[t] = dht, og * tc
                dht = xp.matmul(dht, wr)
            dct = dc[:n] + dht * og * (1 - tc * tc)
            dpre = xp.cat(
                [dct * g * (i * (1 - i)), dct * c_prev[t] * (f * (1 - f)), dct * i * (1 - g * g), dht * tc * (og * (1 - og))],
                1,
            )  # fmt: skip
            dc = _merge(dct * f, dc, xp)
            d_in[t] = d_hid[t] = dpre
            carry = xp.matmul(dpre, w)
        elif gru:
            parts = ws[o : o + n]
            r, z = parts[:, :hidden], parts[:, hidden : 2 * hidden]
            nn, hpart = parts[:, 2 * hidden : 3 * hidden], parts[:, 3 * hidden :]
            dn = dht * (1 - z) * (1 - nn * nn)
            dr = dn * hpart * (r * (1 - r))
            dz = dht * (h_prev[t] - nn) * (z * (1 - z))
            d_in[t] = xp.cat([dr, dz, dn], 1)
            d_hid[t] = xp.cat([dr, dz, dn * r], 1)
            carry = dht * z + xp.matmul(d_hid[t], w)
        else:
            y = out[o : o + n]
            dpre = dht * (y > 0) if mode == "RNN_RELU" else dht * (1 - y * y)
            d_in[t] = d_hid[t] = dpre
            carry = xp.matmul(dpre, w)
        dh = _merge(carry, dh, xp)
    d_wr = None
    if steps:
        d_ig = xp.cat(d_in, 0)
        d_hg = xp.cat(d_hid, 0) if gru else d_ig
        d_w = xp.matmul(d_hg.T, xp.cat(h_prev, 0))
        if wr is not None:
            d_wr = xp.matmul(xp.cat(d_top, 0).T, xp.cat(raw, 0))
    else:
        d_ig = d_hg = xp.zeros(w, (0, w.shape[0]))
        d_w = xp.zeros(w, w.shape)
        d_wr = xp.zeros(w, wr.shape) if wr is not None else None
    d_b = xp.rows_sum(d_hg) if has_bias else None
    return d_ig, dh, (dc if lstm else None), d_w, d_b, d_wr


def _rows(t, cols: int):
    """``t`` as 2-D rows of ``cols`` (None stays None)."""
    return None if t is None else t.reshape(-1, cols)


def _fill(results: tuple, specs: tuple, zeros, cast=lambda a, spec: a) -> tuple:
    """The results in their specs' shapes (``cast`` to their dtypes: a decomposition computes half precision
    in float32, as the reference kernels do, and rounds once), ``zeros(spec)`` for the ones a layer lacks."""
    return tuple(zeros(s) if a is None else cast(a.reshape(s.shape), s) for a, s in zip(results, specs))


def _composed(results: tuple, specs: tuple, like: Tensor) -> tuple:
    """A decomposition's results: :func:`_fill` with kiln tensors on ``like``'s device."""
    return _fill(results, specs, lambda s: like.new_zeros(s.shape, dtype=s.dtype), lambda a, s: a.to(s.dtype))


# ---------------------------------------------------------------------------------------- _rnn_layer


def _layer_ref(spec, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse=False, batch_sizes=None):
    compute = _compute_np(spec[0].dtype)
    ig, hx, cx, w_hh, b_hh, w_hr = (
        None if a is None else a.astype(compute, copy=False) for a in (input_gates, hx, cx, w_hh, b_hh, w_hr)
    )
    sizes, offsets = _steps(ig.shape, batch_sizes)
    got = _forward(_NumPy, mode, _rows(ig, ig.shape[-1]), hx, cx, w_hh, b_hh, w_hr, sizes, offsets, reverse)
    return _fill(got, spec, lambda s: np.zeros(s.shape, compute))


def _layer_decomposed(input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse=False, batch_sizes=None):
    """``_rnn_layer`` in kiln ops (:func:`_forward` over :class:`_Kiln`), with empty ``(0,)`` tensors for
    the outputs the mode lacks."""
    specs = _layer_specs(input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse, batch_sizes)
    sizes, offsets = _steps(input_gates._shape, batch_sizes)
    input_gates, hx, cx, w_hh, b_hh, w_hr = _upcast(input_gates, hx, cx, w_hh, b_hh, w_hr)
    ig = _rows(input_gates, input_gates._shape[-1])
    return _composed(_forward(_Kiln, mode, ig, hx, cx, w_hh, b_hh, w_hr, sizes, offsets, reverse), specs, hx)


def _layer_backward(grads, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse, batch_sizes, result):
    out, _, _, cells, ws = result
    lstm = mode == "LSTM"
    got = _rnn_layer_backward(
        grads[0], grads[1], grads[2] if lstm else None, input_gates, hx, cx, w_hh, b_hh, w_hr, out,
        cells if lstm else None, ws if _WORKSPACE[mode] else None, mode, reverse, batch_sizes,
    )  # fmt: skip
    return (
        got[0], got[1], got[2] if lstm else None, got[3], got[4] if b_hh is not None else None,
        got[5] if w_hr is not None else None,
    )  # fmt: skip


@op(
    tags=("nn", "fused"),
    meta=_layer_specs,
    reference=_layer_ref,
    backward=_layer_backward,
    decompose=_layer_decomposed,
    num_outputs=5,
    differentiable_outputs=(0, 1, 2),
    # PyTorch's CPU LSTM layer is one op too (oneDNN's); its GRU and RNN end in a stack of the steps
    grad_fn_name=lambda args: "MkldnnRnnLayerBackward0" if args[6] == "LSTM" else "StackBackward0",
)
def _rnn_layer(
    input_gates: Tensor,
    hx: Tensor,
    cx: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    w_hr: Tensor | None,
    mode: str,
    reverse: bool = False,
    batch_sizes: tuple | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One recurrent layer and direction over a whole sequence (see the module docstring): ``input_gates``
    are the steps' input projections, ``hx``/``cx`` the initial states (``cx`` for LSTM only), ``w_hh``
    and ``b_hh`` the hidden-to-hidden weight and bias, ``w_hr`` an LSTM's projection (or None). Returns
    ``(output, h_n, c_n, cells, workspace)``: every step's hidden state, the final states, and what backward
    reads (each step's cell state; the LSTM's activated gates or the GRU's ``r, z, n`` and hidden part of
    ``n``); an output the mode lacks is an empty ``(0,)`` tensor. Differentiable in ``output``, ``h_n`` and
    ``c_n``."""


# ---------------------------------------------------------------------------------------- backward


def _layer_bwd_specs(
    grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace, mode,
    reverse=False, batch_sizes=None,
) -> tuple:  # fmt: skip
    name = "_rnn_layer_backward"
    _, hidden, state = _check(name, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, batch_sizes)
    lead = input_gates._shape[:-1]
    lstm = mode == "LSTM"
    expected = [
        ("grad_output", grad_output, lead + (state,)),
        ("grad_h_n", grad_h_n, hx._shape),
        ("output", output, lead + (state,)),
    ]
    if lstm:
        expected += [("grad_c_n", grad_c_n, cx._shape), ("cells", cells, lead + (hidden,))]
    if _WORKSPACE[mode]:
        expected.append(("workspace", workspace, lead + (_WORKSPACE[mode] * hidden,)))
    for arg, t, shape in expected:
        if not isinstance(t, Tensor) or t._shape != shape or t._dtype is not input_gates._dtype:
            got = f"{list(t._shape)} {t._dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise RuntimeError(f"{name}: {arg} must be a {list(shape)} {input_gates._dtype} tensor, got {got}")
    d, dev = input_gates._dtype, input_gates._device
    return tuple(Spec((t._shape if t is not None else (0,), d, dev)) for t in (input_gates, hx, cx, w_hh, b_hh, w_hr))


def _layer_bwd_ref(
    spec, grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace, mode,
    reverse=False, batch_sizes=None,
):  # fmt: skip
    compute = _compute_np(spec[0].dtype)
    hidden, state = _sizes(w_hh.shape, mode)
    sizes, offsets = _steps(input_gates.shape, batch_sizes)

    def c(a, cols=None):
        a = None if a is None else a.astype(compute, copy=False)
        return a if cols is None else _rows(a, cols)

    got = _backward(
        _NumPy, mode, c(grad_output, state), c(grad_h_n), c(grad_c_n), c(hx), c(cx), c(w_hh), b_hh is not None,
        c(w_hr), c(output, state), c(cells, hidden), c(workspace, 4 * hidden), sizes, offsets, reverse,
    )  # fmt: skip
    return _fill(got, spec, lambda s: np.zeros(s.shape, compute))


def _layer_bwd_decomposed(
    grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace, mode,
    reverse=False, batch_sizes=None,
):  # fmt: skip
    """``_rnn_layer_backward`` in kiln ops (:func:`_backward` over :class:`_Kiln`)."""
    specs = _layer_bwd_specs(
        grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace, mode,
        reverse, batch_sizes,
    )  # fmt: skip
    hidden, state = _sizes(w_hh._shape, mode)
    sizes, offsets = _steps(input_gates._shape, batch_sizes)
    grad_output, grad_h_n, grad_c_n, hx, cx, w_hh, w_hr, output, cells, workspace = _upcast(
        grad_output, grad_h_n, grad_c_n, hx, cx, w_hh, w_hr, output, cells, workspace
    )
    got = _backward(
        _Kiln, mode, _rows(grad_output, state), grad_h_n, grad_c_n, hx, cx, w_hh, b_hh is not None, w_hr,
        _rows(output, state), _rows(cells, hidden), _rows(workspace, 4 * hidden), sizes, offsets, reverse,
    )  # fmt: skip
    return _composed(got, specs, hx)


def _layer_bwd_backward(
    grads, grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse, batch_sizes,
    needs_input_grad,
):  # fmt: skip
    """The backward op's own backward: the composite forward re-run from the layer's inputs, then the
    composite backward, differentiated by the engine (saved outputs get no gradient: they are recomputed)."""
    _, state = _sizes(w_hh._shape, mode)
    sizes, offsets = _steps(input_gates._shape, batch_sizes)

    def formula(go, ghn, gcn, ig, h, c, w, b, wr):
        out, _, _, cells, ws = _forward(_Kiln, mode, _rows(ig, ig._shape[-1]), h, c, w, b, wr, sizes, offsets, reverse)
        got = _backward(
            _Kiln, mode, _rows(go, state), ghn, gcn, h, c, w, b is not None, wr, out, cells, ws, sizes, offsets,
            reverse,
        )  # fmt: skip
        return (got[0].reshape(ig._shape), *got[1:])

    inputs = (grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr)
    return (*_vjp_of_composite(formula, inputs, grads, needs_input_grad[:9]), None, None, None)


@op(
    tags=("nn", "backward", "fused"),
    meta=_layer_bwd_specs,
    reference=_layer_bwd_ref,
    backward=_layer_bwd_backward,
    decompose=_layer_bwd_decomposed,
    num_outputs=6,
)
def _rnn_layer_backward(
    grad_output: Tensor,
    grad_h_n: Tensor,
    grad_c_n: Tensor | None,
    input_gates: Tensor,
    hx: Tensor,
    cx: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    w_hr: Tensor | None,
    output: Tensor,
    cells: Tensor | None,
    workspace: Tensor | None,
    mode: str,
    reverse: bool = False,
    batch_sizes: tuple | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`_rnn_layer` for ``grad_output`` (every step's hidden state) and ``grad_h_n``/
    ``grad_c_n`` (the final states), from its saved ``output``, ``cells`` and ``workspace``: ``(input_gates,
    hx, cx, w_hh, b_hh, w_hr)``, an empty ``(0,)`` tensor for an input the layer lacks."""
