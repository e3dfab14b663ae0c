"""``kiln.utils.tensorboard``: PyTorch's ``torch.utils.tensorboard``, logging to TensorBoard.

:class:`SummaryWriter` writes event files that TensorBoard reads (``tensorboard --logdir runs``):
scalars, histograms, images, figures, videos, audio, text, model graphs, embeddings, PR curves,
hyperparameters, custom-scalar layouts and meshes, with PyTorch's method names and arguments. Values
may be kiln tensors on any device, NumPy arrays or Python numbers::

    from kiln.utils.tensorboard import SummaryWriter

    with SummaryWriter("runs/exp1") as writer:
        writer.add_scalar("loss", loss, step)
        writer.add_histogram("fc1/weight", model.fc1.weight, step)
        writer.add_images("inputs", batch, step)

The events are written with the ``tensorboard`` package (its protocol buffers and event-file
writer), which must be installed: ``pip install tensorboard``, or ``pip install kiln[tensorboard]``.
Without it, importing this module raises ``ModuleNotFoundError`` saying so.

Where kiln differs from PyTorch: ``add_graph`` records the ops a model calls through kiln's dispatcher
(kiln has no ``torch.jit.trace``), and accepts any callable; ``add_video`` encodes the GIF with Pillow
(PyTorch needs moviepy); ``add_tensor`` writes ``float16``, ``bfloat16`` (as float32) and ``uint8`` so that
they read back; ``add_hparams`` takes 0-d tensors. ``add_onnx_graph`` is not provided (kiln exports no ONNX).
"""

from __future__ import annotations

_MINIMUM = (2, 14)


def _require_tensorboard() -> None:
    try:
        import tensorboard
    except ModuleNotFoundError as e:
        if e.name != "tensorboard":
            raise
        raise ModuleNotFoundError(
            "kiln.utils.tensorboard needs the tensorboard package, which is not installed: "
            "pip install tensorboard (or pip install kiln[tensorboard])",
            name="tensorboard",
        ) from None
    found = tuple(int(p) for p in tensorboard.__version__.split(".")[:2] if p.isdigit())
    if found < _MINIMUM:
        raise ImportError(
            f"TensorBoard logging requires TensorBoard version {'.'.join(map(str, _MINIMUM))} or above, found "
            f"{tensorboard.__version__}: pip install -U tensorboard"
        )


_require_tensorboard()

from kiln.utils.tensorboard._writer import FileWriter, SummaryWriter  # noqa: E402 - after the check above

__all__ = ["FileWriter", "SummaryWriter"]
