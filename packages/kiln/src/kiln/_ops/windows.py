"""Window functions for spectral analysis: ``bartlett_window``, ``blackman_window``, ``hamming_window``,
``hann_window`` and ``kaiser_window``.

Each is periodic by default (the first ``window_length`` values of the symmetric window one longer, as
spectral code wants) or symmetric with ``periodic=False``; a window of length 1 is ``[1.]``. Values are
computed on the host in float64 and rounded to the requested floating dtype.
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._memory_format import strided
from kiln._ops.copy import from_host, resolve_device
from kiln._ops.creation import _dtype_arg, _finish, _unsupported
from kiln._tensor import Tensor

__all__ = ["bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window"]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _options(d: dt.dtype, dev) -> str:
    return (
        f"TensorOptions(dtype={dt.CPP_TYPE_NAMES[d]}, device={dev}, layout=Strided (default), requires_grad=false "
        "(default), pinned_memory=false, memory_format=(nullopt))"
    )


def _window(name: str, window_length, periodic, dtype, device, layout, requires_grad, fn, pin_memory=False) -> Tensor:
    """The window ``fn(n, N)`` at ``n = 0 .. window_length - 1``, ``N`` the symmetric length minus one."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    if isinstance(window_length, bool) or not isinstance(window_length, numbers.Integral):
        raise TypeError(
            f"{name}(): argument 'window_length' (position 1) must be int, not {type(window_length).__name__}"
        )
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    dev = resolve_device(device)
    if not d.is_floating_point:
        raise RuntimeError(f"{name} expects floating point dtypes, got: {_options(d, dev)}")
    if window_length < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={window_length}")
    length = int(window_length)
    if length <= 1:
        values = np.ones(length)
    else:
        n_total = length if periodic else length - 1
        values = fn(np.arange(length, dtype=np.float64), float(n_total))
    return _finish(from_host(values, d, dev), requires_grad)


def bartlett_window(
    window_length: int, periodic: bool = True, *, dtype=None, layout=strided, device=None, requires_grad: bool = False
) -> Tensor:
    """The triangular (Bartlett) window: ``1 - |2n / N - 1|``."""
    return _window(
        "bartlett_window",
        window_length,
        periodic,
        dtype,
        device,
        layout,
        requires_grad,
        lambda n, big_n: 1.0 - np.abs(2.0 * n / big_n - 1.0),
    )


def blackman_window(
    window_length: int, periodic: bool = True, *, dtype=None, layout=strided, device=None, requires_grad: bool = False
) -> Tensor:
    """The Blackman window: ``0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)``."""
    return _window(
        "blackman_window",
        window_length,
        periodic,
        dtype,
        device,
        layout,
        requires_grad,
        lambda n, big_n: 0.42 - 0.5 * np.cos(2 * np.pi * n / big_n) + 0.08 * np.cos(4 * np.pi * n / big_n),
    )


def hamming_window(
    window_length: int,
    periodic: bool = True,
    alpha: float = 0.54,
    beta: float = 0.46,
    *,
    dtype=None,
    layout=strided,
    device=None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> Tensor:
    """The generalised Hamming window: ``alpha - beta cos(2 pi n / N)``."""
    return _window(
        "hamming_window",
        window_length,
        periodic,
        dtype,
        device,
        layout,
        requires_grad,
        lambda n, big_n: alpha - beta * np.cos(2 * np.pi * n / big_n),
        pin_memory,
    )


def hann_window(
    window_length: int, periodic: bool = True, *, dtype=None, layout=strided, device=None, requires_grad: bool = False
) -> Tensor:
    """The Hann window: ``0.5 - 0.5 cos(2 pi n / N)``."""
    return _window(
        "hann_window",
        window_length,
        periodic,
        dtype,
        device,
        layout,
        requires_grad,
        lambda n, big_n: 0.5 - 0.5 * np.cos(2 * np.pi * n / big_n),
    )


def kaiser_window(
    window_length: int,
    periodic: bool = True,
    beta: float = 12.0,
    *,
    dtype=None,
    layout=strided,
    device=None,
    requires_grad: bool = False,
) -> Tensor:
    """The Kaiser window of shape parameter ``beta``: ``I0(beta sqrt(1 - (2n / N - 1)^2)) / I0(beta)``, ``I0``
    the modified Bessel function of order zero."""
    return _window(
        "kaiser_window",
        window_length,
        periodic,
        dtype,
        device,
        layout,
        requires_grad,
        lambda n, big_n: np.i0(beta * np.sqrt(np.clip(1.0 - (2.0 * n / big_n - 1.0) ** 2, 0.0, None))) / np.i0(beta),
    )
