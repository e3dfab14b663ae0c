"""kiln.utils.tensorboard against torch.utils.tensorboard: the same calls, the same events.

Every call is made once on kiln's ``SummaryWriter`` with kiln tensors and once on PyTorch's with torch
tensors holding the same values, with a fixed ``walltime``; the event files are read back with
TensorBoard's own loader and compared byte for byte (PNG and WAV included), and TensorBoard's
``EventAccumulator`` must read kiln's. Errors are compared with PyTorch's (type and message). The graph
tests are in test_tensorboard_graph.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import kiln_testutil as U
import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard", reason="kiln.utils.tensorboard needs tensorboard (the core's 'tensorboard' extra)")

from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.util import tensor_util
from torch.utils.tensorboard import SummaryWriter as TorchWriter

import kiln
from kiln.utils.tensorboard import FileWriter, SummaryWriter

WALL = 1234.5


def _tensor(lib, a, dtype=None):
    t = (torch.from_numpy if lib is torch else kiln.from_numpy)(np.array(a))
    return t if dtype is None else t.to(getattr(lib, dtype))


def _events(logdir) -> list:
    """Every event of the event files directly in ``logdir`` but each file's header, as written (not
    migrated to TensorBoard's newer layouts, as the EventAccumulator does)."""
    out = []
    for f in sorted(p for p in os.listdir(logdir) if p.startswith("events.out.tfevents")):
        out.extend(list(LegacyEventFileLoader(os.path.join(logdir, f)).Load())[1:])
    return out


def _run(tmp_path, calls, *, sub=""):
    """``calls(writer, T)`` on both writers (``T(array, dtype=None)`` makes that library's tensor)."""
    for lib, writer in ((kiln, SummaryWriter), (torch, TorchWriter)):
        with writer(str(tmp_path / lib.__name__)) as w:
            calls(w, lambda a, dtype=None, lib=lib: _tensor(lib, a, dtype))
    return _events(tmp_path / "kiln" / sub), _events(tmp_path / "torch" / sub)


def _same(kiln_events, torch_events):
    assert len(kiln_events) == len(torch_events) > 0
    for k, t in zip(kiln_events, torch_events):
        assert k.SerializeToString() == t.SerializeToString(), f"kiln:\n{str(k)[:1500]}\ntorch:\n{str(t)[:1500]}"


def _same_error(kiln_fn, torch_fn, message=None):
    """kiln raises torch's exception with torch's message, whose runs of spaces (line continuations in
    torch's source) count as one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if message is None:
            message = U.kiln_message(" ".join(str(U.torch_error(torch_fn)).split()))
        return U.assert_same_error(kiln_fn, torch_fn, message=message)


@pytest.fixture
def writers(tmp_path):
    """A kiln and a torch writer for error tests, closed after."""
    k, t = SummaryWriter(str(tmp_path / "k")), TorchWriter(str(tmp_path / "t"))
    yield k, t
    k.close()
    t.close()


RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4, 5)).astype(np.float32)
INTS = RNG.integers(-2, 3, 50)


# ------------------------------------------------------------------------------------------ scalars


def test_scalars_match_torch(tmp_path):
    def calls(w, T):
        w.add_scalar("py float", 1.5, 0, walltime=WALL)
        w.add_scalar("py int", 7, 1, walltime=WALL)
        w.add_scalar("bool", True, 1, walltime=WALL)
        w.add_scalar("numpy", np.float64(0.25), 2, walltime=WALL)
        w.add_scalar("0-d", T(3.25), 3, walltime=WALL)
        w.add_scalar("1x1", T([[2.5]]), 4, walltime=WALL)
        w.add_scalar("int tensor", T(5), 4, walltime=WALL)
        w.add_scalar("f16", T(0.1, "float16"), 4, walltime=WALL)
        w.add_scalar("bf16", T(0.1, "bfloat16"), 4, walltime=WALL)
        w.add_scalar("float step", 1.0, 2.7, walltime=WALL)
        w.add_scalar("no step", 1.0, walltime=WALL)
        w.add_scalar("new", T(0.3), 5, walltime=WALL, new_style=True)
        w.add_scalar("new64", T(0.3, "float64"), 5, walltime=WALL, new_style=True, double_precision=True)
        for v in (float("nan"), float("inf"), -float("inf")):
            w.add_scalar("nonfinite", v, 6, walltime=WALL)
            w.add_scalar("nonfinite new", T(v), 6, walltime=WALL, new_style=True)

    _same(*_run(tmp_path, calls))
    acc = EventAccumulator(str(tmp_path / "kiln"))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("0-d")] == [(3, 3.25)]
    assert np.isnan(acc.Scalars("nonfinite")[0].value) and acc.Scalars("nonfinite")[1].value == float("inf")


def test_scalar_of_a_tensor_that_requires_grad(tmp_path):
    x = kiln.tensor([2.0], requires_grad=True)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_scalar("loss", (x * 3).sum(), 1)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert acc.Scalars("loss")[0].value == 6.0


def test_add_scalars_writes_one_run_per_tag(tmp_path):
    def calls(w, T):
        w.add_scalars("run/loss", {"train": T(0.5), "val": 0.75}, 1, walltime=WALL)
        w.add_scalars("run/loss", {"train": 0.25}, 2, walltime=WALL)

    _same(*_run(tmp_path, calls, sub="run_loss_train"))
    _same(*_run(tmp_path / "again", calls, sub="run_loss_val"))
    for lib in ("kiln", "torch"):
        runs = {p for p in os.listdir(tmp_path / lib) if not p.startswith("events")}
        assert runs == {"run_loss_train", "run_loss_val"}


@pytest.mark.parametrize(
    "value",
    [[1.0], None, "abc", 1 + 2j, np.ones(2), "ones(2)", "ones(2, 2)"],
    ids=["list", "None", "str", "complex", "array", "vector", "matrix"],
)
def test_add_scalar_bad_values(writers, value):
    k, t = writers
    kv = tv = value
    if isinstance(value, str) and value.startswith("ones"):
        kv, tv = eval(f"kiln.{value}"), eval(f"torch.{value}")
    message = None
    if isinstance(value, list) or value is None:
        message = f"Got {type(value)}, but numpy array or kiln tensor are expected."
    _same_error(lambda: k.add_scalar("s", kv), lambda: t.add_scalar("s", tv), message=message)


def test_add_scalar_bad_step(writers):
    k, t = writers
    _same_error(lambda: k.add_scalar("s", 1.0, "x"), lambda: t.add_scalar("s", 1.0, "x"))


# --------------------------------------------------------------------------------------- histograms


@pytest.mark.parametrize(
    "bins",
    ["tensorflow", "auto", "fd", "doane", "sqrt", "sturges", 10, [-3.0, -1.0, 0.0, 0.5, 3.0]],
    ids=str,
)
def test_histograms_match_torch(tmp_path, bins):
    def calls(w, T):
        w.add_histogram("f32", T(A), 1, bins=bins, walltime=WALL)
        w.add_histogram("transposed", T(A).transpose(0, 2), 1, bins=bins, walltime=WALL)
        w.add_histogram("f64", T(A, "float64") * 2, 2, bins=bins, walltime=WALL)
        w.add_histogram("int", T(INTS), 3, bins=bins, walltime=WALL)
        w.add_histogram("numpy", A * 0.5, 4, bins=bins, walltime=WALL)
        w.add_histogram("one value", T([0.25]), 5, bins=bins, walltime=WALL)
        w.add_histogram("max_bins", T(A), 6, bins=bins, walltime=WALL, max_bins=3)

    _same(*_run(tmp_path, calls))


def test_histogram_dtypes_and_nonfinite_values(tmp_path):
    def calls(w, T):
        w.add_histogram("f16", T(A, "float16"), 1, walltime=WALL)
        w.add_histogram("bf16", T(A, "bfloat16"), 1, walltime=WALL)
        w.add_histogram("bool", T(A > 0), 1, walltime=WALL)
        w.add_histogram("uint8", T(A > 0, "uint8"), 1, walltime=WALL)
        w.add_histogram("nan", T([1.0, float("nan"), -2.0]), 1, walltime=WALL)
        w.add_histogram("inf", T([1.0, float("inf"), -2.0]), 1, walltime=WALL)
        w.add_histogram("huge", T([1e30, -1e30, 0.0]), 1, walltime=WALL)

    _same(*_run(tmp_path, calls))
    acc = EventAccumulator(str(tmp_path / "kiln"))
    acc.Reload()
    hist = acc.Histograms("bf16")[0].histogram_value
    assert hist.num == A.size and sum(hist.bucket) == A.size


def test_histogram_of_a_parameter(tmp_path):
    w = kiln.randn(10, 10, requires_grad=True)
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_histogram("w", w, 0)
        writer.add_histogram("grad-carrying", w * 2, 0)
    assert len(_events(tmp_path)) == 2


@pytest.mark.parametrize(
    ("values", "bins"),
    [
        ([], "tensorflow"),
        ([1.0, float("inf")], "auto"),
        ([5.0, 6.0], [0.0, 1.0, 2.0]),
        ([5.0, 6.0], "not-an-estimator"),
        ("list", "tensorflow"),
    ],
    ids=["empty", "inf with estimator", "outside the bins", "bad estimator", "list"],
)
def test_add_histogram_errors(writers, values, bins):
    k, t = writers
    if values == "list":
        kv = tv = [1.0, 2.0]
        message = "Got <class 'list'>, but numpy array or kiln tensor are expected."
    else:
        kv, tv, message = kiln.tensor(values), torch.tensor(values), None
    _same_error(
        lambda: k.add_histogram("h", kv, bins=bins), lambda: t.add_histogram("h", tv, bins=bins), message=message
    )


def test_histogram_raw(tmp_path, writers):
    def calls(w, T):
        w.add_histogram_raw("raw", -1.0, 2.0, 6, 3.0, 9.5, [-1.0, 0.0, 2.0], [1, 3, 2], 1, walltime=WALL)
        w.add_histogram_raw("raw np", 0, 1, 3, 1, 1, np.array([0.5, 1.0]), np.array([1, 2]), 2, walltime=WALL)

    _same(*_run(tmp_path, calls))
    k, t = writers
    _same_error(
        lambda: k.add_histogram_raw("h", 0, 1, 2, 1, 1, [1, 2], [1]),
        lambda: t.add_histogram_raw("h", 0, 1, 2, 1, 1, [1, 2], [1]),
    )


# ------------------------------------------------------------------------------------------- images


def _pixels(event) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(event.summary.value[0].image.encoded_image_string)))


IMAGES = {
    "CHW": (RNG.random((3, 6, 7)), "CHW"),
    "HWC": (RNG.random((6, 7, 3)), "HWC"),
    "HW": (RNG.random((6, 7)), "HW"),
    "WH": (RNG.random((7, 6)), "WH"),
    "chw lower case": (RNG.random((3, 6, 7)), "chw"),
    "1 channel": (RNG.random((1, 6, 7)), "CHW"),
    "2 channels": (RNG.random((2, 6, 7)), "CHW"),
    "RGBA": (RNG.random((4, 6, 7)), "CHW"),
    "HWC RGBA": (RNG.random((6, 7, 4)), "HWC"),
    "out of range": (RNG.standard_normal((3, 6, 7)) * 2, "CHW"),
    "1x1": (RNG.random((3, 1, 1)), "CHW"),
}


@pytest.mark.parametrize("name", list(IMAGES))
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_images_match_torch(tmp_path, name, dtype):
    array, formats = IMAGES[name]

    def calls(w, T):
        w.add_image("img", T(array.astype(np.float32), dtype), 1, walltime=WALL, dataformats=formats)

    ke, te = _run(tmp_path, calls)
    _same(ke, te)
    np.testing.assert_array_equal(_pixels(ke[0]), _pixels(te[0]))


@pytest.mark.parametrize("dtype", ["uint8", "int64", "bool", "int16"])
def test_integer_and_bool_images_match_torch(tmp_path, dtype):
    array = RNG.integers(0, 256, (3, 5, 4)) if dtype != "bool" else RNG.random((3, 5, 4)) > 0.5

    def calls(w, T):
        w.add_image("img", T(array, dtype), 1, walltime=WALL)
        w.add_images("imgs", T(np.stack([array, array]), dtype), 1, walltime=WALL)

    _same(*_run(tmp_path, calls))


@pytest.mark.parametrize("n", [1, 5, 8, 11])
def test_image_batches_are_tiled_like_torch(tmp_path, n):
    rgb, gray = RNG.random((n, 3, 4, 5)), RNG.random((n, 1, 4, 5))

    def calls(w, T):
        w.add_images("nchw", T(rgb), 1, walltime=WALL)
        w.add_images("gray", T(gray), 1, walltime=WALL)
        w.add_images("nhwc", T(rgb.transpose(0, 2, 3, 1)), 1, walltime=WALL, dataformats="NHWC")
        w.add_image("as one image", T(rgb), 1, walltime=WALL, dataformats="NCHW")

    ke, te = _run(tmp_path, calls)
    _same(ke, te)
    cols = min(n, 8)
    assert _pixels(ke[0]).shape == (4 * -(-n // cols), 5 * cols, 3)


def test_image_pixels_are_the_values_scaled(tmp_path):
    img = kiln.tensor([[[0.0, 0.5, 1.0, 2.0, -1.0]]])  # CHW, one channel
    with SummaryWriter(str(tmp_path)) as w:
        w.add_image("x", img, 0)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    (event,) = acc.Images("x")
    pixels = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)))
    assert (event.width, event.height) == (5, 1)
    np.testing.assert_array_equal(pixels[0, :, 0], [0, 127, 255, 255, 0])


@pytest.mark.parametrize(
    ("shape", "formats"),
    [
        ((3, 4, 5), "CHWN"),
        ((3, 4, 5), "CCH"),
        ((3, 4, 5), "XYZ"),
        ((5, 4, 5), "CHW"),
        ((3, 0, 5), "CHW"),
        ((2, 4, 4, 5), "NCHW"),
        ((4, 5), "CHW"),
    ],
    ids=[
        "too many letters",
        "repeated letter",
        "unknown letters",
        "5 channels",
        "empty",
        "4-channel batch",
        "2-D as CHW",
    ],
)
def test_add_image_errors(writers, shape, formats):
    k, t = writers
    a = RNG.random(shape).astype(np.float32)
    kiln_fn = lambda: k.add_image("i", kiln.from_numpy(a.copy()), dataformats=formats)
    torch_fn = lambda: t.add_image("i", torch.from_numpy(a.copy()), dataformats=formats)
    if formats == "XYZ":  # torch fails inside numpy's transpose; kiln says what is wrong (same type)
        with pytest.raises(type(U.torch_error(torch_fn)), match="does not name an image"):
            kiln_fn()
    else:
        _same_error(kiln_fn, torch_fn)


def test_empty_batch_of_images(writers):
    k, _ = writers
    # torch divides by zero (ZeroDivisionError); kiln says why
    with pytest.raises(ValueError, match="cannot write empty image"):
        k.add_images("i", kiln.zeros(0, 3, 4, 4))


def test_large_image_round_trips(tmp_path):
    big = RNG.integers(0, 256, (2048, 2048, 3), dtype=np.uint8)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_image("big", kiln.from_numpy(big), 0, dataformats="HWC")
    (event,) = _events(tmp_path)
    np.testing.assert_array_equal(_pixels(event), big)


def test_image_with_boxes_matches_torch(tmp_path):
    img = RNG.random((3, 40, 50)).astype(np.float32)
    boxes = np.array([[2.0, 3.0, 20.0, 25.0], [10.0, 10.0, 45.0, 38.0]])

    def calls(w, T):
        w.add_image_with_boxes("b", T(img), T(boxes), 1, walltime=WALL, labels=["cat", "dog"])
        w.add_image_with_boxes("one label", T(img), T(boxes[:1]), 1, walltime=WALL, labels="cat")
        w.add_image_with_boxes("wrong count", T(img), T(boxes), 1, walltime=WALL, labels=["cat"])
        w.add_image_with_boxes("rescaled", T(img), T(boxes), 1, walltime=WALL, rescale=2)

    _same(*_run(tmp_path, calls))


def test_figures_match_torch(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")

    def figure():
        fig = plt.figure(figsize=(2, 1.5), dpi=50)
        plt.plot([0, 1, 2], [1, 0, 2])
        return fig

    closed = []

    def calls(w, T):
        fig = figure()
        w.add_figure("fig", fig, 1, walltime=WALL)
        closed.append(not plt.fignum_exists(fig.number))
        kept = figure()
        w.add_figure("kept", kept, 1, close=False, walltime=WALL)
        closed.append(not plt.fignum_exists(kept.number))
        plt.close(kept)
        w.add_figure("list", [figure(), figure()], 2, walltime=WALL)

    ke, te = _run(tmp_path, calls)
    _same(ke, te)
    assert closed == [True, False, True, False]
    assert _pixels(ke[2]).shape == (75, 200, 3)


# ------------------------------------------------------------------------------------- video, audio


@pytest.mark.parametrize("batch", [1, 3, 4])
@pytest.mark.parametrize("channels", [1, 3])
def test_video_frames_decode_to_the_tiled_input(tmp_path, batch, channels):
    from torch.utils.tensorboard._utils import _prepare_video  # torch's tiling, as the oracle

    video = RNG.integers(0, 2, (batch, 3, channels, 4, 6)).astype(np.float32)  # black/white: GIF-exact
    with SummaryWriter(str(tmp_path)) as w:
        w.add_video("v", kiln.from_numpy(video), 1, fps=10)
    (event,) = _events(tmp_path)
    expected = (_prepare_video(video.copy()) * 255).astype(np.uint8)
    gif = Image.open(io.BytesIO(event.summary.value[0].image.encoded_image_string))
    assert gif.format == "GIF" and gif.n_frames == 3
    assert gif.info["duration"] == 100
    for i in range(3):
        gif.seek(i)
        frame = np.asarray(gif.convert("RGB"))
        np.testing.assert_array_equal(frame, np.repeat(expected[i], 3 // channels, axis=2))
    image = event.summary.value[0].image
    assert (image.height, image.width, image.colorspace) == (*expected.shape[1:3], channels)


def test_video_errors(writers):
    k, _ = writers
    with pytest.raises(ValueError, match="5-D"):
        k.add_video("v", kiln.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="1 or 3 channels"):
        k.add_video("v", kiln.zeros(1, 2, 2, 4, 4))


def test_audio_matches_torch(tmp_path):
    sound = RNG.random(200).astype(np.float32) * 2 - 1

    def calls(w, T):
        w.add_audio("a", T(sound), 1, walltime=WALL)
        w.add_audio("rate", T(sound[None, :]), 2, sample_rate=8000, walltime=WALL)
        w.add_audio("f64", T(sound, "float64"), 3, walltime=WALL)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            w.add_audio("loud", T(sound * 3), 4, walltime=WALL)

    _same(*_run(tmp_path, calls))
    acc = EventAccumulator(str(tmp_path / "kiln"))
    acc.Reload()
    assert acc.Audio("rate")[0].sample_rate == 8000


def test_audio_clipping_warns_and_errors(writers):
    k, t = writers
    with pytest.warns(UserWarning, match="audio amplitude out of range"):
        k.add_audio("a", kiln.tensor([0.5, 2.0]))
    _same_error(lambda: k.add_audio("a", kiln.rand(2, 5)), lambda: t.add_audio("a", torch.rand(2, 5)))
    _same_error(lambda: k.add_audio("a", kiln.tensor([])), lambda: t.add_audio("a", torch.tensor([])))


# ------------------------------------------------------------------------------------- text, plugins


def test_text_matches_torch(tmp_path, writers):
    def calls(w, T):
        w.add_text("t", "hello **world**", 1, walltime=WALL)
        w.add_text("unicode", "λ = 0.1 — ünïcode ✓", 2, walltime=WALL)
        w.add_text("empty", "", 3, walltime=WALL)

    _same(*_run(tmp_path, calls))
    acc = EventAccumulator(str(tmp_path / "kiln"))
    acc.Reload()
    (event,) = acc.Tensors("unicode/text_summary")
    assert tensor_util.make_ndarray(event.tensor_proto)[0].decode() == "λ = 0.1 — ünïcode ✓"
    k, t = writers
    _same_error(lambda: k.add_text("t", 5), lambda: t.add_text("t", 5))


def test_pr_curves_match_torch(tmp_path):
    labels, preds, weights = RNG.integers(0, 2, 100), RNG.random(100).astype(np.float32), RNG.random(100)
    raw = RNG.integers(0, 9, (4, 4)).astype(np.float32)

    def calls(w, T):
        w.add_pr_curve("pr", T(labels), T(preds), 1, walltime=WALL)
        w.add_pr_curve("bool labels", T(labels.astype(bool)), T(preds), 1, walltime=WALL)
        w.add_pr_curve("few thresholds", T(labels), T(preds), 1, num_thresholds=5, walltime=WALL)
        w.add_pr_curve("capped", T(labels), T(preds), 1, num_thresholds=500, walltime=WALL)
        w.add_pr_curve("weighted", T(labels), T(preds), 1, weights=weights, walltime=WALL)
        counts = [T(c) for c in raw]
        w.add_pr_curve_raw("raw", *counts, T(np.ones(4)), T(np.zeros(4)), 2, num_thresholds=4, walltime=WALL)

    _same(*_run(tmp_path, calls))


def test_custom_scalars_match_torch(tmp_path, writers):
    layout = {"Losses": {"both": ["Multiline", ["loss/train", "loss/val"]], "band": ["Margin", ["m", "lo", "hi"]]}}

    def calls(w, T):
        w.add_custom_scalars(layout)
        w.add_custom_scalars_multilinechart(["a", "b"], category="cat", title="t")
        w.add_custom_scalars_marginchart(["a", "b", "c"])

    ke, te = _run(tmp_path, calls)
    for e in (*ke, *te):
        e.wall_time = WALL  # these methods take no walltime
    _same(ke, te)
    k, t = writers
    _same_error(lambda: k.add_custom_scalars_marginchart(["a"]), lambda: t.add_custom_scalars_marginchart(["a"]))
    bad = {"c": {"t": ["Margin", ["a"]]}}
    _same_error(lambda: k.add_custom_scalars(bad), lambda: t.add_custom_scalars(bad))


def test_hparams_match_torch(tmp_path):
    hp = {"lr": 0.1, "layers": 3, "optimizer": "adam", "amsgrad": True, "skipped": None}
    domains = {"optimizer": ["adam", "sgd"], "layers": [2, 3, 4]}

    def calls(w, T):
        w.add_hparams(hp, {"accuracy": 0.9, "loss": T(0.25)}, domains, run_name="trial", global_step=3)
        w.add_hparams({"t": T([0.5])}, {"m": 1.0}, run_name="tensor")

    ke, te = _run(tmp_path, calls, sub="trial")
    for e in (*ke, *te):
        e.wall_time = WALL
    _same(ke, te)
    ke, te = _events(tmp_path / "kiln" / "tensor"), _events(tmp_path / "torch" / "tensor")
    for e in (*ke, *te):
        e.wall_time = WALL
    _same(ke, te)


def test_hparams_takes_0d_tensors(tmp_path):
    # torch indexes a 0-d array and raises IndexError; kiln takes the value
    with SummaryWriter(str(tmp_path)) as w:
        w.add_hparams({"lr": kiln.tensor(0.5)}, {"m": 1.0}, run_name="r")
    assert len(_events(tmp_path / "r")) == 4


@pytest.mark.parametrize(
    "args",
    [([1], {}), ({"a": [1]}, {}), ({"a": 1}, {}, {"a": [1, "x"]}), ({"a": 1}, {}, {"b": [1]}), ({}, [1])],
    ids=["hparams not a dict", "list value", "mixed domain", "domain of an unknown name", "metrics not a dict"],
)
def test_add_hparams_errors(writers, args):
    k, t = writers
    message = None
    if args[0] == {"a": [1]}:
        message = "value should be one of int, float, str, bool, or kiln.Tensor"
    _same_error(lambda: k.add_hparams(*args), lambda: t.add_hparams(*args), message=message)


def test_mesh_matches_torch(tmp_path):
    vertices = RNG.random((1, 4, 3)).astype(np.float32)
    faces = np.array([[[0, 1, 2], [1, 2, 3]]])
    colors = RNG.integers(0, 256, (1, 4, 3))

    def calls(w, T):
        w.add_mesh("points", T(vertices), global_step=1, walltime=WALL)
        config = {"camera": {"cls": "PerspectiveCamera", "fov": 75}}
        w.add_mesh(
            "mesh", T(vertices), colors=T(colors), faces=T(faces), config_dict=config, global_step=2, walltime=WALL
        )

    _same(*_run(tmp_path, calls))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int16", "int8", "bool"])
def test_add_tensor_matches_torch(tmp_path, dtype):
    def calls(w, T):
        w.add_tensor("t", T(A * 10, dtype), 1, walltime=WALL)
        w.add_tensor("0-d", T(1.0, dtype), 1, walltime=WALL)

    _same(*_run(tmp_path, calls))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "uint8", "float32", "int64", "bool"])
def test_add_tensor_reads_back(tmp_path, dtype):
    t = _tensor(kiln, A * 10, dtype)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_tensor("t", t, 1)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    got = tensor_util.make_ndarray(acc.Tensors("t")[0].tensor_proto)
    expected = t.float().numpy() if dtype == "bfloat16" else t.numpy()
    np.testing.assert_array_equal(got.astype(expected.dtype), expected)
    assert got.shape == (3, 4, 5)


def test_add_tensor_errors(writers):
    k, _ = writers
    with pytest.raises(TypeError, match=r"expects a kiln\.Tensor"):
        k.add_tensor("t", np.ones(2))


# ---------------------------------------------------------------------------------------- embeddings


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "tfevents" not in p.name
    }


def test_embeddings_match_torch(tmp_path):
    mat = RNG.standard_normal((9, 4)).astype(np.float32)
    images = RNG.random((9, 3, 5, 5)).astype(np.float32)
    ints = RNG.integers(0, 5, (9, 3))

    def calls(w, T):
        w.add_embedding(T(mat), metadata=list("abcdefghi"), label_img=T(images), global_step=3)
        rows = [[i, f"n{i}"] for i in range(9)]
        w.add_embedding(T(mat[:, :2], "float64"), metadata=rows, metadata_header=["id", "name"], tag="a/b%c")
        w.add_embedding(mat, tag="plain numpy", global_step=1)
        w.add_embedding(T(ints), label_img=T(images[:, :1]), tag="gray sprite")

    _run(tmp_path, calls)
    kiln_files, torch_files = _files(tmp_path / "kiln"), _files(tmp_path / "torch")
    assert kiln_files.keys() == torch_files.keys()
    assert "00000/a%2fb%25c/metadata.tsv" in kiln_files
    for name, data in kiln_files.items():
        if name.endswith(".png"):
            np.testing.assert_array_equal(
                np.asarray(Image.open(io.BytesIO(data))), np.asarray(Image.open(io.BytesIO(torch_files[name])))
            )
        else:
            assert data == torch_files[name], name


@pytest.mark.parametrize(
    "kwargs",
    [{"mat": "1-D"}, {"metadata": ["a"]}, {"metadata": [["a", "b"]] * 3, "metadata_header": ["x"]}, {"label_img": "2"}],
    ids=["1-D mat", "metadata count", "header width", "image count"],
)
def test_add_embedding_errors(writers, kwargs):
    k, t = writers

    def args(lib):
        out = {"mat": lib.ones(3, 2)}
        for key, value in kwargs.items():
            out[key] = (
                {"1-D": lib.ones(3), "2": lib.zeros(2, 3, 4, 4)}.get(value, value) if isinstance(value, str) else value
            )
        return out

    _same_error(lambda: k.add_embedding(**args(kiln)), lambda: t.add_embedding(**args(torch)))


def test_add_embedding_where_a_file_is(writers):
    k, t = writers
    for w in writers:
        os.makedirs(os.path.join(w.get_logdir(), "00000"))
        Path(w.get_logdir(), "00000", "default").write_text("")
    assert isinstance(U.torch_error(lambda: t.add_embedding(torch.ones(2, 2))), NotADirectoryError)
    with pytest.raises(NotADirectoryError, match=r"exists, but is a file\. Cannot proceed\."):
        k.add_embedding(kiln.ones(2, 2))


def test_add_embedding_twice_at_one_step_warns(writers):
    k, _ = writers
    k.add_embedding(kiln.ones(2, 2))
    with pytest.warns(UserWarning, match="Embedding dir exists"):
        k.add_embedding(kiln.ones(2, 2))


# -------------------------------------------------------------------------------- the writer itself


def test_default_log_dir_is_named_like_torch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with SummaryWriter(comment="_lr0.1") as k, TorchWriter(comment="_lr0.1") as t:
        kd, td = k.get_logdir(), t.get_logdir()
    assert kd.startswith("runs" + os.sep) and kd.endswith("_lr0.1")
    assert kd.split("_")[2:] == td.split("_")[2:] and len(kd) == len(td)  # the time may differ by a second
    assert os.path.isdir(tmp_path / kd)


def test_writer_lifecycle(tmp_path):
    path = tmp_path / "run"
    w = SummaryWriter(path, filename_suffix=".v1", purge_step=5, max_queue=2, flush_secs=1)
    assert w.get_logdir() == path  # as given, like torch
    w.add_scalar("s", 1.0, 6)
    w.flush()
    (first,) = os.listdir(path)
    assert first.startswith("events.out.tfevents.") and first.endswith(".v1")
    events = _events(path)
    assert [e.step for e in events[:2]] == [5, 5] and events[1].session_log.status == 1  # SessionLog.START
    assert events[2].summary.value[0].simple_value == 1.0
    w.close()
    w.close()  # twice is fine
    w.add_scalar("s", 2.0, 7)  # after close: a new event file, as in torch
    w.close()
    assert len(os.listdir(path)) == 2
    acc = EventAccumulator(str(path))
    acc.Reload()
    assert [s.value for s in acc.Scalars("s")] == [1.0, 2.0]


def test_context_manager_closes_on_error(tmp_path):
    with pytest.raises(KeyError), SummaryWriter(str(tmp_path)) as w:
        w.add_scalar("s", 1.0, 0)
        raise KeyError("boom")
    assert w.all_writers is None
    assert len(_events(tmp_path)) == 1


def test_file_writer(tmp_path):
    from tensorboard.compat.proto.summary_pb2 import Summary

    fw = FileWriter(tmp_path)
    fw.add_summary(Summary(value=[Summary.Value(tag="x", simple_value=2.0)]), 3, WALL)
    fw.close()
    (event,) = _events(tmp_path)
    assert (event.step, event.wall_time, event.summary.value[0].simple_value) == (3, WALL, 2.0)
    assert fw.get_logdir() == str(tmp_path)


def test_bad_log_dirs(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for bad in (afile, afile / "sub", Path("/proc/kiln-tensorboard")):
        _same_error(lambda b=bad: SummaryWriter(str(b)), lambda b=bad: TorchWriter(str(b)))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_log_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _same_error(lambda: SummaryWriter(str(ro / "run")), lambda: TorchWriter(str(ro / "run")))
    finally:
        ro.chmod(0o700)


def test_values_from_other_sources(tmp_path):
    with SummaryWriter(str(tmp_path)) as w:
        w.add_histogram("np f16", A.astype(np.float16), 0)
        w.add_scalar("np 0-d", np.array(2.0), 0)
        w.add_image("np uint8", np.full((3, 2, 2), 255, dtype=np.uint8), 0)
    assert len(_events(tmp_path)) == 3


def test_missing_tensorboard_names_the_install():
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "import kiln, kiln.utils\n"
        "for load in (lambda: __import__('kiln.utils.tensorboard'), lambda: kiln.utils.tensorboard):\n"
        "    try:\n"
        "        load()\n"
        "    except ModuleNotFoundError as e:\n"
        "        print(e.name, '|', e)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 2, out
    for line in lines:
        assert line.startswith("tensorboard |")
        assert "pip install tensorboard" in line and "pip install kiln[tensorboard]" in line


def _other_devices() -> list[str]:
    import kiln.plugins

    return [name for name in kiln.plugins.devices() if name != "cpu"]


@pytest.mark.parametrize(
    "device", _other_devices() or [pytest.param("none", marks=pytest.mark.skip("no device but the CPU"))]
)
def test_tensors_on_other_devices_are_copied_to_the_cpu(tmp_path, device):
    values = kiln.from_numpy(np.abs(A))

    def log(logdir, to):
        with SummaryWriter(str(logdir)) as w:
            w.add_scalar("s", to(values[0, 0, 0]), 0, walltime=WALL)
            w.add_histogram("h", to(values), 0, walltime=WALL)
            w.add_image("i", to(values / 3), 0, walltime=WALL)
            w.add_embedding(to(values[0]))
        return _events(logdir), (logdir / "00000" / "default" / "tensors.tsv").read_bytes()

    on_device = log(tmp_path / "device", lambda t: t.to(device))
    assert values.to(device).device.type == device
    on_cpu = log(tmp_path / "cpu", lambda t: t)
    _same(on_device[0], on_cpu[0])
    assert on_device[1] == on_cpu[1]
