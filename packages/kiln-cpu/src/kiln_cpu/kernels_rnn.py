"""kiln-cpu's recurrent layers: ``_rnn_layer`` and ``_rnn_layer_backward`` (LSTM, GRU, Elman RNN with tanh
or ReLU; padded or packed sequences, either direction) as one kernel call per layer and direction.

Each time step is one BLAS product (``h @ w_hhᵀ`` forward, ``dgates @ w_hh`` backward) into a preallocated
block and one Numba loop over the step's rows (:mod:`kiln_cpu._jit_rnn`) that applies the gates and writes
the step's output, cell and workspace rows in place; the weight gradient is one product over every step
at the end (``dgatesᵀ @ h_prev``). Where the composite runs some twenty ops and autograd records per
step, this runs two calls. An LSTM with a projection (``proj_size``, ``w_hr``) adds one product per step
each way: the loop's hidden state ``o * tanh(c)`` goes to a scratch block and ``@ w_hrᵀ`` makes the
step's output and state; backward, the projected state's gradient ``@ w_hr`` is the loop's, and the
projection's weight gradient is one product at the end (``d_topᵀ @ (o * tanh(c))``), as the reference's.

Handed back to the reference: dtypes other than float32/float64 (or operands of mixed dtypes), and
sequences with no steps.
"""

from __future__ import annotations

import numpy as np

from kiln.backend import from_array, reference_kernel
from kiln_cpu import _blas
from kiln_cpu._kernel_support import FLOAT, loops

_jit = loops("_jit_rnn")


def _array(t) -> np.ndarray | None:
    """``t``'s values as a C-contiguous array (None stays None)."""
    return None if t is None else np.ascontiguousarray(t._numpy())


def _steps(spec_shape: tuple, rows: int, batch_sizes) -> tuple[tuple, tuple]:
    if batch_sizes is None:
        steps, batch = spec_shape[:2]
        return (batch,) * steps, tuple(range(0, rows, batch))
    offsets, at = [], 0
    for n in batch_sizes:
        offsets.append(at)
        at += n
    return tuple(batch_sizes), tuple(offsets)


def _taken(spec, tensors) -> bool:
    """Whether the loops serve the call: a float32/float64 result, every operand of its dtype."""
    d = spec[0].dtype
    return d in FLOAT and all(t is None or t._dtype is d for t in tensors)


def _layer_kernel():
    reference = reference_kernel("_rnn_layer")

    def kernel(spec, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse=False, batch_sizes=None):
        args = (spec, input_gates, hx, cx, w_hh, b_hh, w_hr, mode, reverse, batch_sizes)
        if not _taken(spec, (input_gates, hx, cx, w_hh, b_hh, w_hr)) or not input_gates._shape[0]:
            return reference(*args)
        width = input_gates._shape[-1]
        ig = _array(input_gates).reshape(-1, width)
        wt = np.ascontiguousarray(w_hh._numpy().T)  # BLAS is about twice as fast on it as on the transposed view
        b = _array(b_hh) if b_hh is not None else np.zeros(width, ig.dtype)
        h = np.array(hx._numpy(), order="C")
        state = h.shape[1]  # the hidden state's width: the projection's, for an LSTM with one
        rows = ig.shape[0]
        sizes, offsets = _steps(input_gates._shape, rows, batch_sizes)
        order = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
        out = np.empty((rows, state), ig.dtype)
        hg = np.empty((h.shape[0], width), ig.dtype)
        j = _jit()
        c = cells = ws = raw = wrt = None
        if mode == "LSTM":
            c = np.array(cx._numpy(), order="C")
            cells = np.empty((rows, c.shape[1]), ig.dtype)
            ws = np.empty((rows, width), ig.dtype)
            if w_hr is not None:  # o * tanh(c) lands here, then @ w_hrᵀ makes the state
                raw = np.empty(c.shape, ig.dtype)
                wrt = np.ascontiguousarray(w_hr._numpy().T)
        elif mode == "GRU":
            ws = np.empty((rows, 4 * state), ig.dtype)
        relu = mode == "RNN_RELU"
        with _blas.for_product(state, hg.shape):
            for t in order:
                n, o = sizes[t], offsets[t]
                step = hg[:n]
                np.matmul(h[:n], wt, out=step)
                if raw is not None:
                    r = raw[:n]
                    j.lstm_step(ig[o : o + n], step, b, r, c, r, cells[o : o + n], ws[o : o + n])
                    np.matmul(r, wrt, out=out[o : o + n])
                    h[:n] = out[o : o + n]
                elif mode == "LSTM":
                    j.lstm_step(ig[o : o + n], step, b, h, c, out[o : o + n], cells[o : o + n], ws[o : o + n])
                elif mode == "GRU":
                    j.gru_step(ig[o : o + n], step, b, h, out[o : o + n], ws[o : o + n])
                else:
                    j.rnn_step(ig[o : o + n], step, b, relu, h, out[o : o + n])
        got = (out, h, c, cells, ws)
        return tuple(
            from_array(np.zeros(0, ig.dtype) if a is None else a.reshape(s.shape), s.dtype) for a, s in zip(got, spec)
        )

    kernel.__name__ = "kiln_cpu__rnn_layer"
    kernel.__doc__ = "One BLAS product and one Numba loop per step for _rnn_layer (kiln-cpu)."
    return kernel


def _layer_backward_kernel():
    reference = reference_kernel("_rnn_layer_backward")

    def kernel(
        spec, grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace, mode,
        reverse=False, batch_sizes=None,
    ):  # fmt: skip
        args = (
            spec, grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace,
            mode, reverse, batch_sizes,
        )  # fmt: skip
        operands = (grad_output, grad_h_n, grad_c_n, input_gates, hx, cx, w_hh, b_hh, w_hr, output, cells, workspace)
        if not _taken(spec, operands) or not input_gates._shape[0]:
            return reference(*args)
        w = _array(w_hh)
        width, state = w.shape  # state: the hidden state's width (the projection's, for an LSTM with one)
        hidden = width // 4 if mode == "LSTM" else state  # an LSTM's cell width
        g_out = _array(grad_output).reshape(-1, state)
        out = _array(output).reshape(-1, state)
        rows = out.shape[0]
        dt = out.dtype
        sizes, offsets = _steps(input_gates._shape, rows, batch_sizes)
        order = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
        lstm, gru = mode == "LSTM", mode == "GRU"
        ws = _array(workspace).reshape(rows, -1) if workspace is not None else None
        cell_rows = _array(cells).reshape(rows, hidden) if lstm else None
        # the states each step started from, in the steps' rows
        h_prev = np.empty((rows, state), dt)
        h_state = np.array(hx._numpy(), order="C")
        c_prev = np.empty((rows, hidden), dt) if lstm else None
        c_state = np.array(cx._numpy(), order="C") if lstm else None
        for t in order:
            n, o = sizes[t], offsets[t]
            h_prev[o : o + n] = h_state[:n]
            h_state[:n] = out[o : o + n]
            if lstm:
                c_prev[o : o + n] = c_state[:n]
                c_state[:n] = cell_rows[o : o + n]
        dh = np.array(grad_h_n._numpy(), dtype=dt, order="C")
        dc = np.array(grad_c_n._numpy(), dtype=dt, order="C") if lstm else None
        d_in = np.empty((rows, width), dt)
        d_hid = np.empty((rows, width), dt) if gru else d_in
        carry = np.empty((dh.shape[0], hidden), dt) if gru else None
        wr = _array(w_hr)
        if wr is not None:  # the projected state's gradient per step, and the loop's (@ w_hr) with no dh to add
            d_top = np.empty((rows, state), dt)
            d_raw = np.empty((dh.shape[0], hidden), dt)
            no_dh = np.zeros((dh.shape[0], hidden), dt)
        j = _jit()
        relu = mode == "RNN_RELU"
        with _blas.for_product(width, dh.shape):
            for t in reversed(order):
                n, o = sizes[t], offsets[t]
                rows_t = slice(o, o + n)
                if wr is not None:
                    top = np.add(dh[:n], g_out[rows_t], out=d_top[rows_t])
                    np.matmul(top, wr, out=d_raw[:n])
                    j.lstm_back(d_raw[:n], no_dh, dc, ws[rows_t], cell_rows[rows_t], c_prev[rows_t], d_in[rows_t])
                    np.matmul(d_in[rows_t], w, out=dh[:n])
                elif lstm:
                    j.lstm_back(g_out[rows_t], dh, dc, ws[rows_t], cell_rows[rows_t], c_prev[rows_t], d_in[rows_t])
                    np.matmul(d_in[rows_t], w, out=dh[:n])
                elif gru:
                    j.gru_back(g_out[rows_t], dh, ws[rows_t], h_prev[rows_t], d_in[rows_t], d_hid[rows_t])
                    np.matmul(d_hid[rows_t], w, out=carry[:n])
                    dh[:n] += carry[:n]
                else:
                    j.rnn_back(g_out[rows_t], dh, out[rows_t], relu, d_in[rows_t])
                    np.matmul(d_in[rows_t], w, out=dh[:n])
        with _blas.for_product(rows, w.shape):
            d_w = d_hid.T @ h_prev
        d_b = np.sum(d_hid, 0) if b_hh is not None else None
        d_wr = None
        if wr is not None:
            with _blas.for_product(rows, wr.shape):
                d_wr = d_top.T @ (ws[:, 3 * hidden :] * np.tanh(cell_rows))  # o * tanh(c), as the reference
        got = (d_in, dh, dc, d_w, d_b, d_wr)
        return tuple(
            from_array(np.zeros(0, dt) if a is None else a.reshape(s.shape), s.dtype) for a, s in zip(got, spec)
        )

    kernel.__name__ = "kiln_cpu__rnn_layer_backward"
    kernel.__doc__ = "One BLAS product and one Numba loop per step for _rnn_layer_backward (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The recurrent-layer kernels: op name -> (kernel, output dtypes served)."""
    return {"_rnn_layer": (_layer_kernel(), FLOAT), "_rnn_layer_backward": (_layer_backward_kernel(), FLOAT)}
