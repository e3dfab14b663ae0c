"""nn primitives: resampling (``interpolate``, ``pixel_shuffle``, ``pixel_unshuffle``; ``torch.nn.functional``
names and semantics).

``interpolate`` maps onto the separable linear map op (:func:`kiln._ops.separable._separable`); pixel
(un)shuffle are reshape/permute compositions.
"""

from __future__ import annotations

import math

from kiln._ops.separable import _separable

__all__ = ["interpolate", "pixel_shuffle", "pixel_unshuffle"]

TOP_LEVEL = (
    "pixel_shuffle",
    "pixel_unshuffle",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


# ---------------------------------------------------------------------------------------- interpolate

_INTERP_MODES = "nearest | linear | bilinear | bicubic | trilinear | lanczos | area | nearest-exact"


def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """Resample ``input`` (``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)``) to ``size`` or by
    ``scale_factor``: modes ``'nearest'``, ``'nearest-exact'``, ``'linear'`` (3-d), ``'bilinear'`` (4-d,
    optionally ``antialias``), ``'bicubic'`` (4-d), ``'trilinear'`` (5-d) and ``'area'`` (3-d/4-d)."""
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError(
                "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | "
                "trilinear"
            )
    elif align_corners is None:
        align_corners = False
    dim = input.dim() - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got input with spatial "
                    f"dimensions of {list(input.shape[2:])} and output size of {size}. Please provide input tensor "
                    "in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format."
                )
            output_size = tuple(size)
        else:
            output_size = (size,) * max(dim, 0)
        scale_factors = None
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, but got input with "
                    f"spatial dimensions of {list(input.shape[2:])} and scale_factor of shape {scale_factor}. Please "
                    "provide input tensor in (N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) format."
                )
            scale_factors = tuple(float(v) for v in scale_factor)
        else:
            scale_factors = (float(scale_factor),) * max(dim, 0)
        output_size = None
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor is not None and recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and output_size is None:
        recompute_scale_factor = True
    if recompute_scale_factor is not None and recompute_scale_factor:
        output_size = tuple(math.floor(float(input.shape[i + 2]) * scale_factors[i]) for i in range(dim))
        scale_factors = None
    if antialias and not (mode in ("bilinear", "bicubic") and input.dim() == 4):
        raise ValueError(
            "Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires a 4-D tensor as input"
        )
    if output_size is None:
        output_size = tuple(math.floor(float(input.shape[i + 2]) * scale_factors[i]) for i in range(dim))
    scales = scale_factors if scale_factors is not None else (None,) * len(output_size)
    output_size = tuple(int(v) for v in output_size)
    n = input.dim()
    if n in (3, 4, 5) and mode in ("nearest", "nearest-exact"):
        kind = "upsample_nearest" if mode == "nearest" else "upsample_nearest_exact"
        return _separable(input, kind, (output_size, scales))
    if mode == "area" and n in (3, 4):
        return _separable(input, "adaptive_avg_pool", (output_size,))
    linear_dims = {"linear": 3, "bilinear": 4, "trilinear": 5}
    if linear_dims.get(mode) == n:
        kind = "upsample_bilinear_aa" if antialias else "upsample_linear"
        return _separable(input, kind, (output_size, bool(align_corners), scales))
    if mode == "bicubic" and n == 4:
        if antialias:
            raise NotImplementedError("interpolate(): antialias=True with mode 'bicubic' is not supported by kiln yet")
        return _separable(input, "upsample_bicubic", (output_size, bool(align_corners), scales))
    if mode in linear_dims and n in (3, 4, 5):
        raise NotImplementedError(f"Got {n}D input, but {mode} mode needs {linear_dims[mode]}D input")
    if n in (3, 4, 5) and mode in ("area", "lanczos"):
        raise NotImplementedError(f"interpolate(): mode {mode!r} on {n}D input is not supported by kiln yet")
    raise NotImplementedError(
        f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {n}D) for the modes: {_INTERP_MODES} "
        f"(got {mode})"
    )


# ---------------------------------------------------------------------------------------- pixel shuffle


def _pixel_args(name: str, input, factor, factor_name: str) -> tuple[int, tuple, tuple]:
    """(factor, leading dims, (C, H, W)) after the checks both pixel ops share."""
    r = int(factor)
    shape = tuple(input.shape)
    if len(shape) < 3:
        raise RuntimeError(
            f"{name} expects input to have at least 3 dimensions, but got input with {len(shape)} dimension(s)"
        )
    if r <= 0:
        raise RuntimeError(f"{name} expects a positive {factor_name}, but got {r}")
    return r, shape[:-3], shape[-3:]


def pixel_shuffle(input, upscale_factor):
    """Rearrange ``(*, C*r*r, H, W)`` into ``(*, C, H*r, W*r)``."""
    r, lead, (c, h, w) = _pixel_args("pixel_shuffle", input, upscale_factor, "upscale_factor")
    if c % (r * r):
        raise RuntimeError(
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, "
            f"but input.size(-3)={c} is not divisible by {r * r}"
        )
    nl = len(lead)
    x = input.reshape(lead + (c // (r * r), r, r, h, w))
    x = x.permute(*range(nl), nl, nl + 3, nl + 1, nl + 4, nl + 2)
    return x.reshape(lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """Rearrange ``(*, C, H*r, W*r)`` into ``(*, C*r*r, H, W)`` (the inverse of :func:`pixel_shuffle`)."""
    r, lead, (c, h, w) = _pixel_args("pixel_unshuffle", input, downscale_factor, "downscale_factor")
    for dim, what, size in ((-2, "height", h), (-1, "width", w)):
        if size % r:
            raise RuntimeError(
                f"pixel_unshuffle expects {what} to be divisible by downscale_factor, but input.size({dim})={size} is "
                f"not divisible by {r}"
            )
    nl = len(lead)
    x = input.reshape(lead + (c, h // r, r, w // r, r))
    x = x.permute(*range(nl), nl, nl + 2, nl + 4, nl + 1, nl + 3)
    return x.reshape(lead + (c * r * r, h // r, w // r))
