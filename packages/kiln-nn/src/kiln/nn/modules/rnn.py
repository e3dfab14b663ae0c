"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their single-step cells (``torch.nn.RNN*``).

The recurrences are written with kiln ops (``linear``, ``sigmoid``, ``tanh``), so autograd and every
backend work unchanged. The input projection of a whole sequence is one matmul; only the hidden-state
update loops over time steps in Python. ``RNN``/``LSTM``/``GRU`` also take a
:class:`~kiln.nn.utils.rnn.PackedSequence` and return one, with each sequence's final state taken at its
own last step (as torch's packed path).
"""

from __future__ import annotations

import math
import numbers
import warnings

import kiln
from kiln import Tensor, empty, zeros
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# ---------------------------------------------------------------------------------------- one step


def _rnn_step(x_proj: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None, relu: bool) -> Tensor:
    pre = x_proj + F.linear(h, w_hh, b_hh)
    return pre.relu() if relu else pre.tanh()


def _lstm_step(x_proj, h, c, w_hh, b_hh, w_hr=None):
    gates = x_proj + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    if w_hr is not None:
        h = F.linear(h, w_hr)
    return h, c


def _gru_step(x_proj, h, w_hh, b_hh):
    xr, xz, xn = x_proj.chunk(3, -1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r = (xr + hr).sigmoid()
    z = (xz + hz).sigmoid()
    n = (xn + r * hn).tanh()
    return (1 - z) * n + z * h


# ---------------------------------------------------------------------------------------- layers


def _mini_batch(mod, x: Tensor, batch_sizes) -> int:
    if batch_sizes is not None:
        return int(batch_sizes[0])
    return x.size(0) if mod.batch_first else x.size(1)


def _is_packed(x) -> bool:
    from kiln.nn.utils.rnn import PackedSequence

    return isinstance(x, PackedSequence)


def _permute_hidden(hx, permutation):
    """``hx`` (or each tensor of an LSTM's pair) with its batch dimension reordered by ``permutation``."""
    if permutation is None:
        return hx
    if isinstance(hx, tuple):
        return tuple(h.index_select(1, permutation) for h in hx)
    return hx.index_select(1, permutation)


class RNNBase(Module):
    """Shared parameters, checks and the layer/direction loop of :class:`RNN`, :class:`LSTM`, :class:`GRU`.

    Parameters are named as torch names them: ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` (``_reverse`` suffix for the backward direction, ``weight_hr_l{k}`` for LSTM
    projections), all drawn from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``.
    """

    __constants__ = [
        "mode",
        "input_size",
        "hidden_size",
        "num_layers",
        "bias",
        "batch_first",
        "dropout",
        "bidirectional",
        "proj_size",
    ]

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the probability of an element being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                stacklevel=2,
            )
        if not isinstance(bias, bool):
            raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first should be of type bool, got: {type(batch_first).__name__}")
        if not isinstance(input_size, int):
            raise TypeError(f"input_size should be of type int, got: {type(input_size).__name__}")
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        if not isinstance(hidden_size, int):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        gate_size = _GATES[mode] * hidden_size
        num_directions = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input = input_size if layer == 0 else real_hidden * num_directions
                suffix = "_reverse" if direction == 1 else ""
                params = [
                    (f"weight_ih_l{layer}{suffix}", (gate_size, layer_input)),
                    (f"weight_hh_l{layer}{suffix}", (gate_size, real_hidden)),
                ]
                if bias:
                    params += [(f"bias_ih_l{layer}{suffix}", (gate_size,)), (f"bias_hh_l{layer}{suffix}", (gate_size,))]
                if proj_size > 0:
                    params += [(f"weight_hr_l{layer}{suffix}", (proj_size, hidden_size))]
                for name, shape in params:
                    setattr(self, name, Parameter(empty(shape, device=device, dtype=dtype)))
                names = [n for n, _ in params]
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    @property
    def _flat_weights(self) -> list[Tensor]:
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """The parameters grouped per layer and direction, in torch's order."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """No-op (torch compacts weights for cuDNN here); kept for API compatibility."""

    def reset_parameters(self) -> None:
        """Draw every weight and bias from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        """``input_size, hidden_size`` and every non-default option."""
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # -- checks -------------------------------------------------------------------------------------

    def check_input(self, x: Tensor, batch_sizes=None) -> None:
        """Raise torch's errors for a dtype, rank or feature-size mismatch."""
        w_dtype = self._flat_weights[0].dtype
        if x.dtype != w_dtype:
            raise ValueError(
                f"RNN input dtype ({x.dtype}) does not match weight dtype ({w_dtype}). "
                f"Convert input: input.to({w_dtype}), or convert model: model.to({x.dtype})"
            )
        expected_input_dim = 2 if batch_sizes is not None else 3
        if x.dim() != expected_input_dim:
            raise RuntimeError(f"input must have {expected_input_dim} dimensions, got {x.dim()}")
        if self.input_size != x.size(-1):
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got {x.size(-1)}"
            )

    def get_expected_hidden_size(self, x: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        """``(num_layers * num_directions, batch, proj_size or hidden_size)``."""
        mini_batch = _mini_batch(self, x, batch_sizes)
        num_directions = 2 if self.bidirectional else 1
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        return (self.num_layers * num_directions, mini_batch, real_hidden)

    def check_hidden_size(self, hx: Tensor, expected, msg: str = "Expected hidden size {}, got {}") -> None:
        """Raise ``msg`` when ``hx`` is not ``expected``."""
        if tuple(hx.shape) != tuple(expected):
            raise RuntimeError(msg.format(tuple(expected), list(hx.shape)))

    def _prepare(self, name: str, x: Tensor, says_tensor: bool):
        if x.dim() not in (2, 3):
            raise ValueError(
                f"{name}: Expected input to be 2D or 3D, got {x.dim()}D"
                + (" tensor" if says_tensor else "")
                + " instead"
            )
        is_batched = x.dim() == 3
        if not is_batched:
            x = x.unsqueeze(0 if self.batch_first else 1)
        return x, is_batched

    def _forward_hidden(self, name: str, input: Tensor, hx: Tensor | None, says_tensor: bool):
        """``forward`` of the layers whose state is one hidden tensor (RNN, GRU): ``(output, h_n)``."""
        if _is_packed(input):
            return self._forward_packed(input, hx)
        x, is_batched = self._prepare(name, input, says_tensor)
        if hx is not None:
            if not is_batched and hx.dim() != 2:
                raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.dim()}-D tensor")
            if is_batched and hx.dim() != 3:
                raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.dim()}-D tensor")
            if not is_batched:
                hx = hx.unsqueeze(1)
        else:
            hx = zeros(self.get_expected_hidden_size(x), dtype=x.dtype, device=x.device)
        self.check_input(x)
        self.check_hidden_size(hx, self.get_expected_hidden_size(x))
        out, h_n, _ = self._run(x, hx, None)
        if not is_batched:
            out = out.squeeze(0 if self.batch_first else 1)
            h_n = h_n.squeeze(1)
        return out, h_n

    # -- the recurrence -----------------------------------------------------------------------------

    def _cell_weights(self, idx: int):
        """``(w_ih, w_hh, b_ih, b_hh, w_hr)`` of layer-direction ``idx`` (``None`` for the absent ones)."""
        w = [getattr(self, n) for n in self._all_weights[idx]]
        b_ih, b_hh = (w[2], w[3]) if self.bias else (None, None)
        return w[0], w[1], b_ih, b_hh, (w[-1] if self.proj_size > 0 else None)

    def _cell(self, x_proj: Tensor, h: Tensor, c: Tensor | None, w_hh, b_hh, w_hr):
        """One time step of this layer's cell from the projected input: ``(h', c')`` (``c'`` None but for LSTM)."""
        if self.mode == "LSTM":
            return _lstm_step(x_proj, h, c, w_hh, b_hh, w_hr)
        if self.mode == "GRU":
            return _gru_step(x_proj, h, w_hh, b_hh), None
        return _rnn_step(x_proj, h, w_hh, b_hh, self.mode == "RNN_RELU"), None

    def _layer_output(self, outs: list[Tensor], layer: int) -> Tensor:
        """The directions' outputs of ``layer`` joined, with dropout between layers in training."""
        x = outs[0] if len(outs) == 1 else kiln.cat(outs, -1)
        if self.dropout > 0 and self.training and layer < self.num_layers - 1:
            x = F.dropout(x, self.dropout, True)
        return x

    def _run(self, x: Tensor, h0: Tensor, c0: Tensor | None):
        """Time-major multi-layer, multi-direction recurrence; returns (output, h_n, c_n)."""
        x = x.transpose(0, 1) if self.batch_first else x
        steps = x.shape[0]
        num_directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(num_directions):
                idx = layer * num_directions + direction
                w_ih, w_hh, b_ih, b_hh, w_hr = self._cell_weights(idx)
                x_proj = F.linear(x, w_ih, b_ih)  # (T, B, gates): the whole sequence in one matmul
                h = h0[idx]
                c = c0[idx] if c0 is not None else None
                order = range(steps - 1, -1, -1) if direction == 1 else range(steps)
                ys = [None] * steps
                for t in order:
                    h, c = self._cell(x_proj[t], h, c, w_hh, b_hh, w_hr)
                    ys[t] = h
                outs.append(kiln.stack(ys, 0) if steps else zeros((0, *h.shape), dtype=h.dtype, device=h.device))
                h_n.append(h)
                if c is not None:
                    c_n.append(c)
            x = self._layer_output(outs, layer)
        out = x.transpose(0, 1) if self.batch_first else x
        return out, kiln.stack(h_n, 0), (kiln.stack(c_n, 0) if c0 is not None else None)

    def permute_hidden(self, hx, permutation):
        """``hx`` with its batch dimension reordered by ``permutation`` (``None``: unchanged)."""
        return _permute_hidden(hx, permutation)

    def _run_packed(self, data: Tensor, batch_sizes: list[int], h0: Tensor, c0: Tensor | None):
        """The recurrence over a packed batch (as torch's packed path); returns (packed output, h_n, c_n).

        Sequences are sorted by decreasing length, so at step ``t`` the first ``batch_sizes[t]`` rows run.
        Forward: a sequence's final state is kept when it drops out of the batch. Reverse: the recurrence
        starts from the last step, and each sequence joins with its initial state at its own last step.
        """
        num_directions = 2 if self.bidirectional else 1
        offsets = [0]
        for b in batch_sizes:
            offsets.append(offsets[-1] + b)
        steps = len(batch_sizes)
        x = data
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(num_directions):
                idx = layer * num_directions + direction
                w_ih, w_hh, b_ih, b_hh, w_hr = self._cell_weights(idx)
                x_proj = F.linear(x, w_ih, b_ih)  # (N, gates): every packed step in one matmul
                h_init = h0[idx]
                c_init = c0[idx] if c0 is not None else None

                def step(t, h, c, x_proj=x_proj, w_hh=w_hh, b_hh=b_hh, w_hr=w_hr):
                    return self._cell(x_proj[offsets[t] : offsets[t + 1]], h, c, w_hh, b_hh, w_hr)

                ys = [None] * steps
                if direction == 0:
                    h, c = h_init, c_init
                    done_h, done_c = [], []
                    for t in range(steps):
                        bs = batch_sizes[t]
                        if bs < h.shape[0]:
                            done_h.append(h[bs:])
                            h = h[:bs]
                            if c is not None:
                                done_c.append(c[bs:])
                                c = c[:bs]
                        h, c = step(t, h, c)
                        ys[t] = h
                    h_last = kiln.cat([h, *reversed(done_h)], 0) if done_h else h
                    c_last = (kiln.cat([c, *reversed(done_c)], 0) if done_c else c) if c is not None else None
                else:
                    bs0 = batch_sizes[-1]
                    h = h_init[:bs0]
                    c = c_init[:bs0] if c_init is not None else None
                    for t in range(steps - 1, -1, -1):
                        bs = batch_sizes[t]
                        if bs > h.shape[0]:
                            h = kiln.cat([h, h_init[h.shape[0] : bs]], 0)
                            if c is not None:
                                c = kiln.cat([c, c_init[c.shape[0] : bs]], 0)
                        h, c = step(t, h, c)
                        ys[t] = h
                    h_last, c_last = h, c
                outs.append(kiln.cat(ys, 0))
                h_n.append(h_last)
                if c_last is not None:
                    c_n.append(c_last)
            x = self._layer_output(outs, layer)
        return x, kiln.stack(h_n, 0), (kiln.stack(c_n, 0) if c0 is not None else None)

    def _forward_packed(self, packed, hx):
        """Run a :class:`PackedSequence`; returns (packed output, h_n[, c_n]) in the caller's batch order."""
        from kiln.nn.utils.rnn import PackedSequence

        data, batch_sizes, sorted_indices, unsorted_indices = packed
        bs = [int(b) for b in batch_sizes.tolist()]
        num_directions = 2 if self.bidirectional else 1
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        lstm = self.mode == "LSTM"
        if hx is None:
            h0 = zeros((self.num_layers * num_directions, bs[0], real_hidden), dtype=data.dtype, device=data.device)
            c0 = (
                zeros((self.num_layers * num_directions, bs[0], self.hidden_size), dtype=data.dtype, device=data.device)
                if lstm
                else None
            )
        else:
            hx = _permute_hidden(hx, sorted_indices)
            h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
        self.check_input(data, batch_sizes)
        self.check_hidden_size(
            h0,
            self.get_expected_hidden_size(data, batch_sizes),
            "Expected hidden[0] size {}, got {}" if lstm else "Expected hidden size {}, got {}",
        )
        if lstm:
            self.check_hidden_size(
                c0, self.get_expected_cell_size(data, batch_sizes), "Expected hidden[1] size {}, got {}"
            )
        out, h_n, c_n = self._run_packed(data, bs, h0, c0)
        output = PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices)
        hidden = (h_n, c_n) if lstm else h_n
        return output, _permute_hidden(hidden, unsorted_indices)


def _reject_proj_size(kwargs) -> None:
    if "proj_size" in kwargs:
        raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")


class RNN(RNNBase):
    """Elman RNN ``h_t = tanh(x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh)`` (or ``relu``) (``torch.nn.RNN``).

    ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True, batch_first=False,
    dropout=0.0, bidirectional=False)``; ``forward(input, hx=None)`` returns ``(output, h_n)``.
    """

    def __init__(self, *args, **kwargs) -> None:
        _reject_proj_size(kwargs)
        if len(args) > 3:
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)

    def __setattr__(self, name, value):
        # ``nonlinearity`` is set before Module.__init__ (as in torch), so it must bypass Module's bookkeeping
        if name == "nonlinearity" and "_parameters" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def forward(self, input: Tensor, hx: Tensor | None = None):
        """``(output, h_n)``: every step's top-layer state and every layer's last state."""
        return self._forward_hidden("RNN", input, hx, True)


class LSTM(RNNBase):
    """Long short-term memory (``torch.nn.LSTM``), gates ordered ``i, f, g, o``; ``proj_size`` supported.

    ``forward(input, (h_0, c_0)=None)`` returns ``(output, (h_n, c_n))``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, x: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        """``(num_layers * num_directions, batch, hidden_size)``."""
        mini_batch = _mini_batch(self, x, batch_sizes)
        num_directions = 2 if self.bidirectional else 1
        return (self.num_layers * num_directions, mini_batch, self.hidden_size)

    def forward(self, input: Tensor, hx=None):
        """``(output, (h_n, c_n))``."""
        if _is_packed(input):
            return self._forward_packed(input, hx)
        x, is_batched = self._prepare("LSTM", input, False)
        if hx is None:
            h0 = zeros(self.get_expected_hidden_size(x), dtype=x.dtype, device=x.device)
            c0 = zeros(self.get_expected_cell_size(x), dtype=x.dtype, device=x.device)
        else:
            h0, c0 = hx
            if is_batched and (h0.dim() != 3 or c0.dim() != 3):
                raise RuntimeError(
                    f"For batched 3-D input, hx and cx should also be 3-D but got ({h0.dim()}-D, {c0.dim()}-D) tensors"
                )
            if not is_batched:
                if h0.dim() != 2 or c0.dim() != 2:
                    raise RuntimeError(
                        "For unbatched 2-D input, hx and cx should also be 2-D but got "
                        f"({h0.dim()}-D, {c0.dim()}-D) tensors"
                    )
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        self.check_input(x)
        self.check_hidden_size(h0, self.get_expected_hidden_size(x), "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(c0, self.get_expected_cell_size(x), "Expected hidden[1] size {}, got {}")
        out, h_n, c_n = self._run(x, h0, c0)
        if not is_batched:
            out = out.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return out, (h_n, c_n)


class GRU(RNNBase):
    """Gated recurrent unit (``torch.nn.GRU``), gates ordered ``r, z, n``; returns ``(output, h_n)``."""

    def __init__(self, *args, **kwargs) -> None:
        _reject_proj_size(kwargs)
        super().__init__("GRU", *args, **kwargs)

    def forward(self, input: Tensor, hx: Tensor | None = None):
        """``(output, h_n)``."""
        return self._forward_hidden("GRU", input, hx, False)


# ---------------------------------------------------------------------------------------- cells


class RNNCellBase(Module):
    """``weight_ih`` ``(chunks*hidden, input)``, ``weight_hh`` ``(chunks*hidden, hidden)`` and the two biases."""

    __constants__ = ["input_size", "hidden_size", "bias"]

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(empty((num_chunks * hidden_size, input_size), device=device, dtype=dtype))
        self.weight_hh = Parameter(empty((num_chunks * hidden_size, hidden_size), device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        """``input_size, hidden_size[, bias=False][, nonlinearity=relu]``."""
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = self.__dict__.get("nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s

    def reset_parameters(self) -> None:
        """Draw every weight and bias from ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _batch(self, name: str, x: Tensor, hx, hx_label: str = "hidden"):
        if x.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {x.dim()}D instead")
        if hx is not None and hx.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected {hx_label} to be 1D or 2D, got {hx.dim()}D instead")
        is_batched = x.dim() == 2
        if not is_batched:
            x = x.unsqueeze(0)
        if hx is None:
            hx = zeros((x.size(0), self.hidden_size), dtype=x.dtype, device=x.device)
        elif not is_batched:
            hx = hx.unsqueeze(0)
        return x, hx, is_batched


class RNNCell(RNNCellBase):
    """One Elman RNN step (``torch.nn.RNNCell``): ``h' = tanh(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)``."""

    __constants__ = ["input_size", "hidden_size", "bias", "nonlinearity"]

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", device=None, dtype=None
    ) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """The next hidden state."""
        x, hx, is_batched = self._batch("RNNCell", input, hx)
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        ret = _rnn_step(
            F.linear(x, self.weight_ih, self.bias_ih), hx, self.weight_hh, self.bias_hh, self.nonlinearity == "relu"
        )
        return ret if is_batched else ret.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step (``torch.nn.LSTMCell``); ``forward(input, (h, c))`` returns ``(h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx=None):
        """``(h', c')``."""
        x = input
        if x.dim() not in (1, 2):
            raise ValueError(f"LSTMCell: Expected input to be 1D or 2D, got {x.dim()}D instead")
        if hx is not None:
            for idx, value in enumerate(hx):
                if value.dim() not in (1, 2):
                    raise ValueError(f"LSTMCell: Expected hx[{idx}] to be 1D or 2D, got {value.dim()}D instead")
        is_batched = x.dim() == 2
        if not is_batched:
            x = x.unsqueeze(0)
        if hx is None:
            z = zeros((x.size(0), self.hidden_size), dtype=x.dtype, device=x.device)
            h, c = z, z
        else:
            h, c = (hx[0], hx[1]) if is_batched else (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        h, c = _lstm_step(F.linear(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh, self.bias_hh)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step (``torch.nn.GRUCell``)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """The next hidden state."""
        x, hx, is_batched = self._batch("GRUCell", input, hx)
        ret = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), hx, self.weight_hh, self.bias_hh)
        return ret if is_batched else ret.squeeze(0)
