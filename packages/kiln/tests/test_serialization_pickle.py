"""kiln.save / kiln.load in PyTorch's torch.save format, against torch.save / torch.load (models, optimizers
and parameters of kiln-nn: packages/kiln-nn/tests/test_torch_checkpoints.py).

Files written by torch (zip archive and legacy format) load in kiln with every dtype, stride, offset and
shared storage; files kiln writes with format="torch" (or for objects safetensors can't hold) load in
torch with torch.load's default weights_only=True; weights_only follows PyTorch's allow-list model."""

from __future__ import annotations

import collections
import datetime
import io
import os
import pickle
import zipfile

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln
from kiln import _pickle_load, serialization

LEGACY = [False, True]
LEGACY_IDS = ["zip", "legacy"]


def _torch_bytes(obj, legacy: bool = False, **kw) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy, **kw)
    return b.getvalue()


def _kiln_bytes(obj, **kw) -> bytes:
    b = io.BytesIO()
    kiln.save(obj, b, **kw)
    return b.getvalue()


def _kload(blob: bytes, **kw):
    return kiln.load(io.BytesIO(blob), **kw)


def _tload(blob: bytes, **kw):
    return torch.load(io.BytesIO(blob), **kw)


def _same(k: kiln.Tensor, t: torch.Tensor) -> None:
    assert isinstance(k, kiln.Tensor)
    assert k.dtype is U.T2K[t.dtype]
    assert tuple(k.shape) == tuple(t.shape)
    assert k.stride() == t.stride() and k.storage_offset() == t.storage_offset()
    assert k.requires_grad == t.requires_grad
    np.testing.assert_array_equal(U.kiln_to_np(k), U.torch_to_np(t))


def _sample_torch(td: torch.dtype, shape=(3, 4)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if td == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if td.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(td)
    info = torch.iinfo(td)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=td)


# ------------------------------------------------------------------------------ torch -> kiln


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
@pytest.mark.parametrize("td", list(U.T2K), ids=str)
def test_every_dtype_written_by_torch_loads(td, legacy):
    t = _sample_torch(td)
    out = _kload(_torch_bytes({"t": t, "scalar": t[1, 2], "empty": t[:0]}, legacy))
    _same(out["t"], t)
    _same(out["scalar"], t[1, 2])
    _same(out["empty"], t[:0])


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_views_strides_offsets_and_shared_storages_survive(legacy):
    base = torch.arange(60, dtype=torch.float32).reshape(5, 12)
    views = {
        "base": base,
        "t": base.t(),
        "slice": base[1:, 2::3],
        "col": base[:, 7],
        "expand": base[2, :1].expand(4, 6),
        "strided": base.as_strided((3, 3), (13, 2), 5),
        "row": base[4],
    }
    other = torch.ones(3)
    out = _kload(_torch_bytes({**views, "other": other}, legacy))
    for k, v in views.items():
        _same(out[k], v)
    storage = out["base"].untyped_storage()
    assert all(out[k].untyped_storage() is storage for k in views)
    assert out["other"].untyped_storage() is not storage
    out["base"][4, 0] = -1.0  # one storage: a write through one view shows in the others
    assert out["row"][0].item() == -1.0 and out["t"][0, 4].item() == -1.0


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_python_values_and_torch_objects_map_to_kiln(legacy):
    sd = collections.OrderedDict(w=torch.ones(2))
    sd._metadata = collections.OrderedDict({"": {"version": 1}})
    obj = {
        "none": None,
        "flags": [True, False],
        "ints": (0, -1, 2**70),
        "float": 1.5,
        "complex": 1 + 2j,
        "str": "ü",
        "bytes": b"\x00\xff",
        "bytearray": bytearray(b"ab"),
        "set": {1, 2},
        "counter": collections.Counter("aab"),
        "size": torch.Size([2, 3]),
        "device": torch.device("cpu"),
        "dtypes": [torch.float32, torch.bfloat16, torch.bool, torch.int64],
        "sd": sd,
        7: "int key",
        (1, 2): "tuple key",
    }
    out = _kload(_torch_bytes(obj, legacy))
    for k in ("none", "flags", "ints", "float", "complex", "str", "bytes", "bytearray", "set", "counter", 7, (1, 2)):
        assert out[k] == obj[k] and type(out[k]) is type(obj[k]), k
    assert type(out["size"]) is kiln.Size and out["size"] == (2, 3)
    assert out["device"] is kiln.device("cpu")
    assert out["dtypes"] == [kiln.float32, kiln.bfloat16, kiln.bool, kiln.int64]
    assert type(out["sd"]) is collections.OrderedDict and out["sd"]._metadata == sd._metadata


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_parameters_and_requires_grad(legacy, monkeypatch):
    # without kiln-nn a parameter loads as a tensor with its requires_grad (kiln-nn's tests check
    # that it loads as kiln.nn.Parameter when kiln-nn is installed)
    monkeypatch.setattr(_pickle_load, "_parameter_class", lambda: None)
    p = torch.nn.Parameter(torch.randn(2, 3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    g = torch.randn(3, requires_grad=True)
    out = _kload(_torch_bytes({"p": p, "frozen": frozen, "g": g, "nonleaf": g * 2}, legacy))
    assert type(out["p"]) is kiln.Tensor and out["p"].requires_grad and out["p"].is_leaf
    assert type(out["frozen"]) is kiln.Tensor and not out["frozen"].requires_grad
    _same(out["p"].detach(), p.detach())
    assert out["g"].requires_grad and out["g"].is_leaf
    assert out["nonleaf"].requires_grad and out["nonleaf"].is_leaf  # as torch.load gives it


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_every_pickle_protocol_loads(protocol, legacy):
    t = torch.arange(6.0)
    out = _kload(_torch_bytes({"w": t, "v": t[1::2], "n": [1, "a", b"b"]}, legacy, pickle_protocol=protocol))
    _same(out["v"], t[1::2])
    assert out["w"].untyped_storage() is out["v"].untyped_storage() and out["n"] == [1, "a", b"b"]


def test_tensor_attributes_and_subclass_state_load():
    t = torch.arange(3.0)
    t.note = "hello"
    out = _kload(_torch_bytes({"t": t}), weights_only=True)
    assert out["t"].note == "hello" and out["t"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
@pytest.mark.parametrize("td", [torch.complex64, torch.uint16, torch.float8_e4m3fn, torch.uint32])
def test_dtypes_kiln_lacks_raise_clearly(td, legacy):
    if legacy and td == torch.float8_e4m3fn:
        pytest.skip("torch's legacy writer has no float8 storage")
    blob = _torch_bytes({"t": torch.zeros(2, dtype=td)}, legacy)
    name = str(td).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"torch\.{name}.*kiln has no dtype"):
        _kload(blob)


def _swap_archive(blob: bytes, edit) -> bytes:
    """A copy of a zip archive with ``edit(rel_name, data) -> data`` applied to every record."""
    src = zipfile.ZipFile(io.BytesIO(blob))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            rel = info.filename.split("/", 1)[1]
            dst.writestr(info.filename, edit(rel, src.read(info)))
    return out.getvalue()


def test_big_endian_archives_are_byteswapped():
    obj = {
        "f": torch.randn(5, dtype=torch.float64),
        "h": torch.randn(4).half(),
        "i": torch.arange(3, dtype=torch.int32),
    }
    obj["b"] = torch.randn(3).bfloat16()
    blob = _torch_bytes(obj)
    # storages are keyed in the order the pickle meets them: the dict's order
    itemsizes = {f"data/{key}": t.element_size() for key, t in enumerate(obj.values())}

    def to_big(rel, data):
        if rel == "byteorder":
            return b"big"
        if rel in itemsizes:
            return np.frombuffer(data, f"<u{itemsizes[rel]}").astype(f">u{itemsizes[rel]}").tobytes()
        return data

    big = _swap_archive(blob, to_big)
    out, ref = _kload(big), _tload(big)
    for k, v in obj.items():
        _same(out[k], v)
        assert torch.equal(ref[k], v)  # torch reads the edited file the same way


def test_big_endian_legacy_files_are_byteswapped():
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    blob = _torch_bytes(t, legacy=True)
    assert blob.count(b"little_endianq\x02\x88") == 1  # the sys_info pickle: little_endian=True
    head = blob.replace(b"little_endianq\x02\x88", b"little_endianq\x02\x89")
    count_at = len(head) - 6 * 8 - 8  # one storage: its 8-byte count, then 6 int64s
    body = head[count_at:]
    swapped = np.frombuffer(body, "<i8").astype(">i8").tobytes()
    out = _kload(head[:count_at] + swapped)
    _same(out, t)


def _located(blob: bytes, where: str) -> bytes:
    """A torch archive whose storages say they were saved from device ``where``."""
    old = b"X\x03\x00\x00\x00cpu"
    new = b"X" + len(where).to_bytes(4, "little") + where.encode()
    return _swap_archive(blob, lambda rel, d: d.replace(old, new) if rel == "data.pkl" else d)


def test_map_location_forms():
    t = torch.arange(4.0)
    blob = _located(_torch_bytes({"a": t, "b": t[1:]}), "cuda:1")
    ref = _tload(blob, map_location="cpu")
    for ml in ("cpu", kiln.device("cpu"), {"cuda:1": "cpu"}, lambda s, loc: s):
        out = _kload(blob, map_location=ml)
        _same(out["b"], ref["b"])
        assert out["a"].untyped_storage() is out["b"].untyped_storage()
    seen = []

    def spy(storage, location):
        seen.append((tuple(storage.shape), storage.dtype, location))
        return storage.clone()

    out = _kload(blob, map_location=spy)
    assert seen == [((4,), kiln.float32, "cuda:1")]  # once per storage, as torch calls it
    assert out["a"].untyped_storage() is out["b"].untyped_storage()
    if not kiln.cuda.is_available():  # the saved device is not installed: as in torch, an error
        with pytest.raises(RuntimeError, match="cuda"):
            _kload(blob)
    with pytest.raises(TypeError, match="map_location must give each storage back"):
        _kload(blob, map_location=lambda s, loc: s[:2])


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_map_location_callable_sees_cpu_storages(legacy):
    t = torch.arange(6, dtype=torch.int16)
    seen = []
    out = _kload(_torch_bytes([t, t[2:]], legacy), map_location=lambda s, loc: seen.append(loc))
    assert seen == ["cpu"]
    _same(out[1], t[2:])


def test_mmap_maps_privately(tmp_path):
    t = torch.arange(1000, dtype=torch.float32)
    p = tmp_path / "m.pt"
    torch.save({"t": t, "v": t[10:20]}, p)
    before = p.read_bytes()
    out = kiln.load(p, mmap=True)
    _same(out["v"], t[10:20])
    out["t"][0] = 42.0
    assert out["v"][0].item() == 10.0 and p.read_bytes() == before  # writes never reach the file
    with pytest.raises(ValueError, match="f must be a file path in order to use the mmap argument"):
        kiln.load(io.BytesIO(before), mmap=True)
    legacy = tmp_path / "l.pt"
    torch.save(t, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(RuntimeError, match="mmap can only be used with files saved with"):
        kiln.load(legacy, mmap=True)
    st = tmp_path / "s.safetensors"
    kiln.save({"w": kiln.arange(5.0)}, st)
    assert kiln.load(st, mmap=True)["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_file_objects_from_their_position_and_unseekable_streams():
    blob = _torch_bytes({"w": torch.arange(3.0)})
    f = io.BytesIO(b"junk" + blob)
    f.seek(4)
    assert kiln.load(f)["w"].tolist() == [0.0, 1.0, 2.0]

    class Pipe(io.RawIOBase):
        def __init__(self, data):
            self._b = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            return self._b.readinto(b)

    for data in (blob, _torch_bytes({"w": torch.arange(3.0)}, legacy=True)):
        assert kiln.load(io.BufferedReader(Pipe(data)))["w"].tolist() == [0.0, 1.0, 2.0]


# ------------------------------------------------------------------------------ kiln -> torch


@pytest.mark.parametrize("kd", list(U.K2T), ids=str)
def test_every_dtype_written_by_kiln_loads_in_torch(kd):
    t = U.to_kiln(_sample_torch(U.K2T[kd]))
    blob = _kiln_bytes({"t": t, "scalar": t[1, 2], "empty": t[:0]}, format="torch")
    ref = _tload(blob)  # torch.load's default: weights_only=True
    for k in ("t", "scalar", "empty"):
        _same(*(lambda kt: (kt, ref[k]))(_kload(blob)[k]))
    np.testing.assert_array_equal(U.torch_to_np(ref["t"]), U.kiln_to_np(t))


def test_views_written_by_kiln_stay_views_in_torch():
    base = kiln.arange(60.0).reshape(5, 12)
    views = {"base": base, "t": base.t(), "slice": base[1:, 2::3], "expand": base[2, :1].expand(4, 6)}
    ref = _tload(_kiln_bytes(views, format="torch"))
    for k, v in views.items():
        _same(v, ref[k])
        assert ref[k].untyped_storage().data_ptr() == ref["base"].untyped_storage().data_ptr()


def test_kiln_objects_map_to_torch_objects():
    obj = {
        "size": kiln.Size([2, 3]),
        "device": kiln.device("cpu"),
        "dtype": kiln.bfloat16,
        "grad": kiln.ones(2, requires_grad=True),
        "misc": [None, 1, 2.5, "s", (1, 2), {"k": b"bytes"}],
    }
    ref = _tload(_kiln_bytes(obj, format="torch"))
    assert type(ref["size"]) is torch.Size and ref["size"] == (2, 3)
    assert ref["device"] == torch.device("cpu") and ref["dtype"] is torch.bfloat16
    assert ref["grad"].requires_grad and ref["grad"].is_leaf
    assert ref["misc"] == obj["misc"]
    back = _kload(_kiln_bytes(obj, format="torch"))
    assert back["grad"].requires_grad and back["dtype"] is kiln.bfloat16 and back["size"] == (2, 3)


def test_tensor_attributes_written_by_kiln_reach_torch():
    t = kiln.arange(3.0)
    t.note = "hello"
    ref = _tload(_kiln_bytes({"t": t}, format="torch"))
    assert ref["t"].note == "hello" and type(ref["t"]) is torch.Tensor
    back = _kload(_kiln_bytes({"t": t}, format="torch"))
    assert back["t"].note == "hello" and type(back["t"]) is kiln.Tensor


def test_the_archive_has_torchs_layout(tmp_path):
    p = tmp_path / "ckpt.pt"
    kiln.save({"a": kiln.ones(3), "b": kiln.zeros(2, dtype=kiln.int64)}, p, format="torch")
    ref = tmp_path / "ref.pt"
    torch.save({"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.int64)}, ref)
    z, zr = zipfile.ZipFile(p), zipfile.ZipFile(ref)
    names = [i.filename for i in z.infolist()]
    assert names == [n.replace("ref/", "ckpt/") for n in (i.filename for i in zr.infolist()) if ".data/" not in n]
    for rel in ("version", "byteorder", ".format_version", ".storage_alignment", "data/0", "data/1"):
        assert z.read(f"ckpt/{rel}") == zr.read(f"ref/{rel}"), rel
    assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    raw = p.read_bytes()
    for info in z.infolist():  # every record's bytes start on a 64-byte boundary, as torch's do
        n, e = (
            int.from_bytes(raw[info.header_offset + 26 : info.header_offset + 28], "little"),
            int.from_bytes(raw[info.header_offset + 28 : info.header_offset + 30], "little"),
        )
        assert (info.header_offset + 30 + n + e) % 64 == 0
    assert torch.equal(torch.load(p, mmap=True)["a"], torch.ones(3))
    assert kiln.load(p)["b"].dtype is kiln.int64


def test_default_format_keeps_safetensors_for_tensors_and_uses_torch_for_the_rest():
    assert _kiln_bytes({"w": kiln.ones(2), "meta": {"epoch": 3, "lr": [0.1]}})[8:9] == b"{"
    for obj in ({"arr": np.arange(3)}, {(1, 2): "x", "s": {1, 2}}, datetime.date(2024, 1, 2)):
        blob = _kiln_bytes(obj)
        assert blob[:4] == b"PK\x03\x04"
        back, ref = _kload(blob, weights_only=False), _tload(blob, weights_only=False)
        if isinstance(obj, dict) and "arr" in obj:
            np.testing.assert_array_equal(back["arr"], ref["arr"])
        else:
            assert back == ref == obj
    cyclic: list = [kiln.ones(1)]
    cyclic.append(cyclic)
    back = _kload(_kiln_bytes(cyclic), weights_only=False)
    assert back[1] is back
    with pytest.raises(TypeError, match="can't serialize an object of type set"):
        kiln.save({"s": {1}}, io.BytesIO(), format="safetensors")
    with pytest.raises(ValueError, match="format must be None, 'safetensors' or 'torch'"):
        kiln.save({}, io.BytesIO(), format="pt")


def test_unpicklable_objects_fail_before_the_file_is_touched(tmp_path):
    p = tmp_path / "x.pt"
    p.write_bytes(b"old")
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        kiln.save({"f": lambda: 1}, p)
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["x.pt"]


def test_a_failed_torch_format_write_leaves_the_old_file(tmp_path, monkeypatch):
    from kiln import _pickle_save

    p = tmp_path / "ckpt.pt"
    kiln.save({"w": kiln.ones(2)}, p, format="torch")
    before = p.read_bytes()

    def failing(fh, name, pkl, storages):
        fh.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(_pickle_save, "write_archive", failing)
    with pytest.raises(OSError, match="disk full"):
        kiln.save({"w": kiln.zeros(3)}, p, format="torch")
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]


# ------------------------------------------------------------------------------ weights_only


class Point:  # a user class, allowed only through add_safe_globals
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Point and other.x == self.x


def _unsafe_text(msg: str) -> str:
    """The part of a weights-only error that names the global and how to allow it."""
    return msg.split("WeightsUnpickler error: ")[1].split("\n\nCheck the documentation")[0]


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_a_disallowed_global_is_refused_with_torchs_explanation(legacy):
    blob = _torch_bytes({"p": Point(1), "t": torch.ones(1)}, legacy)
    with pytest.raises(pickle.UnpicklingError) as te:
        _tload(blob)
    with pytest.raises(pickle.UnpicklingError) as ke:
        _kload(blob)
    assert _unsafe_text(str(ke.value)) == _unsafe_text(str(te.value)).replace(
        "torch.serialization", "kiln.serialization"
    )
    assert str(ke.value).startswith("Weights only load failed. This file can still be loaded")
    assert "Re-running `kiln.load` with `weights_only` set to `False` will likely succeed" in str(ke.value)
    assert _kload(blob, weights_only=False)["p"] == Point(1)
    with serialization.safe_globals([Point]):
        assert _kload(blob)["p"] == Point(1)
        assert Point in serialization.get_safe_globals()
    assert Point not in serialization.get_safe_globals()
    name = f"{Point.__module__}.{Point.__qualname__}"
    serialization.add_safe_globals([(Point, name)])
    try:
        assert _kload(blob)["p"] == Point(1)
    finally:
        serialization.clear_safe_globals()
    assert serialization.get_safe_globals() == []
    with pytest.raises(ValueError, match="Expected tuple of length 2"):
        serialization.add_safe_globals([(Point,)])
    with pytest.raises(TypeError, match="Expected second item in tuple to be str"):
        serialization.add_safe_globals([(Point, 1)])


def test_numpy_arrays_need_the_globals_torch_needs():
    arr = np.arange(6.0).reshape(2, 3)
    blob = _torch_bytes({"a": arr})
    with pytest.raises(pickle.UnpicklingError) as te:
        _tload(blob)
    with pytest.raises(pickle.UnpicklingError) as ke:
        _kload(blob)
    assert _unsafe_text(str(ke.value)) == _unsafe_text(str(te.value)).replace(
        "torch.serialization", "kiln.serialization"
    )
    allow = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.float64))]
    with torch.serialization.safe_globals(allow), serialization.safe_globals(allow):
        np.testing.assert_array_equal(_tload(blob)["a"], arr)
        np.testing.assert_array_equal(_kload(blob)["a"], arr)


def test_pickle_module_and_load_arguments_follow_torch():
    blob = _torch_bytes({"w": torch.ones(1)})
    with pytest.raises(RuntimeError, match="Can not safely load weights when explicit pickle_module is specified"):
        _kload(blob, pickle_module=pickle, weights_only=True)
    assert _kload(blob, pickle_module=pickle)["w"].tolist() == [1.0]  # weights_only then defaults to False
    assert _kload(blob, weights_only=False, encoding="latin1")["w"].tolist() == [1.0]
    with pytest.raises(TypeError, match="errors only works with weights_only=False"):
        _kload(blob, errors="strict")
    with pytest.raises(TypeError, match="weights_only must be a bool"):
        _kload(blob, weights_only="yes")
    with pytest.raises(TypeError, match="mmap must be a bool"):
        _kload(blob, mmap=1)


# ------------------------------------------------------------------------------ other devices


class _ToyStorage:
    """Device memory of an in-process device whose storage is not a NumPy array."""

    def __init__(self, data: bytes, np_dtype):
        self.buf, self.np_dtype = bytearray(data), np.dtype(np_dtype)

    def __len__(self):
        return len(self.buf) // self.np_dtype.itemsize


class _ToyPlugin:
    def kiln_register_devices(self, register):
        def write(storage, start, array):
            data = np.ascontiguousarray(array, dtype=storage.np_dtype).tobytes()
            storage.buf[start * storage.np_dtype.itemsize : start * storage.np_dtype.itemsize + len(data)] = data

        register(
            "toydev",
            empty=lambda numel, dtype, index=None: _ToyStorage(bytes(numel * dtype.itemsize), dtype.numpy),
            to_host=lambda s: np.frombuffer(bytes(s.buf), dtype=s.np_dtype).copy(),
            from_host=lambda a, index=None: _ToyStorage(np.ascontiguousarray(a).tobytes(), a.dtype),
            write=write,
            device_count=lambda: 2,
        )


@pytest.fixture
def toydev():
    from kiln import _plugins

    _plugins.register_plugin(_ToyPlugin(), name="toy-serialization")
    yield kiln.device("toydev:1")
    _plugins.unregister_plugin("toy-serialization")


def test_tensors_on_other_devices_keep_their_device_and_views(toydev):
    base = kiln.arange(12.0).reshape(3, 4).to(toydev)
    blob = _kiln_bytes({"base": base, "t": base.t()}, format="torch")
    assert b"toydev:1" in zipfile.ZipFile(io.BytesIO(blob)).read("archive/data.pkl")
    back = _kload(blob)
    assert back["t"].device == toydev and back["t"].stride() == (1, 4)
    assert back["t"].untyped_storage() is back["base"].untyped_storage()
    assert back["t"].cpu().tolist() == base.cpu().t().tolist()
    assert _kload(blob, map_location="cpu")["t"].device.type == "cpu"


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_torch_files_placed_on_another_device(toydev, legacy):
    t = torch.arange(10.0)
    blob = _torch_bytes({"a": t, "b": t[2:8:2]}, legacy)
    out = _kload(blob, map_location={"cpu": "toydev:1"})
    assert out["b"].device == toydev and out["b"].cpu().tolist() == [2.0, 4.0, 6.0]
    assert out["a"].untyped_storage() is out["b"].untyped_storage()
