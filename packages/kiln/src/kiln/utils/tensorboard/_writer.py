"""``SummaryWriter`` and ``FileWriter``: PyTorch's ``torch.utils.tensorboard`` writers over kiln tensors."""

from __future__ import annotations

import os
import socket
import time
import warnings
from datetime import datetime
from typing import Any

from tensorboard.compat import tf
from tensorboard.compat.proto.event_pb2 import Event, SessionLog, TaggedRunMetadata
from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from kiln.utils.tensorboard import _embedding, _summary
from kiln.utils.tensorboard._convert import figure_to_image, make_np


class FileWriter:
    """Writes ``Event`` protocol buffers to one event file in ``log_dir`` (created if missing), through
    TensorBoard's :class:`~tensorboard.summary.writer.event_file_writer.EventFileWriter`: events are
    queued (at most ``max_queue``) and written by a background thread, flushed every ``flush_secs``
    seconds. The file is named ``events.out.tfevents.<time>.<host>.<pid>.<n><filename_suffix>``.
    """

    def __init__(self, log_dir, max_queue: int = 10, flush_secs: float = 120, filename_suffix: str = "") -> None:
        self.event_writer = EventFileWriter(str(log_dir), max_queue, flush_secs, filename_suffix)

    def get_logdir(self) -> str:
        """The directory the event file is in."""
        return self.event_writer.get_logdir()

    def add_event(self, event: Event, step: int | None = None, walltime: float | None = None) -> None:
        """Write ``event``, stamped with ``walltime`` (default: now) and ``step`` (if given)."""
        event.wall_time = time.time() if walltime is None else walltime
        if step is not None:
            event.step = int(step)
        self.event_writer.add_event(event)

    def add_summary(self, summary, global_step: int | None = None, walltime: float | None = None) -> None:
        """Write a ``Summary`` protocol buffer as an event."""
        self.add_event(Event(summary=summary), global_step, walltime)

    def add_graph(self, graph_profile, walltime: float | None = None) -> None:
        """Write a ``(GraphDef, RunMetadata)`` pair: the graph, and its run metadata tagged ``step1``."""
        graph, stats = graph_profile
        self.add_event(Event(graph_def=graph.SerializeToString()), None, walltime)
        run_metadata = TaggedRunMetadata(tag="step1", run_metadata=stats.SerializeToString())
        self.add_event(Event(tagged_run_metadata=run_metadata), None, walltime)

    def flush(self) -> None:
        """Write every queued event to disk."""
        self.event_writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.event_writer.close()


class SummaryWriter:
    """Writes scalars, histograms, images, text, graphs, embeddings... to event files that TensorBoard
    reads, as ``torch.utils.tensorboard.SummaryWriter`` does.

    ``log_dir`` defaults to ``runs/<month><day>_<hour>-<minute>-<second>_<hostname><comment>``.
    ``purge_step``: events at this step or later, left by an earlier run that crashed, are hidden by
    TensorBoard. ``max_queue``, ``flush_secs`` and ``filename_suffix`` go to the :class:`FileWriter`.

    Values may be kiln tensors on any device (copied to the CPU, detached), NumPy arrays or Python
    numbers. Use as a context manager, or call :meth:`close`::

        with SummaryWriter("runs/exp1") as writer:
            for step in range(100):
                writer.add_scalar("loss", loss, step)
    """

    def __init__(
        self,
        log_dir=None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: float = 120,
        filename_suffix: str = "",
    ) -> None:
        if not log_dir:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = log_dir
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self.file_writer: FileWriter | None = None
        self.all_writers: dict[str, FileWriter] | None = None
        self._get_file_writer()
        self.default_bins = _summary.default_bins()

    def _get_file_writer(self) -> FileWriter:
        """The main event file's writer; a new event file after :meth:`close`."""
        if self.all_writers is None or self.file_writer is None:
            self.file_writer = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:
                step = self.purge_step
                self.file_writer.add_event(Event(step=step, file_version="brain.Event:2"))
                self.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
                self.purge_step = None
        return self.file_writer

    def _write(self, summary, global_step=None, walltime=None) -> None:
        self._get_file_writer().add_summary(summary, global_step, walltime)

    def get_logdir(self):
        """The directory the event files are written to."""
        return self.log_dir

    # ------------------------------------------------------------------------------------ scalars

    def add_scalar(
        self,
        tag: str,
        scalar_value,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log one number (a Python or NumPy number, or a one-element tensor) under ``tag``.

        ``new_style`` writes it as a tensor for the scalars plugin (float32, or float64 with
        ``double_precision``) rather than as a ``simple_value``. NaN and infinities are written as they are.
        """
        self._write(_summary.scalar(tag, scalar_value, new_style, double_precision), global_step, walltime)

    def add_scalars(
        self, main_tag: str, tag_scalar_dict: dict, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log several numbers on one chart: each ``tag`` of ``tag_scalar_dict`` goes to its own run, the
        subdirectory ``<log_dir>/<main_tag>_<tag>`` (``/`` in ``main_tag`` becomes ``_``), under the tag
        ``main_tag``."""
        walltime = time.time() if walltime is None else walltime
        logdir = self._get_file_writer().get_logdir()
        for tag, value in tag_scalar_dict.items():
            key = logdir + "/" + main_tag.replace("/", "_") + "_" + tag
            assert self.all_writers is not None
            writer = self.all_writers.get(key)
            if writer is None:
                writer = self.all_writers[key] = FileWriter(key, self.max_queue, self.flush_secs, self.filename_suffix)
            writer.add_summary(_summary.scalar(main_tag, value), global_step, walltime)

    def add_tensor(self, tag: str, tensor, global_step: int | None = None, walltime: float | None = None) -> None:
        """Log a whole kiln tensor (any shape; float, integer or bool) for TensorBoard's tensor plugin.

        Unlike PyTorch's, ``float16``, ``bfloat16`` and ``uint8`` tensors are written so that TensorBoard's
        ``tensor_util.make_ndarray`` reads back the same values (``bfloat16`` as ``float32``, which
        TensorBoard can read).
        """
        self._write(_summary.tensor(tag, tensor), global_step, walltime)

    # --------------------------------------------------------------------------------- histograms

    def add_histogram(
        self,
        tag: str,
        values,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        """Log a histogram of ``values`` (any shape).

        ``bins``: ``"tensorflow"`` (TensorFlow's default buckets, growing by 10% from ±1e-12) or anything
        :func:`numpy.histogram` takes (``"auto"``, ``"fd"``, ``"sqrt"``..., a count, or the edges).
        ``max_bins`` merges neighbouring buckets down to at most that many. Empty ``values`` raise
        ``ValueError``, as do infinities with an estimated range.
        """
        if isinstance(bins, str) and bins == "tensorflow":
            bins = self.default_bins
        self._write(_summary.histogram(tag, values, bins, max_bins=max_bins), global_step, walltime)

    def add_histogram_raw(
        self,
        tag: str,
        min,
        max,
        num,
        sum,
        sum_squares,
        bucket_limits,
        bucket_counts,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log a histogram computed elsewhere: its minimum, maximum, count, sum and sum of squares, and
        ``bucket_counts[i]`` values at most ``bucket_limits[i]`` (above the previous limit)."""
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("len(bucket_limits) != len(bucket_counts), see the document.")
        summary = _summary.histogram_raw(tag, min, max, num, sum, sum_squares, bucket_limits, bucket_counts)
        self._write(summary, global_step, walltime)

    # ------------------------------------------------------------------------- images and media

    def add_image(
        self,
        tag: str,
        img_tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """Log an image: ``dataformats`` names its axes (``CHW``, ``HWC``, ``HW``...); 1, 3 (RGB) or 4
        (RGBA) channels. Float pixels are in [0, 1], ``uint8`` in [0, 255]; values beyond are clipped."""
        self._write(_summary.image(tag, img_tensor, dataformats=dataformats), global_step, walltime)

    def add_images(
        self,
        tag: str,
        img_tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """Log a batch of images (``NCHW`` or ``NHWC``, 1 or 3 channels) as one image: a grid, eight to a
        row."""
        self._write(_summary.image(tag, img_tensor, dataformats=dataformats), global_step, walltime)

    def add_image_with_boxes(
        self,
        tag: str,
        img_tensor,
        box_tensor,
        global_step: int | None = None,
        walltime: float | None = None,
        rescale: float = 1,
        dataformats: str = "CHW",
        labels: list[str] | str | None = None,
    ) -> None:
        """Log an image with boxes drawn on it: ``box_tensor`` is ``(K, 4)``, each row ``xmin, ymin, xmax,
        ymax`` in pixels; ``labels`` (one per box, else ignored) are written on them. ``rescale`` scales
        the image."""
        if labels is not None:
            if isinstance(labels, str):
                labels = [labels]
            if len(labels) != box_tensor.shape[0]:
                labels = None
        summary = _summary.image_boxes(tag, img_tensor, box_tensor, rescale, dataformats, labels)
        self._write(summary, global_step, walltime)

    def add_figure(
        self, tag: str, figure, global_step: int | None = None, close: bool = True, walltime: float | None = None
    ) -> None:
        """Log a matplotlib figure (or a list of them, as a grid) rendered as an image; ``close`` closes
        the figures. Needs matplotlib."""
        formats = "NCHW" if isinstance(figure, list) else "CHW"
        self.add_image(tag, figure_to_image(figure, close), global_step, walltime, dataformats=formats)

    def add_video(
        self, tag: str, vid_tensor, global_step: int | None = None, fps: float = 4, walltime: float | None = None
    ) -> None:
        """Log a batch of videos, ``(N, T, C, H, W)``, as one animated GIF (the videos side by side):
        float pixels in [0, 1], ``uint8`` in [0, 255]; 1 or 3 channels.

        PyTorch encodes with moviepy 1.x; kiln encodes with Pillow (which TensorBoard needs anyway).
        """
        self._write(_summary.video(tag, vid_tensor, fps), global_step, walltime)

    def add_audio(
        self,
        tag: str,
        snd_tensor,
        global_step: int | None = None,
        sample_rate: int = 44100,
        walltime: float | None = None,
    ) -> None:
        """Log mono audio: a 1-D tensor of samples in [-1, 1] (louder samples are clipped, with a
        warning), written as 16-bit WAV at ``sample_rate``."""
        self._write(_summary.audio(tag, snd_tensor, sample_rate=sample_rate), global_step, walltime)

    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        """Log text (Markdown) under ``tag``; TensorBoard shows it under ``<tag>/text_summary``."""
        self._write(_summary.text(tag, text_string), global_step, walltime)

    # --------------------------------------------------------------------------- graph, embedding

    def add_graph(self, model, input_to_model=None, verbose: bool = False, use_strict_trace: bool = True) -> None:
        """Log the graph of ``model`` (a :class:`kiln.nn.Module` or any callable): it is run once, in
        evaluation mode, on ``input_to_model`` (a tensor or a tuple of arguments) and the ops it calls are
        recorded, each in the scope of the module it ran in (see the module docstring of
        ``kiln.utils.tensorboard._graph`` for the nodes). ``verbose`` prints the nodes;
        ``use_strict_trace`` warns about list and dict outputs."""
        from kiln.utils.tensorboard._graph import graph

        self._get_file_writer().add_graph(graph(model, input_to_model, verbose, use_strict_trace))

    def add_embedding(
        self,
        mat,
        metadata: list | None = None,
        label_img=None,
        global_step: int | None = None,
        tag: str = "default",
        metadata_header: list | None = None,
    ) -> None:
        """Log an embedding for the projector: ``mat`` is ``(N, D)``, one row per data point;
        ``metadata`` one label (or, with ``metadata_header``, one row of columns) per point;
        ``label_img`` an ``(N, C, H, W)`` image per point. The files go to
        ``<log_dir>/<global_step:05d>/<tag>/`` and ``projector_config.pbtxt`` lists every embedding."""
        mat = make_np(mat)
        if global_step is None:
            global_step = 0
        subdir = f"{str(global_step).zfill(5)}/{_embedding.encode_tag(tag)}"
        logdir = self._get_file_writer().get_logdir()
        save_path = _embedding.join(logdir, subdir)
        if tf.io.gfile.exists(save_path):
            if not tf.io.gfile.isdir(save_path):
                raise NotADirectoryError(f"Path: `{save_path}` exists, but is a file. Cannot proceed.")
            warnings.warn("Embedding dir exists, did you set global_step for add_embedding()?", stacklevel=2)
        else:
            tf.io.gfile.makedirs(save_path)
        if metadata is not None:
            if mat.shape[0] != len(metadata):
                raise AssertionError("#labels should equal with #data points")
            _embedding.write_metadata(metadata, save_path, metadata_header=metadata_header)
        if label_img is not None:
            label_img = make_np(label_img)
            if mat.shape[0] != label_img.shape[0]:
                raise AssertionError("#images should equal with #data points")
            _embedding.write_sprite(label_img, save_path)
        if mat.ndim != 2:
            raise AssertionError("mat should be 2D, where mat.size(0) is the number of data points")
        _embedding.write_matrix(mat, save_path)
        if not hasattr(self, "_projector_config"):
            self._projector_config = ProjectorConfig()
        info = _embedding.embedding_info(metadata, label_img, subdir, global_step, tag)
        self._projector_config.embeddings.extend([info])
        _embedding.write_config(logdir, self._projector_config)

    # ------------------------------------------------------------------------- curves and plugins

    def add_pr_curve(
        self,
        tag: str,
        labels,
        predictions,
        global_step: int | None = None,
        num_thresholds: int = 127,
        weights=None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve: ``predictions`` are probabilities in [0, 1], ``labels`` the
        truth (0/1 or bool), ``weights`` optional per-example weights; ``num_thresholds`` at most 127."""
        labels, predictions = make_np(labels), make_np(predictions)
        self._write(_summary.pr_curve(tag, labels, predictions, num_thresholds, weights), global_step, walltime)

    def add_pr_curve_raw(
        self,
        tag: str,
        true_positive_counts,
        false_positive_counts,
        true_negative_counts,
        false_negative_counts,
        precision,
        recall,
        global_step: int | None = None,
        num_thresholds: int = 127,
        weights=None,
        walltime: float | None = None,
    ) -> None:
        """Log a precision-recall curve from its counts, precision and recall at each threshold
        (``weights`` is accepted and unused, as in PyTorch)."""
        counts = (true_positive_counts, false_positive_counts, true_negative_counts, false_negative_counts)
        summary = _summary.pr_curve_raw(tag, *counts, precision, recall, num_thresholds)
        self._write(summary, global_step, walltime)

    def add_hparams(
        self,
        hparam_dict: dict,
        metric_dict: dict,
        hparam_domain_discrete: dict | None = None,
        run_name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Log a set of hyperparameters and the metrics they gave, for the HParams dashboard: written to
        the run ``<log_dir>/<run_name>`` (default: the current time), each metric also as a scalar.
        ``hparam_domain_discrete`` lists the values a hyperparameter can take."""
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        summaries = _summary.hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        run_name = run_name or str(time.time())
        with SummaryWriter(log_dir=os.path.join(self._get_file_writer().get_logdir(), run_name)) as w:
            assert w.file_writer is not None
            for summary in summaries:
                w.file_writer.add_summary(summary, global_step)
            for k, v in metric_dict.items():
                w.add_scalar(k, v, global_step)

    def add_custom_scalars(self, layout: dict) -> None:
        """Lay out the custom-scalars dashboard: ``{category: {chart title: ["Multiline", [tags...]]
        or ["Margin", [value tag, lower tag, upper tag]]}}``."""
        self._write(_summary.custom_scalars(layout))

    def add_custom_scalars_multilinechart(
        self, tags: list[str], category: str = "default", title: str = "untitled"
    ) -> None:
        """One custom-scalars chart with a line per tag."""
        self._write(_summary.custom_scalars({category: {title: ["Multiline", tags]}}))

    def add_custom_scalars_marginchart(
        self, tags: list[str], category: str = "default", title: str = "untitled"
    ) -> None:
        """One custom-scalars chart of a value and its lower and upper margins (three tags)."""
        if len(tags) != 3:
            raise AssertionError(f"Expected 3 tags, got {len(tags)}.")
        self._write(_summary.custom_scalars({category: {title: ["Margin", tags]}}))

    def add_mesh(
        self,
        tag: str,
        vertices,
        colors=None,
        faces=None,
        config_dict: dict | None = None,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log a mesh or point cloud for the mesh plugin: ``vertices`` ``(B, N, 3)``, optional ``colors``
        ``(B, N, 3)`` (0-255) and ``faces`` ``(B, F, 3)`` (vertex indices); ``config_dict`` holds three.js
        settings (camera, lights, material)."""
        self._write(_summary.mesh(tag, vertices, colors, faces, config_dict), global_step, walltime)

    # ------------------------------------------------------------------------------------ files

    def flush(self) -> None:
        """Write everything queued to disk, in every event file of this writer."""
        if self.all_writers is None:
            return
        for writer in self.all_writers.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close every event file; logging again afterwards starts a new event file."""
        if self.all_writers is None:
            return
        for writer in self.all_writers.values():
            writer.flush()
            writer.close()
        self.file_writer = self.all_writers = None

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.close()
