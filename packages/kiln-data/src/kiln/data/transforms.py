"""kiln.data.transforms: image transforms (``torchvision.transforms``) on kiln tensors.

Images are tensors of shape (C, H, W), or batches (N, C, H, W): geometric transforms act on the last
two dimensions, so a batch is transformed in one call (one random draw for the whole batch, as in
torchvision). Float images hold values in [0, 1]; :class:`ToTensor` makes them from uint8 arrays
(height x width x channels, the form datasets and Pillow give) or Pillow images. Random draws come
from kiln's default generator, so ``kiln.manual_seed`` (in each DataLoader worker: the worker seed)
makes them reproducible. The pixel work happens in NumPy on the tensor's memory.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np

import kiln

__all__ = [
    "Compose",
    "ToTensor",
    "Normalize",
    "Lambda",
    "RandomHorizontalFlip",
    "RandomCrop",
    "CenterCrop",
    "Resize",
    "RandomResizedCrop",
    "RandomRotation",
    "ColorJitter",
    "RandomErasing",
]


# ------------------------------------------------------------------------------------------ helpers


def _rng() -> np.random.Generator:
    # kiln's default CPU generator draws from a NumPy PCG64 stream; drawing a scalar from it directly
    # costs about a microsecond where a dispatched kiln.rand(1).item() costs tens, per sample. The
    # stream is the same one kiln.rand uses, so kiln.manual_seed (and each worker's seed) governs both.
    g = kiln.random.default_generator()
    rng = getattr(g, "_rng", None)
    return rng if isinstance(rng, np.random.Generator) else np.random.Generator(np.random.PCG64(_seed_from(g)))


def _seed_from(g) -> int:
    return int(kiln.randint(0, 2**63 - 1, (), generator=g).item())


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(_rng().random())


def _randint(low: int, high: int) -> int:
    """An integer in ``[low, high)``."""
    return int(_rng().integers(low, high))


def _array(img: kiln.Tensor) -> np.ndarray:
    if not isinstance(img, kiln.Tensor):
        raise TypeError(f"img should be a kiln Tensor. Got {type(img).__name__}")
    if img.dim() < 2:
        raise ValueError(f"Tensor image should have at least 2 dimensions (..., H, W), got {img.dim()}")
    return img.detach().cpu().numpy()


def _tensor(a: np.ndarray, like: kiln.Tensor | None) -> kiln.Tensor:
    """``a`` as a tensor on ``like``'s device (``None``: the CPU)."""
    t = kiln.from_numpy(np.ascontiguousarray(a))
    return t if like is None or like.device.type == "cpu" else t.to(like.device)


_NOT_ARRAY = object()  # Compose's marker: the value in hand is not an array standing for a tensor


def _size_pair(size, name: str = "size") -> tuple[int, int]:
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if isinstance(size, Sequence) and len(size) == 1:
        return int(size[0]), int(size[0])
    if isinstance(size, Sequence) and len(size) == 2:
        return int(size[0]), int(size[1])
    raise ValueError(f"Please provide only two dimensions (h, w) for {name}.")


def _cast_like(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.round(out), info.min, info.max).astype(dtype)
    return out.astype(dtype, copy=False)


def _resize_matrix(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
    """Rows of bilinear (triangle-filter) weights: output pixel i from input pixels (half-pixel centres).

    Without antialiasing this is ``interpolate(mode="bilinear", align_corners=False)``; with it, the
    filter widens by the downscaling factor (Pillow's and PyTorch's ``antialias=True``).
    """
    scale = n_in / n_out
    if antialias and scale > 1.0:
        centers = (np.arange(n_out) + 0.5) * scale
        pos = np.arange(n_in) + 0.5
        w = np.maximum(0.0, 1.0 - np.abs(pos[None, :] - centers[:, None]) / scale)
        return w / w.sum(axis=1, keepdims=True)
    # Two taps per output pixel; the sampling point is clamped into the image as PyTorch's bilinear does.
    src = np.clip((np.arange(n_out) + 0.5) * scale - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    w = np.zeros((n_out, n_in))
    np.add.at(w, (np.arange(n_out), lo), 1.0 - frac)
    np.add.at(w, (np.arange(n_out), hi), frac)
    return w


def _output_size(h: int, w: int, size) -> tuple[int, int]:
    if isinstance(size, numbers.Number) or (isinstance(size, Sequence) and len(size) == 1):
        s = int(size if isinstance(size, numbers.Number) else size[0])
        return (s, int(s * w / h)) if h <= w else (int(s * h / w), s)
    return _size_pair(size)


def _resize_array(a: np.ndarray, size, antialias: bool = True) -> np.ndarray:
    h, w = a.shape[-2:]
    oh, ow = _output_size(h, w, size)
    if (oh, ow) == (h, w):
        return a
    mh = _resize_matrix(h, oh, antialias).astype(np.float32)
    mw = _resize_matrix(w, ow, antialias).astype(np.float32)
    return _cast_like(mh @ a.astype(np.float32, copy=False) @ mw.T, a.dtype)


def _crop_array(a: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    h, w = a.shape[-2:]
    if top < 0 or left < 0 or top + height > h or left + width > w:
        pad = [(0, 0)] * (a.ndim - 2) + [
            (max(0, -top), max(0, top + height - h)),
            (max(0, -left), max(0, left + width - w)),
        ]
        a = np.pad(a, pad)
        top, left = max(top, 0), max(left, 0)
    return a[..., top : top + height, left : left + width]


def _rotate_array(a: np.ndarray, angle: float, center=None, fill=0) -> np.ndarray:
    h, w = a.shape[-2:]
    cx, cy = (w / 2.0, h / 2.0) if center is None else (center[0] + 0.5, center[1] + 0.5)
    theta = math.radians(angle)
    cos, sin = math.cos(theta), math.sin(theta)
    ys, xs = np.mgrid[0:h, 0:w]
    dx, dy = xs + 0.5 - cx, ys + 0.5 - cy
    ix = np.round(cos * dx - sin * dy + cx - 0.5).astype(np.int64)
    iy = np.round(sin * dx + cos * dy + cy - 0.5).astype(np.int64)
    inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    out = np.full_like(a, fill)
    out[..., inside] = a[..., iy[inside], ix[inside]]
    return out


def resize(img: kiln.Tensor, size, antialias: bool = True) -> kiln.Tensor:
    """Bilinear resize of the last two dimensions to ``size`` ((h, w), or an int for the shorter side)."""
    a = _array(img)
    out = _resize_array(a, size, antialias)
    return img if out is a else _tensor(out, img)


def crop(img: kiln.Tensor, top: int, left: int, height: int, width: int) -> kiln.Tensor:
    """The ``height`` x ``width`` window at (``top``, ``left``) of the last two dimensions (zero-padded outside)."""
    return _tensor(_crop_array(_array(img), top, left, height, width).copy(), img)


def rotate(img: kiln.Tensor, angle: float, center=None, fill=0) -> kiln.Tensor:
    """Rotate the last two dimensions by ``angle`` degrees counter-clockwise (nearest pixel)."""
    return _tensor(_rotate_array(_array(img), angle, center, fill), img)


# ------------------------------------------------------------------------------------- transforms


class _ArrayTransform:
    """A transform whose pixel work is a NumPy function of the image's array (``_on_array``).

    Called on a tensor it maps the tensor's memory, applies ``_on_array`` and wraps the result; in a
    :class:`Compose`, consecutive array transforms pass the array along and a tensor is built once at
    the end (per-tensor construction costs more than the pixel work on small images). ``_on_array``
    never writes to its input and may return it unchanged.
    """

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, img: kiln.Tensor) -> kiln.Tensor:
        a = _array(img)
        out = self._on_array(a)
        return img if out is a else _tensor(out, img)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Compose:
    """Apply ``transforms`` one after another (consecutive kiln transforms run on one array, see above)."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img):
        x, like, first = img, _NOT_ARRAY, None  # while like is not _NOT_ARRAY, x is an array standing for a tensor
        for t in self.transforms:
            on_array = getattr(t, "_on_array", None)
            if on_array is not None and (like is not _NOT_ARRAY or isinstance(x, kiln.Tensor)):
                if like is _NOT_ARRAY:
                    like, x = x, _array(x)
                    first = x
                x = on_array(x)
            elif isinstance(t, ToTensor) and like is _NOT_ARRAY:
                x, like = t._to_array(x), None
            else:
                if like is not _NOT_ARRAY:
                    x, like = (like if x is first else _tensor(x, like)), _NOT_ARRAY
                x = t(x)
        if like is not _NOT_ARRAY:
            x = like if x is first else _tensor(x, like)
        return x

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t}" for t in self.transforms)
        return f"{type(self).__name__}({inner}\n)"


class Lambda:
    """Apply a user function."""

    def __init__(self, lambd: Callable) -> None:
        if not callable(lambd):
            raise TypeError(f"Argument lambd should be callable, got {type(lambd).__name__!r}")
        self.lambd = lambd

    def __call__(self, img):
        return self.lambd(img)


class ToTensor:
    """A uint8 HxW(xC) array or Pillow image to a float32 CxHxW tensor in [0, 1] (other dtypes: not scaled)."""

    def _to_array(self, pic) -> np.ndarray:
        if isinstance(pic, kiln.Tensor):
            raise TypeError("pic should be PIL Image or ndarray. Got <class 'kiln.Tensor'>")
        a = np.asarray(pic)
        if a.ndim == 2:
            a = a[:, :, None]
        if a.ndim != 3:
            raise ValueError(f"pic should be 2/3 dimensional. Got {a.ndim} dimensions.")
        chw = a.transpose(2, 0, 1)
        if chw.dtype == np.uint8:
            out = np.empty(chw.shape, dtype=np.float32)
            np.divide(chw, np.float32(255), out=out, dtype=np.float32)
            return out
        return np.ascontiguousarray(chw).copy()

    def __call__(self, pic) -> kiln.Tensor:
        return kiln.from_numpy(np.ascontiguousarray(self._to_array(pic)))

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize(_ArrayTransform):
    """``(img - mean) / std`` per channel (dimension -3), on float CxHxW or NxCxHxW tensors."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean, self.std, self.inplace = list(mean), list(std), inplace
        self._stats: dict = {}  # dtype -> (mean, std) as broadcastable arrays
        if any(s == 0 for s in self.std):
            raise ValueError(f"std evaluated to zero after conversion to {kiln.float32}, leading to division by zero.")

    def _check(self, shape, is_float: bool, dtype) -> None:
        if not is_float:
            raise TypeError(f"Input tensor should be a float tensor. Got {dtype}.")
        if len(shape) < 3:
            raise ValueError(
                f"Expected tensor to be a tensor image of size (..., C, H, W). Got tensor.size() = {shape}"
            )

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        stats = self._stats.get(a.dtype)
        if stats is None:
            self._check(a.shape, a.dtype.kind == "f", a.dtype)
            stats = self._stats[a.dtype] = (
                np.asarray(self.mean, dtype=a.dtype).reshape(-1, 1, 1),
                np.asarray(self.std, dtype=a.dtype).reshape(-1, 1, 1),
            )
        elif a.ndim < 3:
            self._check(a.shape, True, a.dtype)
        out = np.subtract(a, stats[0])
        np.divide(out, stats[1], out=out)
        return out

    def __call__(self, tensor: kiln.Tensor) -> kiln.Tensor:
        self._check(tensor.size(), tensor.is_floating_point(), tensor.dtype)
        if tensor.device.type == "cpu" and not tensor.requires_grad and tensor.dtype.itemsize >= 4:
            if self.inplace:
                tensor.numpy()[...] = self._on_array(tensor.numpy())
                return tensor
            return kiln.from_numpy(self._on_array(tensor.numpy()))
        mean = kiln.tensor(self.mean, dtype=tensor.dtype, device=tensor.device).reshape(-1, 1, 1)
        std = kiln.tensor(self.std, dtype=tensor.dtype, device=tensor.device).reshape(-1, 1, 1)
        if self.inplace:
            return tensor.sub_(mean).div_(std)
        return (tensor - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


class RandomHorizontalFlip(_ArrayTransform):
    """Mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        return a[..., ::-1] if _rng().random() < self.p else a


class CenterCrop(_ArrayTransform):
    """The central ``size`` window (zero-padded if the image is smaller)."""

    def __init__(self, size) -> None:
        self.size = _size_pair(size)

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        h, w = a.shape[-2:]
        th, tw = self.size
        return _crop_array(a, round((h - th) / 2.0), round((w - tw) / 2.0), th, tw)


class RandomCrop(_ArrayTransform):
    """A random ``size`` window, after optional ``padding`` (int, (lr, tb) or (l, t, r, b)) with ``fill``/``padding_mode``."""

    def __init__(self, size, padding=None, pad_if_needed: bool = False, fill=0, padding_mode: str = "constant"):
        self.size = _size_pair(size)
        self.padding, self.pad_if_needed, self.fill, self.padding_mode = padding, pad_if_needed, fill, padding_mode
        if padding_mode not in ("constant", "edge", "reflect", "symmetric"):
            raise ValueError("Padding mode should be either constant, edge, reflect or symmetric")

    def _pad(self, a: np.ndarray, left: int, top: int, right: int, bottom: int) -> np.ndarray:
        pad = [(0, 0)] * (a.ndim - 2) + [(top, bottom), (left, right)]
        if self.padding_mode == "constant":
            return np.pad(a, pad, mode="constant", constant_values=self.fill)
        return np.pad(a, pad, mode=self.padding_mode)

    @staticmethod
    def get_params(img, output_size: tuple[int, int]) -> tuple[int, int, int, int]:
        """A random (top, left, height, width) window of ``output_size`` in ``img`` (a tensor or array)."""
        h, w = img.shape[-2:]
        th, tw = output_size
        if h < th or w < tw:
            raise ValueError(f"Required crop size {(th, tw)} is larger than input image size {(h, w)}")
        if w == tw and h == th:
            return 0, 0, h, w
        return _randint(0, h - th + 1), _randint(0, w - tw + 1), th, tw

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        if self.padding is not None:
            p = self.padding
            p = [p] if isinstance(p, int) else list(p)
            left, top, right, bottom = p * 4 if len(p) == 1 else (p * 2 if len(p) == 2 else p)
            a = self._pad(a, left, top, right, bottom)
        th, tw = self.size
        if self.pad_if_needed and a.shape[-1] < tw:
            a = self._pad(a, tw - a.shape[-1], 0, tw - a.shape[-1], 0)
        if self.pad_if_needed and a.shape[-2] < th:
            a = self._pad(a, 0, th - a.shape[-2], 0, th - a.shape[-2])
        i, j, h, w = self.get_params(a, self.size)
        return a[..., i : i + h, j : j + w]


class Resize(_ArrayTransform):
    """Bilinear resize to ``size`` ((h, w), or an int: the shorter side, keeping the aspect ratio)."""

    def __init__(self, size, interpolation: str = "bilinear", antialias: bool = True) -> None:
        if interpolation != "bilinear":
            raise NotImplementedError(f"kiln transforms resize bilinearly; got interpolation={interpolation!r}")
        self.size, self.antialias = size, antialias

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        return _resize_array(a, self.size, self.antialias)


class RandomResizedCrop(_ArrayTransform):
    """A random crop of random area (``scale``) and aspect ``ratio``, resized to ``size``."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), antialias: bool = True) -> None:
        self.size = _size_pair(size)
        self.scale, self.ratio, self.antialias = scale, ratio, antialias

    @staticmethod
    def get_params(img, scale, ratio) -> tuple[int, int, int, int]:
        """A random (top, left, height, width) window (torchvision's ten tries, then a central crop)."""
        height, width = img.shape[-2:]
        area = height * width
        log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        for _ in range(10):
            target_area = area * _uniform(scale[0], scale[1])
            aspect = math.exp(_uniform(*log_ratio))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                return _randint(0, height - h + 1), _randint(0, width - w + 1), h, w
        in_ratio = width / height
        if in_ratio < min(ratio):
            w, h = width, round(width / min(ratio))
        elif in_ratio > max(ratio):
            h, w = height, round(height * max(ratio))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        i, j, h, w = self.get_params(a, self.scale, self.ratio)
        return _resize_array(_crop_array(a, i, j, h, w), self.size, self.antialias)


class RandomRotation(_ArrayTransform):
    """Rotate by an angle drawn from ``degrees`` (counter-clockwise, about the centre), nearest pixel, ``fill`` outside."""

    def __init__(self, degrees, interpolation: str = "nearest", expand: bool = False, center=None, fill=0) -> None:
        if isinstance(degrees, numbers.Number):
            if degrees < 0:
                raise ValueError("If degrees is a single number, it must be positive.")
            degrees = (-degrees, degrees)
        self.degrees = (float(degrees[0]), float(degrees[1]))
        if interpolation != "nearest":
            raise NotImplementedError(f"kiln's RandomRotation samples the nearest pixel; got {interpolation!r}")
        if expand:
            raise NotImplementedError("RandomRotation(expand=True) is not supported")
        self.center, self.fill = center, fill

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        return _rotate_array(a, _uniform(*self.degrees), self.center, self.fill)


def _gray(a: np.ndarray) -> np.ndarray:
    if a.shape[-3] == 1:
        return a
    return (0.299 * a[..., 0:1, :, :] + 0.587 * a[..., 1:2, :, :] + 0.114 * a[..., 2:3, :, :]).astype(a.dtype)


def _rgb_to_hsv(a: np.ndarray) -> np.ndarray:
    r, g, b = a[..., 0, :, :], a[..., 1, :, :], a[..., 2, :, :]
    maxc, minc = a.max(axis=-3), a.min(axis=-3)
    cr = maxc - minc
    s = cr / np.where(maxc == 0, 1.0, maxc)
    safe = np.where(cr == 0, 1.0, cr)
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    h = np.where(maxc == r, bc - gc, np.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = np.where(cr == 0, 0.0, (h / 6.0) % 1.0)
    return np.stack([h, s, maxc], axis=-3)


def _hsv_to_rgb(a: np.ndarray) -> np.ndarray:
    h, s, v = a[..., 0, :, :], a[..., 1, :, :], a[..., 2, :, :]
    i = np.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.astype(np.int64) % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = [np.choose(i, [c[k] for c in choices]) for k in range(3)]
    return np.stack(out, axis=-3)


class ColorJitter(_ArrayTransform):
    """Random brightness, contrast, saturation and hue changes, applied in a random order (float images in [0, 1])."""

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0) -> None:
        self.brightness = self._range(brightness, "brightness")
        self.contrast = self._range(contrast, "contrast")
        self.saturation = self._range(saturation, "saturation")
        self.hue = self._range(hue, "hue", center=0, bound=(-0.5, 0.5), clip_first=False)

    @staticmethod
    def _range(value, name, center=1.0, bound=(0, float("inf")), clip_first=True):
        if isinstance(value, numbers.Number):
            if value < 0:
                raise ValueError(f"If {name} is a single number, it must be non negative.")
            value = [center - float(value), center + float(value)]
            if clip_first:
                value[0] = max(value[0], 0.0)
        elif not (isinstance(value, Sequence) and len(value) == 2):
            raise TypeError(f"{name} should be a single number or a list/tuple with length 2.")
        if not bound[0] <= value[0] <= value[1] <= bound[1]:
            raise ValueError(f"{name} values should be between {bound}, but got {value}.")
        return None if value[0] == value[1] == center else (float(value[0]), float(value[1]))

    def _on_array(self, a: np.ndarray) -> np.ndarray:
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"ColorJitter expects a float image in [0, 1], got {a.dtype}")
        dtype = a.dtype
        a = a.astype(np.float32)
        order = _rng().permutation(4).tolist()
        for fn in order:
            if fn == 0 and self.brightness is not None:
                a = np.clip(a * _uniform(*self.brightness), 0, 1)
            elif fn == 1 and self.contrast is not None:
                f = _uniform(*self.contrast)
                mean = _gray(a).mean(axis=(-3, -2, -1), keepdims=True)
                a = np.clip(f * a + (1 - f) * mean, 0, 1)
            elif fn == 2 and self.saturation is not None and a.shape[-3] == 3:
                f = _uniform(*self.saturation)
                a = np.clip(f * a + (1 - f) * _gray(a), 0, 1)
            elif fn == 3 and self.hue is not None and a.shape[-3] == 3:
                hsv = _rgb_to_hsv(a)
                hsv[..., 0, :, :] = (hsv[..., 0, :, :] + _uniform(*self.hue)) % 1.0
                a = _hsv_to_rgb(hsv)
        return a.astype(dtype, copy=False)


class RandomErasing(_ArrayTransform):
    """With probability ``p``, overwrite a random rectangle (area ``scale``, aspect ``ratio``) with ``value``.

    ``value``: a number, one per channel, or ``"random"`` (standard normal noise).
    """

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0, inplace: bool = False):
        if not 0 <= p <= 1:
            raise ValueError("Random erasing probability should be between 0 and 1")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError("Scale and ratio should be of kind (min, max)")
        self.p, self.scale, self.ratio, self.value, self.inplace = p, scale, ratio, value, inplace

    def get_params(self, img: kiln.Tensor):
        """A random (top, left, height, width) rectangle, or the whole image when ten tries fail."""
        _c, h, w = img.shape[-3:]
        area = h * w
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = area * _uniform(*self.scale)
            aspect = math.exp(_uniform(*log_ratio))
            eh = round(math.sqrt(erase_area * aspect))
            ew = round(math.sqrt(erase_area / aspect))
            if eh < h and ew < w:
                return _randint(0, h - eh + 1), _randint(0, w - ew + 1), eh, ew
        return None

    def _on_array(self, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if _rng().random() >= self.p:
            return a
        box = self.get_params(a)
        if box is None:
            return a
        i, j, eh, ew = box
        out = a.copy() if out is None else out
        c = a.shape[-3]
        if self.value == "random":
            v = _rng().standard_normal((*a.shape[:-2], eh, ew), dtype=np.float32)
        else:
            v = np.asarray(self.value, dtype=np.float64).reshape(-1, 1, 1)
            if v.shape[0] not in (1, c):
                raise ValueError("If value is a sequence, it should have either a single value or one per channel")
        out[..., i : i + eh, j : j + ew] = v
        return out

    def __call__(self, img: kiln.Tensor) -> kiln.Tensor:
        if self.inplace and img.device.type == "cpu" and not img.requires_grad:
            a = _array(img)
            self._on_array(a, out=a)
            return img
        return super().__call__(img)
