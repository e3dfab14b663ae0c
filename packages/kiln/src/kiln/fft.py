"""``kiln.fft``: the real-valued helpers of ``torch.fft``.

:func:`fftfreq`, :func:`rfftfreq`, :func:`fftshift` and :func:`ifftshift` are here. The transforms
themselves (``fft``, ``rfft``, ``ifft``, ``fft2``, ``fftn``, ``hfft`` and their inverses) return or take
complex tensors, and kiln has no complex dtypes yet: they are listed as left out, with that reason, on
the API coverage page rather than defined to fail.
"""

from __future__ import annotations

from kiln._dispatch import with_out
from kiln._tensor import Tensor

__all__ = ["fftfreq", "fftshift", "ifftshift", "rfftfreq"]


def _freqs(n: int, d: float, count: int, dtype, device, requires_grad: bool, name: str) -> Tensor:
    import kiln

    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name}(): argument 'n' (position 1) must be int, not {type(n).__name__}")
    if n < 0:
        raise RuntimeError(f"{name}: n must be non-negative, got {n}")
    k = kiln.arange(count, dtype=dtype, device=device)
    if name == "fftfreq":
        k = kiln.where(k >= (n + 1) // 2, k - n, k)
    # times 1/(n*d), as PyTorch computes it (k / (n*d) can differ in the last bit); n = 0 gives nan, as there
    scale = 1.0 / (n * d) if n * d else float("nan")
    return (k * scale).requires_grad_(requires_grad)


@with_out
def fftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    """The sample frequencies of an ``n``-point FFT with sample spacing ``d``:
    ``[0, 1, ..., ceil(n/2)-1, -floor(n/2), ..., -1] / (d*n)``."""
    import kiln

    dtype = dtype or kiln.get_default_dtype()
    return _freqs(n, d, n, dtype, device, requires_grad, "fftfreq")


@with_out
def rfftfreq(n: int, d: float = 1.0, *, dtype=None, layout=None, device=None, requires_grad: bool = False) -> Tensor:
    """The non-negative sample frequencies of an ``n``-point real FFT: ``[0, 1, ..., n//2] / (d*n)``."""
    import kiln

    dtype = dtype or kiln.get_default_dtype()
    return _freqs(n, d, n // 2 + 1, dtype, device, requires_grad, "rfftfreq")


def _shift(input: Tensor, dim, sign: int) -> Tensor:
    import kiln

    if dim is None:
        dims = tuple(range(input.dim()))
    elif isinstance(dim, int):
        dims = (dim,)
    else:
        dims = tuple(dim)
    if not dims:  # a 0-d tensor: PyTorch's roll refuses an empty shift list
        raise RuntimeError("`shifts` required")
    shifts = tuple(sign * (input.shape[d] // 2) for d in dims)
    return kiln.roll(input, shifts, dims)


def fftshift(input: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Move the zero-frequency term to the centre: ``roll`` by ``n // 2`` along ``dim`` (every dim by
    default)."""
    return _shift(input, dim, 1)


def ifftshift(input: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """The inverse of :func:`fftshift`: ``roll`` by ``-(n // 2)``."""
    return _shift(input, dim, -1)
