"""Finite differences and integration: ``diff``, ``gradient``, ``trapezoid`` (``trapz``) and
``cumulative_trapezoid``, composites of slicing, arithmetic and ``cumsum`` (so their gradients come from those
ops' formulas), with PyTorch's argument checks and messages.
"""

from __future__ import annotations

from kiln import _dtype as dt
from kiln._ops._meta import is_scalar, reduce_dims, wrap_dim
from kiln._ops.math_args import _need_tensor
from kiln._tensor import Tensor

__all__ = ["diff", "gradient", "trapezoid", "trapz", "cumulative_trapezoid"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- diff


def _first_difference(x: Tensor, dim: int) -> Tensor:
    n = x.shape[dim]
    later, earlier = x.narrow(dim, 1, max(n - 1, 0)), x.narrow(dim, 0, max(n - 1, 0))
    if x.dtype is dt.bool:  # PyTorch: a bool "difference" is XOR
        return later ^ earlier
    return later - earlier


def diff(
    input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None, append: Tensor | None = None
) -> Tensor:
    """The ``n``-th forward difference along ``dim`` (``out[i] = input[i + 1] - input[i]``, applied ``n``
    times), after concatenating ``prepend`` and ``append`` along ``dim``; XOR for bool tensors."""
    _need_tensor(input, "input", 1, "diff")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"diff(): argument 'n' must be int, not {type(n).__name__}")
    for name, t in (("prepend", prepend), ("append", append)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"diff(): argument '{name}' must be Tensor, not {type(t).__name__}")
    if input.dim() == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    dim = wrap_dim(dim, input.dim())
    for t in (prepend, append):
        if t is not None and t.dim() != input.dim():
            raise RuntimeError("diff expects prepend or append to be the same dimension as input")
    x = input
    if prepend is not None or append is not None:
        from kiln._ops.shape import cat

        x = cat([t for t in (prepend, x, append) if t is not None], dim)
    for _ in range(n):
        if x.shape[dim] == 0:
            break
        x = _first_difference(x, dim)
    return x if n else x.clone()


# ---------------------------------------------------------------------------------------- gradient


def _gradient_spacing(input: Tensor, spacing, dims: tuple) -> list:
    """Per dim in ``dims``: a number (uniform spacing) or a 1-D tensor of coordinates."""
    if spacing is None:
        return [1] * len(dims)
    if isinstance(spacing, Tensor):
        if spacing.dim() == 0:
            return [spacing.item()] * len(dims)
        raise TypeError(
            "gradient() received an invalid combination of arguments - got (Tensor, spacing=Tensor), but "
            "expected one of:\n * (Tensor input, *, tuple of ints dim, int edge_order = 1)\n * (Tensor input, *, "
            "Number spacing, tuple of ints dim, int edge_order = 1)\n * (Tensor input, *, Number spacing = None, "
            "int dim = None, int edge_order = 1)\n * (Tensor input, *, tuple of Scalars spacing, int dim = None, "
            "int edge_order = 1)\n * (Tensor input, *, tuple of Scalars spacing, tuple of ints dim, int edge_order = "
            "1)\n * (Tensor input, *, tuple of Tensors spacing, int dim = None, int edge_order = 1)\n * (Tensor "
            "input, *, tuple of Tensors spacing, tuple of ints dim, int edge_order = 1)\n"
        )
    if is_scalar(spacing):
        return [spacing] * len(dims)
    spacing = list(spacing)
    if any(isinstance(s, Tensor) for s in spacing):
        for i, s in enumerate(spacing):
            if not isinstance(s, Tensor):
                raise TypeError(f"expected Tensor as element {i} in argument 1, but got {type(s).__name__}")
            if s.dim() != 1:
                raise RuntimeError(
                    "kiln.gradient expected each element of spacing to have one dimension, but got an element "
                    f"with {s.dim()} dimensions!"
                )
    return spacing


def _gradient_along(f: Tensor, dim: int, h, edge_order: int) -> Tensor:
    """One partial derivative: second-order central differences inside, one-sided ones of ``edge_order`` at
    the two ends (NumPy's and PyTorch's formulas), for a uniform spacing ``h`` or coordinates ``h``."""
    from kiln._ops.shape import cat

    n = f.shape[dim]

    def part(start, length):
        return f.narrow(dim, start, length)

    if not isinstance(h, Tensor):
        inner = (part(2, n - 2) - part(0, n - 2)) / (2 * h)
        if edge_order == 1:
            first = (part(1, 1) - part(0, 1)) / h
            last = (part(n - 1, 1) - part(n - 2, 1)) / h
        else:
            first = (part(0, 1) * -1.5 + part(1, 1) * 2 - part(2, 1) * 0.5) / h
            last = (part(n - 3, 1) * 0.5 - part(n - 2, 1) * 2 + part(n - 1, 1) * 1.5) / h
        return cat([first, inner, last], dim)
    shape = [1] * f.dim()
    shape[dim] = -1
    d = (h[1:] - h[:-1]).reshape(shape)  # the steps between neighbouring coordinates, along ``dim``
    dx1, dx2 = d.narrow(dim, 0, n - 2), d.narrow(dim, 1, n - 2)
    a = -dx2 / (dx1 * (dx1 + dx2))
    b = (dx2 - dx1) / (dx1 * dx2)
    c = dx1 / (dx2 * (dx1 + dx2))
    inner = a * part(0, n - 2) + b * part(1, n - 2) + c * part(2, n - 2)
    if edge_order == 1:
        first = (part(1, 1) - part(0, 1)) / d.narrow(dim, 0, 1)
        last = (part(n - 1, 1) - part(n - 2, 1)) / d.narrow(dim, n - 2, 1)
    else:
        dx1, dx2 = d.narrow(dim, 0, 1), d.narrow(dim, 1, 1)
        a = -(2 * dx1 + dx2) / (dx1 * (dx1 + dx2))
        b = (dx1 + dx2) / (dx1 * dx2)
        c = -dx1 / (dx2 * (dx1 + dx2))
        first = a * part(0, 1) + b * part(1, 1) + c * part(2, 1)
        dx1, dx2 = d.narrow(dim, n - 3, 1), d.narrow(dim, n - 2, 1)
        a = dx2 / (dx1 * (dx1 + dx2))
        b = -(dx2 + dx1) / (dx1 * dx2)
        c = (2 * dx2 + dx1) / (dx2 * (dx1 + dx2))
        last = a * part(n - 3, 1) + b * part(n - 2, 1) + c * part(n - 1, 1)
    return cat([first, inner, last], dim)


def gradient(input: Tensor, *, spacing=1, dim=None, edge_order: int = 1) -> tuple[Tensor, ...]:
    """The partial derivatives of the function sampled by ``input`` along each dim of ``dim`` (every dim by
    default), one tensor each: second-order central differences inside, one-sided differences of
    ``edge_order`` (1 or 2) at the boundaries. ``spacing``: a number, one number per dim, or one 1-D tensor
    of coordinates per dim."""
    _need_tensor(input, "input", 1, "gradient")
    if input.dim() == 0:
        return ()
    if dim is None:
        dims = tuple(range(input.dim()))
    elif isinstance(dim, int):
        dims = (wrap_dim(dim, input.dim()),)
    else:
        dims = tuple(wrap_dim(d, input.dim()) for d in dim)
        reduce_dims(dims, input.dim())  # PyTorch's "dim 0 appears multiple times in the list of dims"
    if not is_scalar(spacing) and not isinstance(spacing, Tensor) and spacing is not None:
        given = len(list(spacing))
        if given != len(dims):
            if dim is None:
                raise RuntimeError(
                    "kiln.gradient expected spacing to be unspecified, a scalar, or a list of length equal to "
                    f"'self.dim() = {input.dim()}', since dim argument was not given, but got a list of length "
                    f"{given}"
                )
            raise RuntimeError(
                "kiln.gradient expected spacing to be unspecified, a scalar or it's spacing and dim arguments to "
                f"have the same length, but got a spacing argument of length {given} and a dim argument of length "
                f"{len(dims)}."
            )
    spacing = _gradient_spacing(input, spacing, dims)
    if edge_order not in (1, 2):
        raise RuntimeError("kiln.gradient only supports edge_order=1 and edge_order=2.")
    for d in dims:
        if input.shape[d] < edge_order + 1:
            raise RuntimeError("kiln.gradient expected each dimension size to be at least edge_order+1")
    return tuple(_gradient_along(input, d, h, edge_order) for d, h in zip(dims, spacing))


# ---------------------------------------------------------------------------------------- trapezoid


_OVERLOADS = {
    "trapz": " * (Tensor y, *, float dx = 1, int dim = -1)\n * (Tensor y, Tensor x, *, int dim = -1)\n",
    "trapezoid": " * (Tensor y, Tensor x, *, int dim = -1)\n * (Tensor y, *, Number dx = 1, int dim = -1)\n",
}


def _trapezoid_args(name: str, y, x, dx, dim):
    _need_tensor(y, "y", 1, name)
    overloads = _OVERLOADS.get(name, _OVERLOADS["trapezoid"])
    if x is not None and dx is not None:
        raise TypeError(
            f"{name}() received an invalid combination of arguments - got (Tensor, Tensor, dx={type(dx).__name__}), "
            f"but expected one of:\n{overloads}"
        )
    if x is not None and not isinstance(x, Tensor):
        raise TypeError(
            f"{name}() received an invalid combination of arguments - got (Tensor, {type(x).__name__}), but expected "
            f"one of:\n{overloads}"
        )
    if y.dtype is dt.bool:
        raise RuntimeError(
            f"{name.replace('trapz', 'trapezoid')}: received a bool input for `y`, but bool is not supported"
        )
    if isinstance(dx, Tensor):
        dx = dx.item()
    if y.dim() == 0:
        if name == "cumulative_trapezoid":
            raise IndexError("slice() cannot be applied to a 0-dim tensor.")
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    dim = wrap_dim(dim, y.dim())
    if not y.dtype.is_floating_point:
        y = y.to(dt.get_default_dtype())
    return y, (1 if dx is None else dx), dim


def _steps(name: str, y: Tensor, x: Tensor, dim: int) -> Tensor:
    """The steps of the sample coordinates ``x`` along ``dim``, broadcastable against ``y``'s pairs."""
    if x.dim() == 1:
        if x.shape[0] != y.shape[dim]:
            raise RuntimeError(f"{name}: There must be one `x` value for each sample point")
        shape = [1] * y.dim()
        shape[dim] = -1
        return (x[1:] - x[:-1]).reshape(shape)
    return diff(x, dim=dim)


def trapezoid(y: Tensor, x: Tensor | None = None, *, dx=None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along ``dim``: the integral of the samples ``y`` at spacing ``dx`` (1 by default)
    or at the coordinates ``x`` (one per sample, or broadcasting against ``y``)."""
    return _trapezoid("trapezoid", y, x, dx, dim)


def _trapezoid(name: str, y, x, dx, dim) -> Tensor:
    y, dx, dim = _trapezoid_args(name, y, x, dx, dim)
    n = y.shape[dim]
    if n == 0:
        return y.sum(dim)
    pairs = y.narrow(dim, 1, n - 1) + y.narrow(dim, 0, n - 1)
    if x is not None:
        return (_steps("trapezoid", y, x, dim) * pairs).sum(dim) / 2
    return (y.sum(dim) - (y.select(dim, 0) + y.select(dim, -1)) * 0.5) * dx


def trapz(y: Tensor, x: Tensor | None = None, *, dx=None, dim: int = -1) -> Tensor:
    """Alias of :func:`trapezoid`."""
    return _trapezoid("trapz", y, x, dx, dim)


def cumulative_trapezoid(y: Tensor, x: Tensor | None = None, *, dx=None, dim: int = -1) -> Tensor:
    """The running trapezoidal rule along ``dim``: element ``i`` integrates the samples 0 to i + 1 (one
    element fewer than ``y`` along ``dim``)."""
    y, dx, dim = _trapezoid_args("cumulative_trapezoid", y, x, dx, dim)
    n = y.shape[dim]
    if n == 0:
        return y.narrow(dim, 0, 0) * dx
    pairs = y.narrow(dim, 1, n - 1) + y.narrow(dim, 0, n - 1)
    if x is not None:
        return (_steps("cumulative_trapezoid", y, x, dim) * pairs / 2).cumsum(dim)
    return (pairs * (dx / 2)).cumsum(dim)


Tensor.diff = diff
