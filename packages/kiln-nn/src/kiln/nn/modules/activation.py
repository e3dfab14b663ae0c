"""Activation layers (``torch.nn.ReLU``, ``GELU``, ``Softmax``, ...): thin modules over ``kiln.nn.functional``."""

from __future__ import annotations

import warnings

from kiln import Tensor, empty
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.modules.attention import MultiheadAttention
from kiln.nn.modules.module import Module
from kiln.nn.parameter import Parameter

__all__ = [  # MultiheadAttention lives in kiln.nn.modules.attention; PyTorch's path names it here
    "MultiheadAttention",
    "Threshold",
    "ReLU",
    "RReLU",
    "Hardtanh",
    "ReLU6",
    "Sigmoid",
    "Hardsigmoid",
    "Tanh",
    "SiLU",
    "Mish",
    "Hardswish",
    "ELU",
    "CELU",
    "SELU",
    "GLU",
    "GELU",
    "Hardshrink",
    "LeakyReLU",
    "LogSigmoid",
    "Softplus",
    "Softshrink",
    "PReLU",
    "Softsign",
    "Tanhshrink",
    "Softmin",
    "Softmax",
    "Softmax2d",
    "LogSoftmax",
]


def _inplace_repr(inplace: bool, sep: str = "") -> str:
    return f"{sep}inplace=True" if inplace else ""


class _Inplace(Module):
    """An elementwise activation whose only option is ``inplace``."""

    __constants__ = ["inplace"]
    _fn = None

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise (into ``input`` when ``inplace``)."""
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        """``inplace=True`` when set, else nothing."""
        return _inplace_repr(self.inplace)


class _Plain(Module):
    """An elementwise activation without options."""

    _fn = None

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return type(self)._fn(input)


class Threshold(Module):
    """``y = x if x > threshold else value`` (``torch.nn.Threshold``)."""

    __constants__ = ["threshold", "value", "inplace"]

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """The thresholded input."""
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        """``threshold=..., value=...[, inplace=True]``."""
        return f"threshold={self.threshold}, value={self.value}{_inplace_repr(self.inplace, ', ')}"


class ReLU(_Inplace):
    """``max(x, 0)`` (``torch.nn.ReLU``)."""

    _fn = staticmethod(F.relu)


class RReLU(Module):
    """Randomised leaky ReLU: slope drawn from ``U(lower, upper)`` in training (``torch.nn.RReLU``)."""

    __constants__ = ["lower", "upper", "inplace"]

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False) -> None:
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """Leaky ReLU with a random slope (training) or the mean slope (eval)."""
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        """``lower=..., upper=...[, inplace=True]``."""
        return f"lower={self.lower}, upper={self.upper}{_inplace_repr(self.inplace, ', ')}"


class Hardtanh(Module):
    """Clamp to ``[min_val, max_val]`` (``torch.nn.Hardtanh``)."""

    __constants__ = ["min_val", "max_val", "inplace"]

    def __init__(
        self,
        min_val: float = -1.0,
        max_val: float = 1.0,
        inplace: bool = False,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> None:
        super().__init__()
        if min_value is not None:
            warnings.warn(
                "keyword argument `min_value` is deprecated and renamed to `min_val`", FutureWarning, stacklevel=2
            )
            min_val = min_value
        if max_value is not None:
            warnings.warn(
                "keyword argument `max_value` is deprecated and renamed to `max_val`", FutureWarning, stacklevel=2
            )
            max_val = max_value
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise AssertionError(f"max_val ({self.max_val}) must be greater than min_val ({self.min_val})")

    def forward(self, input: Tensor) -> Tensor:
        """The clamped input."""
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        """``min_val=..., max_val=...[, inplace=True]``."""
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_repr(self.inplace, ', ')}"


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)`` (``torch.nn.ReLU6``)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        """``inplace=True`` when set, else nothing."""
        return _inplace_repr(self.inplace)


class Sigmoid(_Plain):
    """``1 / (1 + exp(-x))`` (``torch.nn.Sigmoid``)."""

    _fn = staticmethod(F.sigmoid)


class Hardsigmoid(_Inplace):
    """Piecewise-linear sigmoid ``relu6(x + 3) / 6`` (``torch.nn.Hardsigmoid``)."""

    _fn = staticmethod(F.hardsigmoid)

    def extra_repr(self) -> str:
        """Nothing (torch prints no options)."""
        return ""


class Tanh(_Plain):
    """Hyperbolic tangent (``torch.nn.Tanh``)."""

    _fn = staticmethod(F.tanh)


class SiLU(_Inplace):
    """``x * sigmoid(x)`` (``torch.nn.SiLU``)."""

    _fn = staticmethod(F.silu)


class Mish(_Inplace):
    """``x * tanh(softplus(x))`` (``torch.nn.Mish``)."""

    _fn = staticmethod(F.mish)


class Hardswish(_Inplace):
    """``x * relu6(x + 3) / 6`` (``torch.nn.Hardswish``)."""

    _fn = staticmethod(F.hardswish)

    def extra_repr(self) -> str:
        """Nothing (torch prints no options)."""
        return ""


class ELU(Module):
    """``x if x > 0 else alpha * (exp(x) - 1)`` (``torch.nn.ELU``)."""

    __constants__ = ["alpha", "inplace"]

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        """``alpha=...[, inplace=True]``."""
        return f"alpha={self.alpha}{_inplace_repr(self.inplace, ', ')}"


class CELU(ELU):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))`` (``torch.nn.CELU``)."""

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return F.celu(input, self.alpha, self.inplace)


class SELU(_Inplace):
    """Scaled ELU with the self-normalising constants (``torch.nn.SELU``)."""

    _fn = staticmethod(F.selu)


class GLU(Module):
    """Gated linear unit: ``a * sigmoid(b)`` for the halves of ``dim`` (``torch.nn.GLU``)."""

    __constants__ = ["dim"]

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        """The gated input (half as long along ``dim``)."""
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        """``dim=...``."""
        return f"dim={self.dim}"


class GELU(Module):
    """Gaussian error linear unit, exact or ``approximate='tanh'`` (``torch.nn.GELU``)."""

    __constants__ = ["approximate"]

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        """``approximate='...'``."""
        return f"approximate={self.approximate!r}"


class Hardshrink(Module):
    """``x if |x| > lambd else 0`` (``torch.nn.Hardshrink``)."""

    __constants__ = ["lambd"]

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:
        """The shrunk input."""
        return F.hardshrink(input, self.lambd)

    def extra_repr(self) -> str:
        """The threshold."""
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    """``x - lambd*sign(x) if |x| > lambd else 0`` (``torch.nn.Softshrink``)."""

    def forward(self, input: Tensor) -> Tensor:
        """The shrunk input."""
        return F.softshrink(input, self.lambd)

    def extra_repr(self) -> str:
        """The threshold."""
        return str(self.lambd)


class LeakyReLU(Module):
    """``x if x >= 0 else negative_slope * x`` (``torch.nn.LeakyReLU``)."""

    __constants__ = ["inplace", "negative_slope"]

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        """``negative_slope=...[, inplace=True]``."""
        return f"negative_slope={self.negative_slope}{_inplace_repr(self.inplace, ', ')}"


class LogSigmoid(_Plain):
    """``log(sigmoid(x))`` computed stably (``torch.nn.LogSigmoid``)."""

    _fn = staticmethod(F.logsigmoid)


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold`` (``torch.nn.Softplus``)."""

    __constants__ = ["beta", "threshold"]

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input: Tensor) -> Tensor:
        """The activation applied elementwise."""
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        """``beta=..., threshold=...``."""
        return f"beta={self.beta}, threshold={self.threshold}"


class PReLU(Module):
    """Leaky ReLU with a learnt slope per channel (or one shared), initialised to ``init`` (``torch.nn.PReLU``)."""

    __constants__ = ["num_parameters"]

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None) -> None:
        self.num_parameters = num_parameters
        super().__init__()
        self.init = init
        self.weight = Parameter(empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill ``weight`` with ``init``."""
        init.constant_(self.weight, self.init)

    def forward(self, input: Tensor) -> Tensor:
        """The activation with the learnt slopes (channel dim 1)."""
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        """``num_parameters=...``."""
        return f"num_parameters={self.num_parameters}"


class Softsign(_Plain):
    """``x / (1 + |x|)`` (``torch.nn.Softsign``)."""

    _fn = staticmethod(F.softsign)


class Tanhshrink(_Plain):
    """``x - tanh(x)`` (``torch.nn.Tanhshrink``)."""

    _fn = staticmethod(F.tanhshrink)


class _SoftmaxBase(Module):
    __constants__ = ["dim"]
    _fn = None

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input: Tensor) -> Tensor:
        """The normalised input along ``dim`` (an implicit ``dim`` warns, as in torch)."""
        return type(self)._fn(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        """``dim=...``."""
        return f"dim={self.dim}"


class Softmin(_SoftmaxBase):
    """``softmax(-x)`` along ``dim`` (``torch.nn.Softmin``)."""

    _fn = staticmethod(F.softmin)


class Softmax(_SoftmaxBase):
    """``exp(x) / sum(exp(x))`` along ``dim`` (``torch.nn.Softmax``)."""

    _fn = staticmethod(F.softmax)


class LogSoftmax(_SoftmaxBase):
    """``log(softmax(x))`` along ``dim``, computed stably (``torch.nn.LogSoftmax``)."""

    _fn = staticmethod(F.log_softmax)


class Softmax2d(Module):
    """Softmax over the channels of ``(N, C, H, W)`` or ``(C, H, W)`` (``torch.nn.Softmax2d``)."""

    def forward(self, input: Tensor) -> Tensor:
        """Softmax along dim -3."""
        if input.dim() not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.dim()}D instead")
        return F.softmax(input, -3, _stacklevel=5)
