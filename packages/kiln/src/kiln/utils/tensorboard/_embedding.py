"""The projector plugin's files: ``tensors.tsv``, ``metadata.tsv``, ``sprite.png`` per embedding and the
run's ``projector_config.pbtxt`` listing them.

Paths go through TensorBoard's file-system layer (``tensorboard.compat.tf.io.gfile``), as the event
files do, so remote log directories its layer supports work too.
"""

from __future__ import annotations

import math

import numpy as np
from tensorboard.compat import tf
from tensorboard.plugins.projector.projector_config_pb2 import EmbeddingInfo

from kiln.utils.tensorboard._convert import make_grid


def join(a: str, b: str) -> str:
    """``a/b`` in the file system of ``a`` (local, or one of TensorBoard's remote ones)."""
    return tf.io.gfile.get_filesystem(a).join(a, b)


def _write(path: str, data: bytes) -> None:
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def write_matrix(mat: np.ndarray, save_path: str) -> None:
    """``tensors.tsv``: one row per data point, tab-separated, each value as Python prints it."""
    lines = ["\t".join(str(v) for v in row) + "\n" for row in mat.tolist()]
    _write(join(save_path, "tensors.tsv"), "".join(lines).encode())


def write_metadata(metadata: list, save_path: str, metadata_header: list | None = None) -> None:
    """``metadata.tsv``: one label per line, or (with ``metadata_header``) a header line and one
    tab-separated row of columns per data point."""
    if metadata_header:
        if len(metadata_header) != len(metadata[0]):
            raise AssertionError("len of header must be equal to the number of columns in metadata")
        lines = ["\t".join(str(e) for e in row) for row in [metadata_header, *metadata]]
    else:
        lines = [str(x) for x in metadata]
    _write(join(save_path, "metadata.tsv"), ("\n".join(lines) + "\n").encode())


def write_sprite(label_img: np.ndarray, save_path: str) -> None:
    """``sprite.png``: the ``(N, C, H, W)`` label images (values in [0, 1]) tiled into a square grid of
    ``ceil(sqrt(N))`` columns, padded with black to a square."""
    from PIL import Image

    from kiln.utils.tensorboard._summary import _encode

    cols = math.ceil(label_img.shape[0] ** 0.5)
    grid = make_grid(label_img, ncols=cols).transpose(1, 2, 0)  # HWC
    side = grid.shape[1]
    square = np.zeros((side, side, 3))
    square[: grid.shape[0]] = grid
    _write(join(save_path, "sprite.png"), _encode(Image.fromarray(np.uint8((square * 255).clip(0, 255))), "PNG"))


def embedding_info(metadata, label_img, subdir: str, global_step: int, tag: str) -> EmbeddingInfo:
    """The projector config's entry for one embedding, its paths relative to the run's directory."""
    info = EmbeddingInfo(tensor_name=f"{tag}:{str(global_step).zfill(5)}", tensor_path=join(subdir, "tensors.tsv"))
    if metadata is not None:
        info.metadata_path = join(subdir, "metadata.tsv")
    if label_img is not None:
        info.sprite.image_path = join(subdir, "sprite.png")
        info.sprite.single_image_dim.extend([label_img.shape[3], label_img.shape[2]])
    return info


def write_config(log_dir: str, config) -> None:
    """``projector_config.pbtxt`` in ``log_dir``: the config in protobuf text format."""
    from google.protobuf import text_format

    _write(join(log_dir, "projector_config.pbtxt"), text_format.MessageToString(config).encode())


def encode_tag(tag: str) -> str:
    """``tag`` as one path component: ``%``, ``/`` and ``\\`` percent-encoded."""
    return tag.replace("%", "%25").replace("/", "%2f").replace("\\", "%5c")
