"""kiln.save / kiln.load: the safetensors layout, nested containers, map_location, atomic writes,
validation of corrupted files, and interop with the ``safetensors`` package in both directions."""

from __future__ import annotations

import io
import json
import math
import os
import struct

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln import serialization

try:
    import safetensors.torch as st_torch
except ImportError:  # a test-only dependency (packages/kiln [test] extra)
    st_torch = None

needs_safetensors = pytest.mark.skipif(
    st_torch is None, reason="the safetensors package is not installed (pip install 'kiln[test]')"
)

DTYPES = [
    (kiln.float32, torch.float32),
    (kiln.float64, torch.float64),
    (kiln.float16, torch.float16),
    (kiln.bfloat16, torch.bfloat16),
    (kiln.int64, torch.int64),
    (kiln.int32, torch.int32),
    (kiln.int16, torch.int16),
    (kiln.int8, torch.int8),
    (kiln.uint8, torch.uint8),
    (kiln.bool, torch.bool),
]
IDS = [str(k).split(".")[-1] for k, _ in DTYPES]


def _sample(kd: kiln.dtype, shape=(3, 4)) -> kiln.Tensor:
    t = kiln.arange(math.prod(shape)).reshape(shape)
    if kd is kiln.bool:
        return (t % 3) == 0
    if kd.is_floating_point:
        return ((t - 5) * 0.375).to(kd)
    if kd is kiln.uint8:
        return (t * 17 % 256).to(kd)
    return (t - 5).to(kd)


def _torch(t: kiln.Tensor) -> torch.Tensor:
    """A torch copy of a kiln tensor (bfloat16 through its raw bits)."""
    if t.dtype is kiln.bfloat16:
        bits = np.array(t.numpy(), order="C").view(np.uint16).astype(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    return torch.from_numpy(np.array(t.numpy(), order="C"))


def _assert_same(a: kiln.Tensor, b: kiln.Tensor) -> None:
    assert a.dtype is b.dtype
    assert tuple(a.shape) == tuple(b.shape)
    assert torch.equal(_torch(a), _torch(b))


def _raw_file(entries: dict, data: bytes, metadata: dict | None = None, pad: bool = True) -> bytes:
    """Hand-built safetensors bytes (header entries given verbatim)."""
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


# ------------------------------------------------------------------------------------------ layout


def test_file_layout_is_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    kiln.save({"w": kiln.tensor([[1.0, 2.0]]), "b": kiln.tensor([7], dtype=kiln.int64)}, p)
    blob = p.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0  # padded with spaces
    header = json.loads(blob[8 : 8 + n])
    assert header["w"]["dtype"] == "F32" and header["w"]["shape"] == [1, 2]
    assert header["b"]["dtype"] == "I64" and header["b"]["shape"] == [1]
    data = blob[8 + n :]
    b, e = header["w"]["data_offsets"]
    assert struct.unpack("<2f", data[b:e]) == (1.0, 2.0)
    b, e = header["b"]["data_offsets"]
    assert struct.unpack("<q", data[b:e]) == (7,)
    assert serialization.STRUCTURE_KEY in header["__metadata__"]


@pytest.mark.parametrize(("kd", "td"), DTYPES, ids=IDS)
def test_round_trip_every_dtype(tmp_path, kd, td):
    t = _sample(kd)
    kiln.save(t, tmp_path / "t.kt")
    out = kiln.load(tmp_path / "t.kt")
    _assert_same(out, t)
    assert out.is_contiguous()


def test_scalar_empty_and_non_contiguous_tensors(tmp_path):
    base = kiln.arange(24.0).reshape(2, 3, 4)
    obj = {
        "scalar": kiln.tensor(3.5),
        "empty": kiln.zeros(0, 3),
        "transposed": base.transpose(0, 2),
        "sliced": base[:, 1:, ::2],
        "expanded": kiln.tensor([1, 2, 3]).expand(4, 3),
        "offset": base[1, 2],
    }
    p = tmp_path / "v.kt"
    kiln.save(obj, p)
    out = kiln.load(p)
    assert list(out) == list(obj)
    for k in obj:
        _assert_same(out[k], obj[k])


def test_nested_containers_and_leaves(tmp_path):
    a, b = kiln.ones(2), kiln.zeros(3, dtype=kiln.int32)
    obj = {
        "model": {"layer.weight": a, "layer.bias": None},
        "optim": [b, (1, 2.5, "x", True, False, None), {"lr": 0.1, "nan": float("nan"), "inf": float("-inf")}],
        "step": 10**20,
        "empty": {},
        "tup": (),
    }
    p = tmp_path / "n.kt"
    kiln.save(obj, p)
    out = kiln.load(p)
    assert list(out) == list(obj)
    _assert_same(out["model"]["layer.weight"], a)
    assert out["model"]["layer.bias"] is None
    _assert_same(out["optim"][0], b)
    assert out["optim"][1] == (1, 2.5, "x", True, False, None)
    assert type(out["optim"][1][3]) is bool and type(out["optim"][1][0]) is int
    assert out["optim"][2]["lr"] == 0.1 and math.isnan(out["optim"][2]["nan"]) and out["optim"][2]["inf"] == -math.inf
    assert out["step"] == 10**20 and out["empty"] == {} and out["tup"] == ()
    assert isinstance(out["optim"], list) and isinstance(out["optim"][1], tuple)


def test_non_tensor_roots_and_name_collisions(tmp_path):
    p = tmp_path / "c.kt"
    kiln.save([1, "two", None], p)
    assert kiln.load(p) == [1, "two", None]
    # "a.b" as a key and as a path, and the reserved "__metadata__" name, all stay distinct
    obj = {"a.b": kiln.ones(1), "a": {"b": kiln.zeros(1)}, "__metadata__": kiln.full((1,), 2.0)}
    kiln.save(obj, p)
    out = kiln.load(p)
    assert out["a.b"].item() == 1.0 and out["a"]["b"].item() == 0.0 and out["__metadata__"].item() == 2.0


def test_same_tensor_object_is_stored_once_and_views_separately(tmp_path):
    base = kiln.arange(6.0)
    obj = {"x": base, "again": base, "view": base[2:4]}
    p = tmp_path / "s.kt"
    kiln.save(obj, p)
    header = json.loads(p.read_bytes()[8:][: struct.unpack("<Q", p.read_bytes()[:8])[0]])
    assert {k for k in header if k != "__metadata__"} == {"x", "view"}
    out = kiln.load(p)
    assert out["x"] is out["again"]
    out["view"][0] = 100.0  # views come back as independent tensors
    assert out["x"][2].item() == 2.0


def test_requires_grad_is_kept_and_tensors_are_writable_copies(tmp_path):
    w = kiln.ones(3, requires_grad=True)
    p = tmp_path / "g.kt"
    kiln.save({"w": w, "c": kiln.zeros(2)}, p)
    out = kiln.load(p)
    assert out["w"].requires_grad and not out["c"].requires_grad
    assert out["w"].grad_fn is None
    out["c"][0] = 5.0
    assert out["c"][0].item() == 5.0
    assert kiln.load(p)["c"][0].item() == 0.0


def test_int_keys_round_trip_as_an_optimizer_state_dict_needs(tmp_path):
    state = {
        "state": {0: {"step": kiln.tensor(3.0), "exp_avg": kiln.ones(2)}, 1: {"step": kiln.tensor(3.0)}},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}],
        "names": {"0": "a string key that looks like an int"},
    }
    p = tmp_path / "opt.kt"
    kiln.save(state, p)
    out = kiln.load(p)
    assert list(out["state"]) == [0, 1] and list(out["names"]) == ["0"]
    assert out["state"][0]["exp_avg"].tolist() == [1.0, 1.0]
    assert out["param_groups"] == [{"lr": 0.1, "params": [0, 1]}]


def test_unsupported_objects_raise_before_touching_the_file(tmp_path):
    # format="safetensors" refuses what safetensors can't hold; the default writes torch's format instead
    # (tested in test_serialization_pickle.py)
    p = tmp_path / "u.kt"
    p.write_bytes(b"old")
    with pytest.raises(TypeError, match="can't serialize an object of type object"):
        kiln.save({"a": kiln.ones(1), "b": object()}, p, format="safetensors")
    with pytest.raises(TypeError, match="dict keys must be str or int"):
        kiln.save({(1, 2): kiln.ones(1)}, p, format="safetensors")
    with pytest.raises(TypeError, match="dict keys must be str or int"):
        kiln.save({True: kiln.ones(1)}, p, format="safetensors")
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(ValueError, match="cycle"):
        kiln.save(cyc, p, format="safetensors")
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["u.kt"]


def test_file_objects(tmp_path):
    buf = io.BytesIO()
    kiln.save({"a": kiln.arange(4)}, buf)
    buf.seek(0)
    out = kiln.load(buf)
    _assert_same(out["a"], kiln.arange(4))
    with open(tmp_path / "f.kt", "wb") as fh:
        kiln.save(kiln.ones(2), fh)
    with open(tmp_path / "f.kt", "rb") as fh:
        _assert_same(kiln.load(fh), kiln.ones(2))
    kiln.save(kiln.ones(2), str(tmp_path / "g.kt"))  # str paths too
    _assert_same(kiln.load(str(tmp_path / "g.kt")), kiln.ones(2))


def test_weights_only_is_accepted(tmp_path):
    p = tmp_path / "w.kt"
    kiln.save(kiln.ones(1), p)
    _assert_same(kiln.load(p, weights_only=False), kiln.ones(1))
    with pytest.raises(TypeError, match="weights_only must be a bool"):
        kiln.load(p, weights_only="yes")


# ------------------------------------------------------------------------------------------ atomicity


def test_failed_write_leaves_no_temp_file_and_keeps_the_destination(tmp_path, monkeypatch):
    p = tmp_path / "model.kt"
    kiln.save({"a": kiln.ones(3)}, p)
    before = p.read_bytes()
    calls = []

    def failing_write(fh, header, order):
        fh.write(b"partial garbage")
        calls.append(1)
        raise OSError("disk full")

    monkeypatch.setattr(serialization, "_write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        kiln.save({"a": kiln.zeros(3)}, p)
    assert calls and p.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.kt"]
    with pytest.raises(OSError, match="disk full"):
        kiln.save({"a": kiln.zeros(3)}, tmp_path / "new.kt")
    assert os.listdir(tmp_path) == ["model.kt"]


def test_failed_rename_removes_the_temp_file(tmp_path, monkeypatch):
    p = tmp_path / "m.kt"

    def failing_replace(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(serialization.os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        kiln.save(kiln.ones(2), p)
    assert os.listdir(tmp_path) == []


def test_save_writes_through_a_temp_file_and_replaces(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.path.basename(src), dst))
        real_replace(src, dst)

    monkeypatch.setattr(serialization.os, "replace", spy)
    p = tmp_path / "m.kt"
    kiln.save(kiln.ones(2), p)
    ((d, name, dst),) = seen
    real = os.path.realpath(tmp_path)  # the temp file sits next to the real file (tmp_path may be a link)
    assert d == real and dst == os.path.join(real, "m.kt")
    assert name.startswith(f".m.kt.{os.getpid()}.") and name.endswith(".tmp")  # the writer's PID marks it
    assert os.listdir(tmp_path) == ["m.kt"]


# ------------------------------------------------------------------------------------------ corrupted files

F32_4 = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"", "truncated"),
        (b"\x10\x00\x00", "truncated"),
        (struct.pack("<Q", 64) + b"{}", "truncated"),
        (struct.pack("<Q", 10**12), "larger than"),
        (struct.pack("<Q", 8) + b"not json", "not valid UTF-8 JSON"),
        (struct.pack("<Q", 8) + b"[1,2,3] ", "not a JSON object"),
        (_raw_file(F32_4, b"\0" * 4), "truncated"),
        (_raw_file(F32_4, b"\0" * 12), "trailing bytes"),
        (_raw_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 9]}}, b"\0" * 9), "need 8"),
        (_raw_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16), "gap"),
        (_raw_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [4, 0]}}, b"\0" * 8), "invalid data_offsets"),
        (_raw_file({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8), "invalid shape"),
        (_raw_file({"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8), "unsupported dtype"),
        (_raw_file({"x": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "exactly the keys"),
        (
            _raw_file(
                {
                    "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                },
                b"\0" * 12,
            ),
            "overlap",
        ),
        (_raw_file(F32_4, b"\0" * 8, metadata={"a": 1}), "__metadata__ must map strings"),
        (_raw_file(F32_4, b"\0" * 8, metadata={"kiln.structure": "{"}), "not valid JSON"),
        (
            _raw_file(F32_4, b"\0" * 8, metadata={"kiln.structure": '{"version": 1, "root": {"tensor": "y"}}'}),
            "missing",
        ),
        (_raw_file(F32_4, b"\0" * 8, metadata={"kiln.structure": '{"version": 1, "root": {"eval": "1"}}'}), "bad kiln"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_corrupted_files_raise_clear_errors(tmp_path, blob, match):
    p = tmp_path / "bad.kt"
    p.write_bytes(blob)
    with pytest.raises(ValueError, match=match):
        kiln.load(p)


def test_truncation_anywhere_is_detected(tmp_path):
    p = tmp_path / "t.kt"
    kiln.save({"a": kiln.arange(10.0), "b": {"c": kiln.ones(3, dtype=kiln.int16)}}, p)
    blob = p.read_bytes()
    for cut in range(0, len(blob), 7):
        p.write_bytes(blob[:cut])
        with pytest.raises(ValueError, match=r"truncated|invalid"):
            kiln.load(p)


def test_unknown_structure_version_is_refused(tmp_path):
    p = tmp_path / "v.kt"
    p.write_bytes(_raw_file(F32_4, b"\0" * 8, metadata={"kiln.structure": '{"version": 99, "root": {"none": null}}'}))
    with pytest.raises(ValueError, match="format version 99"):
        kiln.load(p)


def test_unpadded_header_without_structure_loads_as_a_dict(tmp_path):
    p = tmp_path / "plain.st"
    data = struct.pack("<2f", 1.5, -2.0) + bytes([1, 0, 2])
    entries = {
        "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [8, 11]},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    }
    p.write_bytes(_raw_file(entries, data, pad=False))
    out = kiln.load(p)
    assert list(out) == ["a", "b"]  # file order
    assert out["a"].tolist() == [1.5, -2.0] and out["b"].tolist() == [True, False, True]


def test_a_valid_file_starting_like_a_pickle_still_loads(tmp_path):
    # header length 0x280: the file starts 80 02, like a protocol-2 pickle (the legacy torch.save format)
    base = len(_raw_file(F32_4, b"", metadata={"pad": ""}, pad=False)) - 8
    blob = _raw_file(F32_4, struct.pack("<2f", 1, 2), metadata={"pad": "x" * (0x280 - base)}, pad=False)
    assert blob[:2] == b"\x80\x02"
    p = tmp_path / "p.st"
    p.write_bytes(blob)
    assert kiln.load(p)["x"].tolist() == [1.0, 2.0]


def test_file_objects_from_their_position_and_streams_that_cannot_seek(tmp_path):
    buf = io.BytesIO(b"prefix")
    buf.seek(0, io.SEEK_END)
    kiln.save({"a": kiln.arange(5)}, buf)
    buf.seek(len(b"prefix"))
    assert kiln.load(buf)["a"].tolist() == list(range(5))
    assert buf.tell() == len(buf.getvalue())  # read to the end, as before

    class Pipe(io.RawIOBase):  # no seek, no tell, no size: read as a stream
        def __init__(self, blob):
            self._b = io.BytesIO(blob)

        def readable(self):
            return True

        def readinto(self, b):
            return self._b.readinto(memoryview(b)[:3])  # short reads too

    blob = buf.getvalue()[len(b"prefix") :]
    assert kiln.load(io.BufferedReader(Pipe(blob), buffer_size=4))["a"].tolist() == list(range(5))
    with pytest.raises(ValueError, match="truncated"):
        kiln.load(io.BufferedReader(Pipe(blob[:-1])))


# ------------------------------------------------------------------------------------------ map_location


def test_map_location_forms(tmp_path):
    p = tmp_path / "m.kt"
    kiln.save({"a": kiln.ones(2), "b": [kiln.zeros(1)]}, p)
    for loc in (None, "cpu", kiln.device("cpu"), {"cuda:0": "cpu"}):
        out = kiln.load(p, map_location=loc)
        assert out["a"].device == kiln.device("cpu") and out["b"][0].device == kiln.device("cpu")
    seen = []

    def fn(t, location):
        seen.append(location)
        return t * 2 if len(seen) == 1 else None

    out = kiln.load(p, map_location=fn)
    assert seen == ["cpu", "cpu"]
    assert out["a"].tolist() == [2.0, 2.0] and out["b"][0].tolist() == [0.0]
    with pytest.raises(TypeError, match="map_location"):
        kiln.load(p, map_location=3)
    with pytest.raises(TypeError, match="must return a Tensor or None"):
        kiln.load(p, map_location=lambda t, loc: "cpu")


def test_map_location_dict_remaps_a_saved_device(tmp_path):
    # a file saved from cuda:0 (structure written by hand): the dict sends it to the CPU
    p = tmp_path / "cuda.kt"
    structure = {"version": 1, "root": {"dict": [["w", {"tensor": "x", "device": "cuda:0"}]]}}
    p.write_bytes(_raw_file(F32_4, struct.pack("<2f", 1, 2), metadata={"kiln.structure": json.dumps(structure)}))
    out = kiln.load(p, map_location={"cuda:0": "cpu"})
    assert out["w"].device == kiln.device("cpu") and out["w"].tolist() == [1.0, 2.0]
    seen = []
    kiln.load(p, map_location=lambda t, loc: seen.append(loc) or t)
    assert seen == ["cuda:0"]
    out = kiln.load(p, map_location="cpu")
    assert out["w"].device == kiln.device("cpu")


# ------------------------------------------------------------------------------------------ safetensors interop


@needs_safetensors
def test_safetensors_file_loads_in_kiln(tmp_path):
    torch.manual_seed(0)
    sd = {
        "f32": torch.randn(3, 4),
        "f64": torch.randn(5, dtype=torch.float64),
        "f16": torch.randn(2, 3).half(),
        "bf16": torch.randn(4, 2).bfloat16(),
        "i64": torch.randint(-(2**40), 2**40, (6,)),
        "i32": torch.randint(-1000, 1000, (2, 2), dtype=torch.int32),
        "i16": torch.randint(-1000, 1000, (3,), dtype=torch.int16),
        "i8": torch.randint(-128, 127, (7,), dtype=torch.int8),
        "u8": torch.randint(0, 255, (1, 5), dtype=torch.uint8),
        "bool": torch.rand(4) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 2),
    }
    p = tmp_path / "torch.safetensors"
    st_torch.save_file(sd, str(p), metadata={"format": "pt"})
    out = kiln.load(p)
    assert set(out) == set(sd)
    for k, t in sd.items():
        got = _torch(out[k])
        assert got.dtype == t.dtype and got.shape == t.shape, k
        assert torch.equal(got, t), k


@needs_safetensors
def test_kiln_file_loads_in_safetensors(tmp_path):
    sd = {f"layer.{i}.{k}": _sample(kd, (2, 3)) for i, (kd, _) in enumerate(DTYPES) for k in ("w",)}
    sd["nc"] = kiln.arange(12.0).reshape(3, 4).t()  # non-contiguous
    sd["narrow"] = kiln.arange(20, dtype=kiln.int16).reshape(4, 5)[1:3, ::2]
    sd["scalar"] = kiln.tensor(7, dtype=kiln.int64)
    sd["empty"] = kiln.ones(2, 0)
    p = tmp_path / "kiln.safetensors"
    kiln.save(sd, p)
    got = st_torch.load_file(str(p))
    assert set(got) == set(sd)
    for k, t in sd.items():
        exp = _torch(t)
        assert got[k].dtype == exp.dtype and got[k].shape == exp.shape, k
        assert torch.equal(got[k], exp), k
    # and safetensors' own deserializer accepts the bytes too
    assert set(st_torch.load(p.read_bytes())) == set(sd)


@needs_safetensors
def test_nested_kiln_file_is_readable_by_safetensors(tmp_path):
    p = tmp_path / "nested.safetensors"
    kiln.save({"model": {"w": kiln.ones(2)}, "opt": [kiln.zeros(3, dtype=kiln.bfloat16)]}, p)
    got = st_torch.load_file(str(p))
    assert set(got) == {"model.w", "opt.0"}
    assert got["opt.0"].dtype == torch.bfloat16 and torch.equal(got["model.w"], torch.ones(2))


def test_assert_close_helper_agrees(tmp_path):
    # the loaded values compare equal through the shared test utilities as well
    t = kiln.randn(4, 3)
    kiln.save(t, tmp_path / "r.kt")
    U.assert_close(kiln.load(tmp_path / "r.kt"), _torch(t))


# ------------------------------------------------------------------------------------------ property


def _leaves():
    from hypothesis import strategies as st

    tensors = st.builds(lambda kd, n: _sample(kd, (n,)), st.sampled_from([k for k, _ in DTYPES]), st.integers(0, 5))
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
    return tensors | scalars


def _same_structure(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, kiln.Tensor):
        _assert_same(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_structure(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_structure(x, y)
    else:
        assert a == b


def test_random_nested_objects_round_trip():
    from hypothesis import given
    from hypothesis import strategies as st

    objects = st.recursive(
        _leaves(),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.lists(inner, max_size=3).map(tuple)
            | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )

    @given(objects)
    def check(obj):
        buf = io.BytesIO()
        kiln.save(obj, buf)
        buf.seek(0)
        _same_structure(obj, kiln.load(buf))

    check()
