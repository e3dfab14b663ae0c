"""``Summary`` protocol buffers (``tensorboard.compat.proto``), one builder per kind of data.

Each builder takes NumPy arrays or numbers (see :func:`kiln.utils.tensorboard._convert.make_np`) and
returns a ``Summary`` in the layout TensorBoard's plugins read: old-style ``simple_value``/``histo``/
``image``/``audio`` fields, or a ``tensor`` with the plugin's ``SummaryMetadata`` (scalars, text, PR
curves, custom scalars, hparams, meshes).
"""

from __future__ import annotations

import io
import json
import math
import warnings
import wave

import numpy as np
from google.protobuf import struct_pb2
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.mesh import metadata as mesh_metadata
from tensorboard.plugins.mesh.plugin_data_pb2 import MeshPluginData
from tensorboard.plugins.pr_curve import metadata as pr_curve_metadata
from tensorboard.plugins.pr_curve.plugin_data_pb2 import PrCurvePluginData
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

import kiln
from kiln.utils.tensorboard._convert import convert_to_hwc, make_np, to_uint8, video_frames


def _shape(dims) -> TensorShapeProto:
    return TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(d)) for d in dims])


def _plugin(name: str, content: bytes = b"") -> SummaryMetadata:
    return SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=name, content=content))


# ------------------------------------------------------------------------------------------ scalars


def scalar(tag: str, value, new_style: bool = False, double_precision: bool = False) -> Summary:
    """One number: ``simple_value``, or (``new_style``) a float32/float64 tensor for the scalars plugin."""
    array = make_np(value).squeeze()
    if array.ndim != 0:
        raise AssertionError(
            f"Tensor should contain one element (0 dimensions). Was given size: {array.size} and {array.ndim} "
            "dimensions."
        )
    number = float(array)
    if not new_style:
        return Summary(value=[Summary.Value(tag=tag, simple_value=number)])
    if double_precision:
        proto = TensorProto(dtype="DT_DOUBLE", double_val=[number])
    else:
        proto = TensorProto(dtype="DT_FLOAT", float_val=[number])
    return Summary(value=[Summary.Value(tag=tag, tensor=proto, metadata=_plugin(scalar_metadata.PLUGIN_NAME))])


# kiln dtype -> (TensorProto dtype, field, how the values are written there)
_TENSOR_FIELDS = {
    kiln.float16: ("DT_HALF", "half_val", lambda a: a.astype(np.float16).view(np.uint16)),
    # TensorBoard cannot read DT_BFLOAT16 back (its dtype table has no NumPy bfloat16): as float32, exactly
    kiln.bfloat16: ("DT_FLOAT", "float_val", None),
    kiln.float32: ("DT_FLOAT", "float_val", None),
    kiln.float64: ("DT_DOUBLE", "double_val", None),
    kiln.int8: ("DT_INT8", "int_val", None),
    kiln.uint8: ("DT_UINT8", "int_val", None),
    kiln.int16: ("DT_INT16", "int_val", None),
    kiln.int32: ("DT_INT32", "int_val", None),
    kiln.int64: ("DT_INT64", "int64_val", None),
    kiln.bool: ("DT_BOOL", "bool_val", None),
}


def tensor(tag: str, value) -> Summary:
    """A whole tensor (``add_tensor``), for the tensor plugin; shape and dtype are kept."""
    if not isinstance(value, kiln.Tensor):
        raise TypeError(f"add_tensor expects a kiln.Tensor, got {type(value).__name__}")
    if value.numel() * value.element_size() >= 1 << 31:
        raise ValueError("tensor is bigger than protocol buffer's hard limit of 2GB in size")
    if value.dtype not in _TENSOR_FIELDS:
        raise ValueError(f"{tag} has unsupported tensor dtype {value.dtype}")
    dtype, field, convert = _TENSOR_FIELDS[value.dtype]
    values = make_np(value)  # bfloat16 comes as float32
    if convert is not None:
        values = convert(values)
    proto = TensorProto(dtype=dtype, tensor_shape=_shape(value.shape), **{field: values.reshape(-1).tolist()})
    return Summary(value=[Summary.Value(tag=tag, metadata=_plugin("tensor"), tensor=proto)])


# --------------------------------------------------------------------------------------- histograms


def default_bins() -> list[float]:
    """TensorFlow's default bucket limits: ±1e-12 growing by 10% up to 1e20 in magnitude, and 0."""
    positive = []
    v = 1e-12
    while v < 1e20:
        positive.append(v)
        v *= 1.1
    return [-b for b in reversed(positive)] + [0] + positive


def histogram_raw(tag: str, min, max, num, sum, sum_squares, bucket_limits, bucket_counts) -> Summary:
    """A histogram from its statistics; bucket ``i`` counts the values in (limit ``i-1``, limit ``i``]."""
    limits = make_np(bucket_limits).reshape(-1).tolist() if not isinstance(bucket_limits, list) else bucket_limits
    counts = make_np(bucket_counts).reshape(-1).tolist() if not isinstance(bucket_counts, list) else bucket_counts
    hist = HistogramProto(
        min=float(min),
        max=float(max),
        num=float(num),
        sum=float(sum),
        sum_squares=float(sum_squares),
        bucket_limit=limits,
        bucket=counts,
    )
    return Summary(value=[Summary.Value(tag=tag, histo=hist)])


def histogram(tag: str, values, bins, max_bins: int | None = None) -> Summary:
    """A histogram of ``values`` (any shape): ``bins`` as :func:`numpy.histogram` takes it (a count,
    edges or an estimator name); at most ``max_bins`` buckets, by merging neighbours."""
    return Summary(value=[Summary.Value(tag=tag, histo=make_histogram(make_np(values).astype(float), bins, max_bins))])


def make_histogram(values: np.ndarray, bins, max_bins: int | None = None) -> HistogramProto:
    """The ``HistogramProto`` of float64 ``values``, trimmed to the non-empty buckets plus one empty bucket
    in front, whose upper limit is where the first non-empty bucket starts (TensorFlow's layout)."""
    if values.size == 0:
        raise ValueError("The input has no element.")
    values = values.reshape(-1)
    counts, limits = np.histogram(values, bins=bins)
    if max_bins is not None and len(counts) > max_bins:
        group = len(counts) // max_bins  # merge `group` neighbouring buckets into one
        pad = -len(counts) % group
        counts = np.pad(counts, (0, pad)).reshape(-1, group).sum(axis=1)
        limits = np.append(limits[:-1:group], limits[-1])
    filled = np.flatnonzero(counts)
    if filled.size == 0:
        raise ValueError("The histogram is empty, please file a bug report.")
    first, last = filled[0], filled[-1]
    return HistogramProto(
        min=values.min(),
        max=values.max(),
        num=len(values),
        sum=values.sum(),
        sum_squares=values.dot(values),
        bucket_limit=limits[first : last + 2].tolist(),
        bucket=[0, *counts[first : last + 1].tolist()],
    )


# ------------------------------------------------------------------------------ images, video, audio


def image(tag: str, value, dataformats: str = "NCHW") -> Summary:
    """One image (or a batch tiled into a grid), PNG-encoded; float pixels in [0, 1], uint8 in [0, 255]."""
    pixels = to_uint8(convert_to_hwc(make_np(value), dataformats))
    return Summary(value=[Summary.Value(tag=tag, image=make_image(pixels))])


def make_image(pixels: np.ndarray, rescale: float = 1, boxes=None, labels=None) -> Summary.Image:
    """``(H, W, C)`` uint8 pixels as a PNG ``Summary.Image`` (C: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA);
    ``boxes`` (``(K, 4)`` as xmin, ymin, xmax, ymax) are drawn in red, with ``labels`` if given."""
    from PIL import Image

    height, width, channels = pixels.shape
    img = Image.fromarray(pixels)
    if boxes is not None:
        _draw_boxes(img, boxes, labels)
    if rescale != 1:
        img = img.resize((int(width * rescale), int(height * rescale)), Image.Resampling.LANCZOS)
    return Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=_encode(img, "PNG"))


def _encode(img, fmt: str, **options) -> bytes:
    with io.BytesIO() as buf:
        img.save(buf, format=fmt, **options)
        return buf.getvalue()


def _draw_boxes(img, boxes: np.ndarray, labels) -> None:
    """Red rectangles, two pixels wide, each with its label (black on red) above its bottom-left corner."""
    from PIL import ImageDraw, ImageFont

    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    for i, (x0, y0, x1, y1) in enumerate(np.asarray(boxes, dtype=np.float64).reshape(-1, 4).tolist()):
        draw.line([(x0, y0), (x0, y1), (x1, y1), (x1, y0), (x0, y0)], width=2, fill="Red")
        if labels is not None and labels[i]:
            left, top, right, bottom = font.getbbox(labels[i])
            margin = math.ceil(0.05 * (bottom - top))
            draw.rectangle([(x0, y1 - (bottom - top) - 2 * margin), (x0 + right - left, y1)], fill="Red")
            draw.text((x0 + margin, y1 - (bottom - top) - margin), labels[i], fill="black", font=font)


def image_boxes(tag: str, value, boxes, rescale: float = 1, dataformats: str = "CHW", labels=None) -> Summary:
    """An image with bounding boxes drawn on it (``add_image_with_boxes``)."""
    pixels = to_uint8(convert_to_hwc(make_np(value), dataformats))
    image = make_image(pixels, rescale=rescale, boxes=make_np(boxes), labels=labels)
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def video(tag: str, value, fps: float = 4) -> Summary:
    """A ``(N, T, C, H, W)`` batch of videos as one animated GIF (the videos tiled into a grid), shown by
    TensorBoard's image plugin. Encoded with Pillow; C is 1 (gray) or 3 (RGB)."""
    from PIL import Image

    frames = to_uint8(video_frames(make_np(value)))
    _, h, w, c = frames.shape
    if c not in (1, 3):
        raise ValueError(f"add_video expects 1 or 3 channels, got {c}")
    images = [Image.fromarray(f[:, :, 0] if c == 1 else f) for f in frames]
    gif = _encode(
        images[0], "GIF", save_all=True, append_images=images[1:], duration=1000.0 / fps, loop=0, optimize=False
    )
    return Summary(
        value=[Summary.Value(tag=tag, image=Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=gif))]
    )


def audio(tag: str, value, sample_rate: int = 44100) -> Summary:
    """Mono audio, samples in [-1, 1] (louder samples are clipped, with a warning), as a 16-bit WAV."""
    samples = make_np(value).squeeze()
    if samples.size == 0:
        raise ValueError("zero-size array to reduction operation maximum which has no identity")
    if np.abs(samples).max() > 1:
        warnings.warn("audio amplitude out of range, auto clipped.", stacklevel=3)
        samples = samples.clip(-1, 1)
    if samples.ndim != 1:
        raise AssertionError("input tensor should be 1 dimensional.")
    pcm = (samples * np.iinfo(np.int16).max).astype("<i2")
    with io.BytesIO() as buf:
        with wave.open(buf, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(sample_rate)
            out.writeframes(pcm.tobytes())
        wav = buf.getvalue()
    clip = Summary.Audio(
        sample_rate=sample_rate,
        num_channels=1,
        length_frames=pcm.shape[-1],
        encoded_audio_string=wav,
        content_type="audio/wav",
    )
    return Summary(value=[Summary.Value(tag=tag, audio=clip)])


# ---------------------------------------------------------------------------------- text and plugins


def text(tag: str, text_string: str) -> Summary:
    """Markdown text, for the text plugin (tag ``<tag>/text_summary``)."""
    proto = TensorProto(dtype="DT_STRING", string_val=[text_string.encode("utf_8")], tensor_shape=_shape([1]))
    meta = _plugin(text_metadata.PLUGIN_NAME, TextPluginData(version=0).SerializeToString())
    return Summary(value=[Summary.Value(tag=tag + "/text_summary", metadata=meta, tensor=proto)])


def _pr_summary(tag: str, data: np.ndarray, num_thresholds: int) -> Summary:
    content = PrCurvePluginData(version=0, num_thresholds=num_thresholds).SerializeToString()
    proto = TensorProto(dtype="DT_FLOAT", float_val=data.reshape(-1).tolist(), tensor_shape=_shape(data.shape[:2]))
    return Summary(
        value=[Summary.Value(tag=tag, metadata=_plugin(pr_curve_metadata.PLUGIN_NAME, content), tensor=proto)]
    )


def pr_curve_raw(tag: str, tp, fp, tn, fn, precision, recall, num_thresholds: int = 127) -> Summary:
    """A precision-recall curve from its counts per threshold (six rows: tp, fp, tn, fn, precision, recall)."""
    data = np.stack(
        [make_np(x) if not isinstance(x, list) else np.asarray(x) for x in (tp, fp, tn, fn, precision, recall)]
    )
    return _pr_summary(tag, data, min(num_thresholds, 127))


def pr_curve(tag: str, labels, predictions, num_thresholds: int = 127, weights=None) -> Summary:
    """A precision-recall curve of ``predictions`` (probabilities in [0, 1]) against 0/1 ``labels``, at
    ``num_thresholds`` (at most 127) thresholds spread evenly over [0, 1]."""
    num_thresholds = min(num_thresholds, 127)
    return _pr_summary(tag, compute_curve(labels, predictions, num_thresholds, weights), num_thresholds)


def compute_curve(labels: np.ndarray, predictions: np.ndarray, num_thresholds: int, weights=None) -> np.ndarray:
    """The ``(6, num_thresholds)`` counts of a PR curve: a prediction counts at every threshold ``k/(n-1)``
    at or below it (its bucket ``floor(p*(n-1))``), weighted by ``weights``."""
    weights = 1.0 if weights is None else weights
    buckets = np.floor(predictions * (num_thresholds - 1)).astype(np.int32)
    positive = labels.astype(np.float64)
    edges = (0, num_thresholds - 1)
    tp_in, _ = np.histogram(buckets, bins=num_thresholds, range=edges, weights=positive * weights)
    fp_in, _ = np.histogram(buckets, bins=num_thresholds, range=edges, weights=(1.0 - positive) * weights)
    tp = np.cumsum(tp_in[::-1])[::-1]  # predictions at or above each threshold
    fp = np.cumsum(fp_in[::-1])[::-1]
    tn = fp[0] - fp
    fn = tp[0] - tp
    precision = tp / np.maximum(1e-7, tp + fp)
    recall = tp / np.maximum(1e-7, tp + fn)
    return np.stack((tp, fp, tn, fn, precision, recall))


def custom_scalars(layout: dict) -> Summary:
    """The custom-scalars plugin's layout: ``{category: {chart title: ["Multiline", tags] or ["Margin",
    [value, lower, upper]]}}``."""
    categories = []
    for category, charts in layout.items():
        protos = []
        for title, (kind, tags) in charts.items():
            if kind == "Margin":
                if len(tags) != 3:
                    raise AssertionError("len(tags) != 3")
                series = layout_pb2.MarginChartContent.Series(value=tags[0], lower=tags[1], upper=tags[2])
                protos.append(layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[series])))
            else:
                protos.append(layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags)))
        categories.append(layout_pb2.Category(title=category, chart=protos))
    proto = TensorProto(
        dtype="DT_STRING",
        string_val=[layout_pb2.Layout(category=categories).SerializeToString()],
        tensor_shape=TensorShapeProto(),
    )
    meta = _plugin(custom_scalar_metadata.PLUGIN_NAME)
    return Summary(value=[Summary.Value(tag="custom_scalars__config__", tensor=proto, metadata=meta)])


def _hparams_summary(tag: str, **data) -> Summary:
    content = plugin_data_pb2.HParamsPluginData(version=hparams_metadata.PLUGIN_DATA_VERSION, **data)
    meta = _plugin(hparams_metadata.PLUGIN_NAME, content.SerializeToString())
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


def hparams(hparam_dict: dict, metric_dict: dict, hparam_domain_discrete: dict | None = None):
    """The three summaries of the hparams plugin: the experiment (hyperparameter and metric names), the
    session start (the values) and the session end (success).

    Values are numbers (``bool`` included, logged as 0/1, as PyTorch does), strings, or one-element kiln
    tensors; ``None`` values are left out.
    """
    if not isinstance(hparam_dict, dict):
        raise TypeError("parameter: hparam_dict should be a dictionary, nothing logged.")
    if not isinstance(metric_dict, dict):
        raise TypeError("parameter: metric_dict should be a dictionary, nothing logged.")
    domains = hparam_domain_discrete or {}
    if not isinstance(domains, dict):
        raise TypeError("parameter: hparam_domain_discrete should be a dictionary, nothing logged.")
    for k, v in domains.items():
        if k not in hparam_dict or not isinstance(v, list) or not all(isinstance(d, type(hparam_dict[k])) for d in v):
            raise TypeError(
                f"parameter: hparam_domain_discrete[{k}] should be a list of same type as hparam_dict[{k}]."
            )
    start = plugin_data_pb2.SessionStartInfo()
    infos = []
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if isinstance(v, (int, float)):
            kind, field = "DATA_TYPE_FLOAT64", "number_value"
        elif isinstance(v, str):
            kind, field = "DATA_TYPE_STRING", "string_value"
        elif isinstance(v, (kiln.Tensor, np.ndarray, np.number)):
            kind, field = "DATA_TYPE_FLOAT64", "number_value"
            v = float(make_np(v).reshape(-1)[0])
            domains = {d: vs for d, vs in domains.items() if d != k}
        else:
            raise ValueError("value should be one of int, float, str, bool, or kiln.Tensor")
        setattr(start.hparams[k], field, v)
        domain = None
        if k in domains:
            domain = struct_pb2.ListValue(values=[struct_pb2.Value(**{field: d}) for d in domains[k]])
        infos.append(api_pb2.HParamInfo(name=k, type=api_pb2.DataType.Value(kind), domain_discrete=domain))
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
    return (
        _hparams_summary(hparams_metadata.EXPERIMENT_TAG, experiment=experiment),
        _hparams_summary(hparams_metadata.SESSION_START_INFO_TAG, session_start_info=start),
        _hparams_summary(hparams_metadata.SESSION_END_INFO_TAG, session_end_info=end),
    )


def mesh(tag: str, vertices, colors, faces, config_dict: dict | None) -> Summary:
    """A mesh or point cloud for the mesh plugin: ``(B, N, 3)`` vertices, optional ``(B, N, 3)`` colors
    and ``(B, F, 3)`` faces (vertex indices), one tensor summary each; ``config_dict``: three.js
    settings."""
    config = "{}" if config_dict is None else json.dumps(config_dict, sort_keys=True)
    parts = [
        (x, kind)
        for x, kind in ((vertices, MeshPluginData.VERTEX), (faces, MeshPluginData.FACE), (colors, MeshPluginData.COLOR))
        if x is not None
    ]
    components = mesh_metadata.get_components_bitmask([kind for _, kind in parts])
    values = []
    for x, kind in parts:
        array = make_np(x)
        meta = mesh_metadata.create_summary_metadata(
            tag, None, kind, components, list(array.shape), None, json_config=config
        )
        proto = TensorProto(
            dtype="DT_FLOAT", float_val=array.reshape(-1).tolist(), tensor_shape=_shape(array.shape[:3])
        )
        values.append(Summary.Value(tag=mesh_metadata.get_instance_name(tag, kind), tensor=proto, metadata=meta))
    return Summary(value=values)
