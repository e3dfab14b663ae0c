"""The recurrent functions of PyTorch's top level: ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu`` (every layer
and direction of a padded or packed batch, what ``nn.LSTM``/``GRU``/``RNN`` call) and the one-step
``lstm_cell``, ``gru_cell``, ``rnn_tanh_cell``, ``rnn_relu_cell`` (what the ``nn`` cells call).

Each layer and direction is one :func:`kiln._ops.recurrent._rnn_layer` over the whole sequence, after one
matmul for the input projections of every step; a cell is a one-step layer.
"""

from __future__ import annotations

from kiln._ops.recurrent import GATES, _rnn_layer
from kiln._tensor import Tensor

__all__ = ["lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"]

TOP_LEVEL = tuple(__all__)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


def _input_gates(x: Tensor, w_ih: Tensor, b_ih: Tensor | None) -> Tensor:
    """``x @ w_ihᵀ + b_ih`` over the last dim: every step's input projection in one product."""
    from kiln._ops.products import addmm

    flat = x.reshape(-1, x._shape[-1])
    out = addmm(b_ih, flat, w_ih.t()) if b_ih is not None else flat @ w_ih.t()
    return out.reshape(*x._shape[:-1], w_ih._shape[0])


def _layers(mode, x, batch_sizes, hx, cx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """Every layer and direction: ``(output, h_n, c_n)`` (``c_n`` None but for LSTM)."""
    from kiln._ops.dropout import dropout as drop
    from kiln._ops.shape import cat, stack

    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    params = list(params)
    proj = mode == "LSTM" and len(params) == num_layers * directions * (per + 1)
    per += proj
    if len(params) != num_layers * directions * per:
        raise RuntimeError(
            f"{mode.lower()}: expected {num_layers * directions * per} parameters for {num_layers} layers, "
            f"{directions} directions{' with biases' if has_biases else ''}, got {len(params)}"
        )
    packed = batch_sizes is not None
    if batch_first and not packed:
        x = x.transpose(0, 1)
    if not packed and x.dim() == 3 and x._shape[0] == 0:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for direction in range(directions):
            idx = layer * directions + direction
            w = params[idx * per : (idx + 1) * per]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            out, h, c, _, _ = _rnn_layer(
                _input_gates(x, w[0], b_ih), hx[idx], cx[idx] if cx is not None else None, w[1], b_hh,
                w[-1] if proj else None, mode, direction == 1, batch_sizes,
            )  # fmt: skip
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        x = outs[0] if directions == 1 else cat(outs, -1)
        if dropout and train and layer < num_layers - 1:
            x = drop(x, dropout, True)
    if batch_first and not packed:
        x = x.transpose(0, 1)
    return x, stack(h_n, 0), (stack(c_n, 0) if cx is not None else None)


def _sizes_of(batch_sizes) -> tuple:
    if isinstance(batch_sizes, Tensor):
        batch_sizes = batch_sizes.tolist()
    return tuple(int(n) for n in batch_sizes)


def _multi(mode: str):
    def fn(*args):
        # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first), or packed:
        # (data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)
        lstm = mode == "LSTM"
        packed = isinstance(args[1], Tensor) if lstm else isinstance(args[2], Tensor)
        if packed:
            data, sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional = args
            sizes, batch_first = _sizes_of(sizes), False
        else:
            data, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
            sizes = None
        h, c = (hx[0], hx[1]) if lstm else (hx, None)
        out, h_n, c_n = _layers(
            mode, data, sizes, h, c, params, has_biases, num_layers, dropout, train, bidirectional, batch_first
        )
        return (out, h_n, c_n) if lstm else (out, h_n)

    return fn


lstm = _multi("LSTM")
lstm.__name__ = lstm.__qualname__ = "lstm"
lstm.__doc__ = """``torch.lstm``: a multi-layer LSTM. ``lstm(input, (h_0, c_0), params, has_biases, num_layers,
dropout, train, bidirectional, batch_first)`` or, packed, ``lstm(data, batch_sizes, (h_0, c_0), params, ...,
bidirectional)``; ``params`` are ``w_ih, w_hh[, b_ih, b_hh][, w_hr]`` per layer and direction (the
projection when ``h_0``'s size is ``proj_size``). Returns ``(output, h_n, c_n)``."""
gru = _multi("GRU")
gru.__name__ = gru.__qualname__ = "gru"
gru.__doc__ = """``torch.gru``: a multi-layer GRU. ``gru(input, h_0, params, has_biases, num_layers, dropout, train,
bidirectional, batch_first)`` or, packed, ``gru(data, batch_sizes, h_0, params, ..., bidirectional)``;
returns ``(output, h_n)``."""
rnn_tanh = _multi("RNN_TANH")
rnn_tanh.__name__ = rnn_tanh.__qualname__ = "rnn_tanh"
rnn_tanh.__doc__ = """``torch.rnn_tanh``: a multi-layer Elman RNN with tanh, arguments as :func:`gru`."""
rnn_relu = _multi("RNN_RELU")
rnn_relu.__name__ = rnn_relu.__qualname__ = "rnn_relu"
rnn_relu.__doc__ = """``torch.rnn_relu``: a multi-layer Elman RNN with ReLU, arguments as :func:`gru`."""


def _cell(mode: str, input: Tensor, h: Tensor, c: Tensor | None, w_ih, w_hh, b_ih, b_hh):
    """One step of a layer: ``(h', c')``; PyTorch's checks of a cell's input and states first."""
    if input.dim() != 2 or w_ih.dim() != 2:
        raise RuntimeError(
            f"{mode.lower()}_cell: expected 2-D input and weight_ih, got {input.dim()}-D and {w_ih.dim()}-D"
        )
    if input._shape[1] != w_ih._shape[1]:
        raise RuntimeError(f"input has inconsistent input_size: got {input._shape[1]} expected {w_ih._shape[1]}")
    hidden = w_hh._shape[0] // GATES[mode] if w_hh.dim() == 2 else -1
    for k, state in enumerate((h, c) if c is not None else (h,)):
        if state.dim() != 2:
            raise RuntimeError(f"{mode.lower()}_cell: expected 2-D hidden{k}, got {state.dim()}-D")
        if state._shape[0] != input._shape[0]:
            raise RuntimeError(
                f"Input batch size {input._shape[0]} doesn't match hidden{k} batch size {state._shape[0]}"
            )
        if state._shape[1] != hidden:
            raise RuntimeError(f"hidden{k} has inconsistent hidden_size: got {state._shape[1]}, expected {hidden}")
    gates = _input_gates(input, w_ih, b_ih).unsqueeze(0)
    _, h, c, _, _ = _rnn_layer(gates, h, c, w_hh, b_hh, None, mode)
    return h, c


def lstm_cell(input: Tensor, hx, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None, b_hh: Tensor | None = None):
    """``torch.lstm_cell``: one LSTM step of a ``(batch, input_size)`` input from ``hx = (h, c)``; ``(h', c')``."""
    return _cell("LSTM", input, hx[0], hx[1], w_ih, w_hh, b_ih, b_hh)


def gru_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None, b_hh=None):
    """``torch.gru_cell``: one GRU step of a ``(batch, input_size)`` input from ``hx``; the next state."""
    return _cell("GRU", input, hx, None, w_ih, w_hh, b_ih, b_hh)[0]


def rnn_tanh_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None, b_hh=None):
    """``torch.rnn_tanh_cell``: one Elman step ``tanh(x w_ihᵀ + b_ih + h w_hhᵀ + b_hh)``; the next state."""
    return _cell("RNN_TANH", input, hx, None, w_ih, w_hh, b_ih, b_hh)[0]


def rnn_relu_cell(input: Tensor, hx: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None, b_hh=None):
    """``torch.rnn_relu_cell``: one Elman step with ReLU; the next state."""
    return _cell("RNN_RELU", input, hx, None, w_ih, w_hh, b_ih, b_hh)[0]
