"""Affine layers: ``Identity``, ``Linear``, ``Bilinear``, ``LazyLinear``."""

from __future__ import annotations

import math
from typing import Any

from kiln import Tensor, empty
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.modules._lazy import _LazyModuleMixin
from kiln.nn.modules._utils import _optional_parameter
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter, UninitializedParameter

__all__ = ["Identity", "Linear", "Bilinear", "LazyLinear"]


class Identity(Module):
    """Returns its input unchanged; accepts (and ignores) any constructor arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:
        """Return ``input``."""
        return input


class Linear(Module):
    """``y = x @ weight.T + bias`` (``torch.nn.Linear``).

    ``weight`` has shape ``(out_features, in_features)`` and ``bias`` ``(out_features,)``, both
    initialised from ``U(-1/sqrt(in_features), 1/sqrt(in_features))`` like PyTorch.
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty((out_features, in_features), device=device, dtype=dtype))
        _optional_parameter(self, "bias", bias, out_features, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw ``weight`` (Kaiming uniform, ``a=sqrt(5)``) and ``bias`` as at construction."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        """Apply the affine map to the last dimension of ``input``."""
        if input.ndim >= 1 and input.shape[-1] != self.in_features:
            rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
            mat1 = f"{rows}x{input.shape[-1]}" if input.ndim > 1 else f"1x{input.shape[-1]}"
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({mat1} and {self.in_features}x{self.out_features}): "
                f"{self!r} expects input of shape (*, {self.in_features}), got {tuple(input.shape)}"
            )
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        """``in_features=..., out_features=..., bias=...``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """``y = x1ᵀ A x2 + b`` (``torch.nn.Bilinear``): ``weight`` is ``(out, in1, in2)``."""

    def __init__(
        self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        self.weight = Parameter(empty((out_features, in1_features, in2_features), device=device, dtype=dtype))
        _optional_parameter(self, "bias", bias, out_features, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw ``weight`` and ``bias`` from ``U(-1/sqrt(in1), 1/sqrt(in1))``."""
        bound = 1 / math.sqrt(self.weight.size(1))
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        """Apply the bilinear form to the last dimensions of ``input1`` and ``input2``."""
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        """``in1_features=..., in2_features=..., out_features=..., bias=...``."""
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


class NonDynamicallyQuantizableLinear(Linear):
    """A :class:`Linear` under the name PyTorch gives ``MultiheadAttention.out_proj`` (so reprs match;
    ``torch.nn.modules.linear.NonDynamicallyQuantizableLinear``)."""


class LazyLinear(_LazyModuleMixin, Linear):
    """A :class:`Linear` whose ``in_features`` is inferred from the first input (``torch.nn.LazyLinear``).

    Until the first call, ``weight`` and ``bias`` are :class:`~kiln.nn.UninitializedParameter`; the first
    call materialises them, initialises them like ``Linear``, and turns the module into a ``Linear``.
    """

    cls_to_become = Linear
    _in_attr = "in_features"

    def __init__(self, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        Module.__init__(self)
        self.in_features = 0
        self.out_features = out_features
        self._factory = {"device": device, "dtype": dtype}
        self.weight = UninitializedParameter()
        if bias:
            self.bias = UninitializedParameter()
        else:
            self.register_parameter("bias", None)
        self._register_lazy_hooks()

    def initialize_parameters(self, input: Tensor) -> None:
        """Materialise ``weight`` as ``(out_features, input.shape[-1])`` and ``bias``, then initialise them."""
        if not self.has_uninitialized_params():
            self.in_features = self.weight.shape[-1]  # materialised by load_state_dict
            return
        from kiln.autograd.grad_mode import no_grad

        with no_grad():
            self.in_features = input.shape[-1]
            dev = self._factory["device"] or input.device
            self.weight.materialize((self.out_features, self.in_features), device=dev, dtype=self._factory["dtype"])
            if self.bias is not None:
                self.bias.materialize((self.out_features,), device=dev, dtype=self._factory["dtype"])
            self.reset_parameters()
