"""What the summaries are made from: any input as a NumPy array, images in HWC order, grids, frames."""

from __future__ import annotations

import numpy as np

import kiln


def make_np(x) -> np.ndarray:
    """``x`` (a kiln tensor on any device, a NumPy array, a Python or NumPy number) as a NumPy array.

    Tensors are detached and copied to the CPU; ``bfloat16`` becomes ``float32``, which holds every
    bfloat16 value exactly (NumPy has no bfloat16 of its own). A number becomes a one-element array.
    """
    if isinstance(x, np.ndarray):
        return x
    if np.isscalar(x):
        return np.array([x])
    if isinstance(x, kiln.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == kiln.bfloat16:
            t = t.float()
        return t.numpy()
    raise NotImplementedError(f"Got {type(x)}, but numpy array or kiln tensor are expected.")


def make_grid(images: np.ndarray, ncols: int = 8) -> np.ndarray:
    """``N`` images of shape ``(C, H, W)``, ``C`` 1 or 3, tiled into one ``(3, rows*H, cols*W)`` image,
    row by row, at most ``ncols`` to a row; unused cells stay 0. One channel is repeated three times."""
    if images.ndim == 4 and images.shape[1] == 1:
        images = np.repeat(images, 3, axis=1)
    if images.ndim != 4 or images.shape[1] != 3:
        raise AssertionError("Input should be a 4D numpy array with 3 channels")
    n, _, h, w = images.shape
    if n == 0:
        raise ValueError("cannot write empty image")
    cols = min(n, ncols)
    rows = -(-n // cols)
    padded = np.zeros((rows * cols, 3, h, w), dtype=images.dtype)
    padded[:n] = images
    # (rows, cols, 3, h, w) -> (3, rows, h, cols, w): each row of images side by side
    return padded.reshape(rows, cols, 3, h, w).transpose(2, 0, 3, 1, 4).reshape(3, rows * h, cols * w)


def convert_to_hwc(array: np.ndarray, dataformats: str) -> np.ndarray:
    """An image (or, for 4-letter formats, a batch of images tiled into a grid) in ``HWC`` order.

    ``dataformats`` names the axes of ``array`` with the letters ``N``, ``C``, ``H``, ``W`` in any
    order and case: ``CHW``, ``HWC``, ``HW``, ``NCHW``, ``NHWC``... One channel (and ``HW`` images) are
    repeated to three.
    """
    if len(set(dataformats)) != len(dataformats):
        raise AssertionError(f"You can not use the same dimension shorthand twice. input_format: {dataformats}")
    if array.ndim != len(dataformats):
        raise AssertionError(
            "size of input tensor and input format are different. "
            f"tensor shape: {array.shape}, input_format: {dataformats}"
        )
    fmt = dataformats.upper()
    target = {4: "NCHW", 3: "HWC", 2: "HW"}.get(len(fmt))
    if target is None or set(fmt) != set(target):
        raise ValueError(
            f"dataformats {dataformats!r} does not name an image: use the letters of HW, CHW/HWC or NCHW/NHWC, "
            "each once, in any order"
        )
    array = array.transpose([fmt.index(c) for c in target])
    if len(fmt) == 4:
        return make_grid(array).transpose(1, 2, 0)
    if len(fmt) == 2:
        array = array[:, :, None]
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return array


def to_uint8(array: np.ndarray) -> np.ndarray:
    """Pixel values as ``uint8``: ``uint8`` input is taken as 0..255, anything else as 0..1 (scaled by
    255); values outside the range are clipped."""
    scale = 1 if array.dtype == np.uint8 else 255
    return (array.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)


def figure_to_image(figures, close: bool = True) -> np.ndarray:
    """A matplotlib figure rendered to a ``(3, H, W)`` uint8 array, or a list of figures to
    ``(N, 3, H, W)``; ``close`` closes each figure after rendering."""
    try:
        import matplotlib.pyplot as plt
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "add_figure needs matplotlib, which is not installed: pip install matplotlib", name=e.name
        ) from None

    def render(figure) -> np.ndarray:
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
        if close:
            plt.close(figure)
        return np.ascontiguousarray(rgba[:, :, :3].transpose(2, 0, 1))

    if isinstance(figures, list):
        return np.stack([render(f) for f in figures])
    return render(figures)


def video_frames(video: np.ndarray) -> np.ndarray:
    """A ``(B, T, C, H, W)`` batch of videos as ``T`` frames ``(T, rows*H, cols*W, C)``: the videos tiled
    into a grid, the batch padded with black videos to a power of two (rows: the largest power of two
    whose square is at most ``B``); ``uint8`` videos are scaled to ``[0, 1]``."""
    if video.ndim != 5:
        raise ValueError(f"add_video expects a 5-D (N, T, C, H, W) tensor, got shape {tuple(video.shape)}")
    b, t, c, h, w = video.shape
    if video.dtype == np.uint8:
        video = video.astype(np.float32) / 255.0
    if b == 0:
        raise ValueError("cannot write empty video")
    size = 1 << (b - 1).bit_length()  # the next power of two
    if size != b:
        video = np.concatenate([video, np.zeros((size - b, t, c, h, w), dtype=video.dtype)])
    rows = 1 << ((b.bit_length() - 1) // 2)
    cols = size // rows
    grid = video.reshape(rows, cols, t, c, h, w).transpose(2, 0, 4, 1, 5, 3)
    return grid.reshape(t, rows * h, cols * w, c)
