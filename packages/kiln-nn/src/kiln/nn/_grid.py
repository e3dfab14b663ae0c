"""Spatial transformers (``torch.nn.functional.affine_grid`` and ``grid_sample``), composed from kiln ops.

``grid_sample`` maps the grid's normalised coordinates in [-1, 1] to input positions (``align_corners``
decides whether -1 and 1 are the centres or the outer edges of the corner pixels), applies the padding
mode to them (``border`` clamps, ``reflection`` folds them back into the input), then gathers the
neighbouring pixels of each position from the input and weights them: bilinear (trilinear on 5-D
input), nearest (half to even, as PyTorch's ``nearbyint``) or bicubic (4-D only, cubic convolution
with ``A = -0.75``, the padding applied to each of the 16 taps). Positions outside the input read
zeros. Gradients reach the input through the gathers and the grid through the interpolation weights
and the padding functions, as PyTorch's kernels compute them.
"""

from __future__ import annotations

import math
import warnings

import kiln
from kiln import Tensor
from kiln.backend import composite
from kiln.nn._pool_args import not_implemented, shape_list

__all__ = ["affine_grid", "grid_sample"]

_DEFAULT_ALIGN = (
    "Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. Please specify "
    "align_corners=True if the old behavior is desired. See the documentation of grid_sample for details."
)


def _base_coords(n: int, align_corners: bool, like: Tensor) -> Tensor:
    """The normalised centres of ``n`` pixels along one dim (0 for one pixel)."""
    if n <= 1:
        return kiln.zeros(max(n, 0), dtype=like.dtype, device=like.device)
    steps = kiln.linspace(-1.0, 1.0, n, dtype=like.dtype, device=like.device)
    return steps if align_corners else steps * ((n - 1) / n)


def affine_grid(theta: Tensor, size: list[int], align_corners: bool | None = None) -> Tensor:
    """The sampling grid of a batch of affine maps ``theta`` (``(N, 2, 3)`` for a 4-D ``size``
    ``(N, C, H, W)``, ``(N, 3, 4)`` for a 5-D one) in normalised coordinates: ``(N, H, W, 2)`` or
    ``(N, D, H, W, 3)``, for :func:`grid_sample` (``torch.nn.functional.affine_grid``)."""
    if align_corners is None:
        warnings.warn(_DEFAULT_ALIGN, stacklevel=2)
        align_corners = False
    if not theta.is_floating_point():
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    if len(size) == 4:
        if theta.dim() != 3 or theta.shape[-2] != 2 or theta.shape[-1] != 3:
            raise ValueError(
                f"Expected a batch of 2D affine matrices of shape Nx2x3 for size {size}. Got {theta.shape}."
            )
        spatial = size[-2:]
    elif len(size) == 5:
        if theta.dim() != 3 or theta.shape[-2] != 3 or theta.shape[-1] != 4:
            raise ValueError(
                f"Expected a batch of 3D affine matrices of shape Nx3x4 for size {size}. Got {theta.shape}."
            )
        spatial = size[-3:]
    else:
        raise NotImplementedError(
            "affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, respectively. "
            f"Got size {size}."
        )
    if align_corners and min(spatial) == 1:
        warnings.warn(
            "Since version 1.3.0, affine_grid behavior has changed for unit-size grids when align_corners=True. "
            "This is not an intended use case of affine_grid. See the documentation of affine_grid for details.",
            stacklevel=2,
        )
    elif min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {size}")
    n, nd = size[0], len(spatial)
    if theta.shape[0] != n:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{n}, {nd + 1}] but got: "
            f"[{theta.shape[0]}, {nd + 1}]."
        )
    # base grid (*spatial, nd + 1): the coordinates x, y(, z) (last spatial dim first) and a 1
    axes = [_base_coords(int(s), align_corners, theta) for s in reversed(spatial)]
    count = math.prod(int(s) for s in spatial)
    columns = []
    for i, coords in enumerate(axes):
        shape = [1] * nd
        shape[nd - 1 - i] = int(spatial[nd - 1 - i])
        columns.append(coords.reshape(shape).expand(*[int(s) for s in spatial]).reshape(count))
    columns.append(kiln.ones(count, dtype=theta.dtype, device=theta.device))
    base = kiln.stack(columns, dim=-1)
    grid = base.unsqueeze(0).expand(n, count, nd + 1).bmm(theta.transpose(1, 2))
    return grid.reshape(n, *[int(s) for s in spatial], nd)


# ---------------------------------------------------------------------------------------- grid_sample


def _unnormalize(coord: Tensor, size: int, align_corners: bool) -> Tensor:
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """Fold ``coord`` into [twice_low / 2, twice_high / 2] by reflecting at the ends."""
    if twice_low == twice_high:
        return kiln.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    dist = (coord - low).abs()
    extra = kiln.fmod(dist, span)
    flips = kiln.floor(dist / span).detach()
    return kiln.where(kiln.remainder(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coords(coord: Tensor, size: int, padding_mode: str, align_corners: bool) -> Tensor:
    if padding_mode == "border":
        return coord.clamp(0, size - 1)
    if padding_mode == "reflection":
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return coord.clamp(0, size - 1)
    return coord


class _Reader:
    """Reads input values at integer positions of the output grid: ``read(positions)`` with one
    ``(N, *out)`` int64 tensor per spatial dim gives ``(N, C, *out)``, zeros where a position is outside."""

    def __init__(self, input: Tensor, out_shape: tuple) -> None:
        self.n, self.c = input.shape[:2]
        self.sizes = tuple(input.shape[2:])
        self.flat = input.reshape(self.n, self.c, math.prod(self.sizes))
        self.out_shape = out_shape
        self.count = math.prod(out_shape)

    def read(self, positions: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The values (zeros outside) and the inside mask ``(N, 1, *out)``."""
        inside = None
        flat = None
        for pos, size in zip(positions, self.sizes):
            ok = (pos >= 0) & (pos < size)
            inside = ok if inside is None else inside & ok
            flat = pos if flat is None else flat * size + pos
        flat = kiln.where(inside, flat, 0).reshape(self.n, 1, self.count).expand(self.n, self.c, self.count)
        values = self.flat.gather(2, flat).reshape(self.n, self.c, *self.out_shape)
        mask = inside.reshape(self.n, 1, *self.out_shape)
        return values, mask


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """The cubic-convolution weights (``A = -0.75``) of the 4 taps around fraction ``t``."""
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _check_grid_sample(input: Tensor, grid: Tensor, mode: str, padding_mode: str) -> None:
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(
            f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', but got: '{mode}'"
        )
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(
            "nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or 'reflection', "
            f"but got: '{padding_mode}'"
        )
    if input.device != grid.device:
        raise RuntimeError(
            f"grid_sampler(): expected input and grid to be on same device, but input is on {input.device} and "
            f"grid is on {grid.device}"
        )
    if input.dtype != grid.dtype:
        from kiln.nn._pool_args import scalar_type_name

        raise RuntimeError(
            f"expected scalar type {scalar_type_name(input.dtype)} but found {scalar_type_name(grid.dtype)}"
        )
    sizes = f"input with sizes {shape_list(input.shape)} and grid with sizes {shape_list(grid.shape)}"
    if input.shape[0] != grid.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, but got {sizes}")
    if grid.shape[-1] != input.dim() - 2:
        raise RuntimeError(
            f"grid_sampler(): expected grid to have size {input.dim() - 2} in last dimension, but got grid with "
            f"sizes {shape_list(grid.shape)}"
        )
    for i in range(2, input.dim()):
        if input.shape[i] == 0:
            raise RuntimeError(
                f"grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes "
                f"{shape_list(input.shape)} with dimension {i} being empty"
            )
    nd = 4 if input.dim() == 4 else 5
    if input.dim() != nd or grid.dim() != nd:
        raise RuntimeError(
            f"grid_sampler(): expected {nd}D input and grid with same number of dimensions, but got {sizes}"
        )
    if nd == 5 and mode == "bicubic":
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    if not input.dtype.is_floating_point:
        raise not_implemented("grid_sampler_2d_cpu_kernel_impl" if nd == 4 else "grid_sampler3d_cpu", input.dtype)


@composite(autocast="promote", name="grid_sample")
def grid_sample(
    input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool | None = None
) -> Tensor:
    """Sample ``input`` ``(N, C, H, W)`` at the normalised positions of ``grid`` ``(N, H_out, W_out, 2)``
    (``(x, y)`` in [-1, 1]), or ``(N, C, D, H, W)`` at ``(N, D_out, H_out, W_out, 3)``
    (``torch.nn.functional.grid_sample``).

    ``mode``: ``"bilinear"``, ``"nearest"`` or ``"bicubic"`` (4-D only); ``padding_mode``: what
    positions outside the input read, ``"zeros"``, ``"border"`` (the nearest edge pixel) or
    ``"reflection"``; ``align_corners``: whether -1 and 1 are the corner pixels' centres (True) or
    their outer edges (False, the default, with PyTorch's warning when not given).
    """
    _check_grid_sample(input, grid, mode, padding_mode)
    if align_corners is None:
        warnings.warn(_DEFAULT_ALIGN, stacklevel=2)
        align_corners = False
    nd = input.dim() - 2
    sizes = tuple(input.shape[2:])
    out_shape = tuple(grid.shape[1:-1])
    reader = _Reader(input, out_shape)
    # grid's last dim is (x, y[, z]): x indexes the last spatial dim
    coords = [grid[..., nd - 1 - d] for d in range(nd)]  # per spatial dim, in input order
    coords = [_unnormalize(c, s, align_corners) for c, s in zip(coords, sizes)]
    if mode == "bicubic":
        return _bicubic(reader, coords, sizes, padding_mode, align_corners)
    coords = [_pad_coords(c, s, padding_mode, align_corners) for c, s in zip(coords, sizes)]
    if mode == "nearest":
        rounded = [c.round() for c in coords]
        values, mask = reader.read([r.long() for r in rounded])
        # weight 1 whose gradient is round's (zero): the grid's gradient is zeros, not absent, as in PyTorch
        weight = 1 + sum(r - r.detach() for r in rounded)
        return kiln.where(mask, values * weight.unsqueeze(1), 0)
    lows = [kiln.floor(c).detach() for c in coords]
    out = None
    for corner in range(2**nd):
        positions, weight = [], None
        for d in range(nd):
            high = (corner >> (nd - 1 - d)) & 1
            positions.append((lows[d] + high).long())
            w = (coords[d] - lows[d]) if high else (lows[d] + 1 - coords[d])
            weight = w if weight is None else weight * w
        values, mask = reader.read(positions)
        term = kiln.where(mask, values * weight.unsqueeze(1), 0)
        out = term if out is None else out + term
    return out


def _bicubic(reader: _Reader, coords: list[Tensor], sizes: tuple, padding_mode: str, align_corners: bool) -> Tensor:
    iy, ix = coords
    y0, x0 = kiln.floor(iy).detach(), kiln.floor(ix).detach()
    wy, wx = _cubic_weights(iy - y0), _cubic_weights(ix - x0)
    out = None
    for i in range(4):
        ty = _pad_coords(y0 - 1 + i, sizes[0], padding_mode, align_corners).detach()
        for j in range(4):
            tx = _pad_coords(x0 - 1 + j, sizes[1], padding_mode, align_corners).detach()
            values, mask = reader.read([ty.long(), tx.long()])
            term = kiln.where(mask, values * (wy[i] * wx[j]).unsqueeze(1), 0)
            out = term if out is None else out + term
    return out
