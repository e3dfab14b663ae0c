"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their single-step cells (``torch.nn.RNN*``).

The layers check their arguments as torch does and call the core's ``kiln.lstm`` / ``gru`` / ``rnn_tanh`` /
``rnn_relu`` (the cells ``kiln.lstm_cell``...): each layer and direction is one fused op over the whole
sequence (one matmul for every step's input projection, then the recurrence in one kernel where the
device has one, kiln-cpu does; its decomposition in kiln ops elsewhere). ``RNN``/``LSTM``/``GRU`` also take
a :class:`~kiln.nn.utils.rnn.PackedSequence` and return one, with each sequence's final state taken at
its own last step (as torch's packed path).
"""

from __future__ import annotations

import math
import numbers
import warnings

import kiln
from kiln import Tensor, empty, zeros
from kiln.nn import init
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


_FUNCTIONS = {"LSTM": kiln.lstm, "GRU": kiln.gru, "RNN_TANH": kiln.rnn_tanh, "RNN_RELU": kiln.rnn_relu}


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

    def _run(self, x: Tensor, h0: Tensor, c0: Tensor | None, batch_sizes=None):
        """Every layer and direction through the core's function for the mode: (output, h_n, c_n)."""
        hx = (h0, c0) if self.mode == "LSTM" else h0
        args = (self._flat_weights, self.bias, self.num_layers, self.dropout, self.training, self.bidirectional)
        if batch_sizes is None:
            got = _FUNCTIONS[self.mode](x, hx, *args, self.batch_first)
        else:
            got = _FUNCTIONS[self.mode](x, batch_sizes, hx, *args)
        return got if self.mode == "LSTM" else (*got, None)

    def permute_hidden(self, hx, permutation):
        """``hx`` with its batch dimension reordered by ``permutation`` (``None``: unchanged)."""
        return _permute_hidden(hx, permutation)

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
        out, h_n, c_n = self._run(data, h0, c0, batch_sizes)
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
        step = kiln.rnn_relu_cell if self.nonlinearity == "relu" else kiln.rnn_tanh_cell
        ret = step(x, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
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
        h, c = kiln.lstm_cell(x, (h, c), self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step (``torch.nn.GRUCell``)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """The next hidden state."""
        x, hx, is_batched = self._batch("GRUCell", input, hx)
        ret = kiln.gru_cell(x, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return ret if is_batched else ret.squeeze(0)
