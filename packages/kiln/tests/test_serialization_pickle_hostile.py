"""kiln.load of hostile and broken PyTorch files: nothing from the file runs unless weights_only=False, and
every broken file raises ValueError (kiln's type for malformed files; for PyTorch files also an
UnpicklingError) or, for what the allow-list refuses, pickle.UnpicklingError; nothing else escapes,
and no allocation is sized by the file's claims rather than its bytes."""

from __future__ import annotations

import io
import os
import pickle
import struct
import tracemalloc
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

import kiln
from kiln import _pickle_load

P = pickle  # opcodes


def _frag(v) -> bytes:
    """The opcodes that push ``v`` (a pickle without its PROTO and STOP)."""
    return pickle.dumps(v, 2)[2:-1]


def _g(module: str, name: str) -> bytes:
    return P.GLOBAL + f"{module}\n{name}\n".encode()


def _pid(key="0", numel=4, storage="FloatStorage", location="cpu") -> bytes:
    return P.MARK + _frag("storage") + _g("torch", storage) + _frag(key) + _frag(location) + _frag(numel) + P.TUPLE


def _v2(size, stride, offset=0, numel=4, rg=False, extra=b"") -> bytes:
    """A pickle of ``torch._utils._rebuild_tensor_v2`` over storage "0" with these (unchecked) arguments."""
    return (
        b"\x80\x02"
        + _g("torch._utils", "_rebuild_tensor_v2")
        + P.MARK
        + _pid(numel=numel)
        + P.BINPERSID
        + _frag(offset)
        + _frag(size)
        + _frag(stride)
        + _frag(rg)
        + _g("collections", "OrderedDict")
        + P.EMPTY_TUPLE
        + P.REDUCE
        + extra
        + P.TUPLE
        + P.REDUCE
        + P.STOP
    )


def _archive(pkl: bytes, records: dict[str, bytes] | None = None, *, version=b"3\n", order=b"little") -> bytes:
    """A torch.save-style zip around a hand-made data.pkl (records relative to the archive folder)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        if order is not None:
            z.writestr("archive/byteorder", order)
        for rel, data in (records if records is not None else {"data/0": bytes(16)}).items():
            z.writestr(f"archive/{rel}", data)
        if version is not None:
            z.writestr("archive/version", version)
    return out.getvalue()


def _load(blob: bytes, **kw):
    return kiln.load(io.BytesIO(blob), **kw)


def _outcome(blob: bytes) -> str:
    try:
        _load(blob)
    except ValueError:
        return "ValueError"
    except pickle.UnpicklingError:
        return "UnpicklingError"
    except BaseException as e:  # noqa: BLE001 - anything else is the bug being looked for
        return f"{type(e).__name__}: {str(e)[:200]}"
    return "loaded"


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ------------------------------------------------------------------------------ code execution refused


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_os_system_is_refused_with_no_side_effect(tmp_path, legacy):
    marker = tmp_path / "pwned"
    b = io.BytesIO()
    torch.save({"w": torch.ones(2), "x": _Evil(str(marker))}, b, _use_new_zipfile_serialization=not legacy)
    blob = b.getvalue()
    with pytest.raises(pickle.UnpicklingError) as ke:
        _load(blob)
    with pytest.raises(pickle.UnpicklingError) as te:
        torch.load(io.BytesIO(blob))
    assert not marker.exists()
    assert "Trying to load unsupported GLOBAL posix.system whose module posix is blocked." in str(ke.value)
    assert "Trying to load unsupported GLOBAL posix.system whose module posix is blocked." in str(te.value)
    kiln.serialization.add_safe_globals([os.system])  # a blocked module stays blocked even when allowed
    try:
        with pytest.raises(pickle.UnpicklingError, match="whose module posix is blocked"):
            _load(blob)
    finally:
        kiln.serialization.clear_safe_globals()
    assert not marker.exists()


def test_builtins_eval_is_refused_like_torch():
    pkl = b"\x80\x02" + _g("builtins", "eval") + _frag("__import__('os').getpid()") + P.TUPLE1 + P.REDUCE + P.STOP
    blob = _archive(pkl)
    with pytest.raises(pickle.UnpicklingError) as ke:
        _load(blob)
    with pytest.raises(pickle.UnpicklingError) as te:
        torch.load(io.BytesIO(blob))
    expected = (
        "Unsupported global: GLOBAL eval was not an allowed global by default. Please use "
        "`kiln.serialization.add_safe_globals([eval])` or the `kiln.serialization.safe_globals([eval])` "
        "context manager to allowlist this global if you trust this class/function."
    )
    assert expected in str(ke.value)
    assert expected.replace("kiln.", "torch.") in str(te.value)


def _refusals():
    """(label, data.pkl) pairs that the allow-list must refuse (pickle.UnpicklingError, not ValueError)."""
    v2 = _g("torch._utils", "_rebuild_tensor_v2")
    yield "GLOBAL subprocess.Popen", b"\x80\x02" + _g("subprocess", "Popen") + P.STOP
    yield "GLOBAL os.system", b"\x80\x02" + _g("os", "system") + P.STOP
    yield "GLOBAL sys.modules", b"\x80\x02" + _g("sys", "modules") + P.STOP
    yield "GLOBAL builtins.getattr", b"\x80\x02" + _g("builtins", "getattr") + P.STOP
    yield "GLOBAL builtins.__import__", b"\x80\x02" + _g("builtins", "__import__") + P.STOP
    yield "GLOBAL numpy.load", b"\x80\x02" + _g("numpy", "load") + P.STOP
    yield "GLOBAL torch.load", b"\x80\x02" + _g("torch", "load") + P.STOP
    yield "GLOBAL kiln.serialization.load", b"\x80\x02" + _g("kiln.serialization", "load") + P.STOP
    yield "GLOBAL copyreg._reconstructor", b"\x80\x02" + _g("copyreg", "_reconstructor") + P.STOP
    yield "STACK_GLOBAL os.system", b"\x80\x04" + _frag("os") + _frag("system") + P.STACK_GLOBAL + P.STOP
    yield "REDUCE on a dict", b"\x80\x02" + P.EMPTY_DICT + P.EMPTY_TUPLE + P.REDUCE + P.STOP
    yield "NEWOBJ on a function", b"\x80\x02" + v2 + P.EMPTY_TUPLE + P.NEWOBJ + P.STOP
    yield "BUILD on a function", b"\x80\x02" + v2 + _frag({"__defaults__": (1,)}) + P.BUILD + P.STOP
    yield (
        "BUILD slots on a function",
        b"\x80\x02" + v2 + P.NONE + _frag({"__defaults__": (1,)}) + P.TUPLE2 + P.BUILD + P.STOP,
    )
    yield "BUILD on a class", b"\x80\x02" + _g("torch", "Size") + _frag({"numel": 1}) + P.BUILD + P.STOP
    yield "BUILD on a list", b"\x80\x02" + P.EMPTY_LIST + _frag({"a": 1}) + P.BUILD + P.STOP
    yield "INST opcode", b"\x80\x02" + P.MARK + P.INST + b"os\nsystem\n" + P.STOP
    yield "OBJ opcode", b"\x80\x02" + P.MARK + _g("os", "system") + P.OBJ + P.STOP
    yield "EXT1 opcode", b"\x80\x02" + P.EXT1 + b"\x01" + P.STOP
    yield "NEXT_BUFFER opcode", b"\x80\x05" + P.NEXT_BUFFER + P.STOP
    yield "persistent id not a storage", b"\x80\x02" + _frag(("module", 1)) + P.BINPERSID + P.STOP
    yield "text persistent id", b"\x80\x02" + P.PERSID + b"0\n" + P.STOP
    yield "APPEND to a tuple", b"\x80\x02" + P.EMPTY_TUPLE + _frag(1) + P.APPEND + P.STOP
    yield "SETITEM on a list", b"\x80\x02" + P.EMPTY_LIST + _frag(1) + _frag(2) + P.SETITEM + P.STOP


def test_the_allow_list_refuses_and_leaves_kiln_unchanged():
    defaults = _pickle_load._rebuild_tensor_v2.__defaults__
    cases = list(_refusals())
    for label, pkl in cases:
        with pytest.raises(pickle.UnpicklingError) as e:
            _load(_archive(pkl))
        assert not isinstance(e.value, ValueError), (label, str(e.value))
        assert str(e.value).startswith("Weights only load failed."), label
    assert _pickle_load._rebuild_tensor_v2.__defaults__ == defaults
    assert kiln.Size([2]).numel() == 2
    assert len(cases) == 24


# ------------------------------------------------------------------------------ bad arguments


def _bad_calls():
    """(label, data.pkl) pairs whose allowed calls get arguments they must refuse as a malformed file."""

    def call(module, name, *args):
        return b"\x80\x02" + _g(module, name) + _frag(tuple(args)) + P.REDUCE + P.STOP

    yield "torch.Size(1)", call("torch", "Size", 1)
    yield "torch.device(junk)", call("torch", "device", "not a device!")
    yield "torch.device(int, int, int)", call("torch", "device", 1, 2, 3)
    yield "OrderedDict(5)", call("collections", "OrderedDict", 5)
    yield "bytearray(10**12)", call("builtins", "bytearray", 10**12)
    yield "bytearray(-1)", call("builtins", "bytearray", -1)
    yield "_codecs.encode(zlib)", call("_codecs", "encode", "x", "zlib_codec")
    yield "_codecs.encode(bytes)", call("_codecs", "encode", b"x", "latin1")
    yield "set(1)", call("builtins", "set", 1)
    yield "complex(junk)", call("builtins", "complex", "junk")
    yield "Counter(1.5)", call("collections", "Counter", 1.5)
    yield "dtype by name", call("kiln._dtype", "_dtype_by_name", "nope")
    yield "v2 wrong arity", call("torch._utils", "_rebuild_tensor_v2", 1)
    yield "v2 storage not a tensor", call("torch._utils", "_rebuild_tensor_v2", 1, 0, (1,), (1,), False, {})
    yield "parameter of a str", call("torch._utils", "_rebuild_parameter", "x", True, {})
    yield "torch.Tensor(10**12)", call("torch", "Tensor", 10**12)
    yield "torch.FloatTensor(10**6, 10**6)", call("torch", "FloatTensor", 10**6, 10**6)
    yield (
        "NEWOBJ torch.Tensor(10**12)",
        b"\x80\x02" + _g("torch", "Tensor") + _frag((10**12,)) + P.NEWOBJ + P.STOP,
    )
    yield (
        "from_type_v2 calling torch.Tensor",
        b"\x80\x02"
        + _g("torch._tensor", "_rebuild_from_type_v2")
        + P.MARK
        + _g("torch", "Tensor")
        + _g("torch", "Tensor")
        + _frag((10**12,))
        + _frag({})
        + P.TUPLE
        + P.REDUCE
        + P.STOP,
    )
    yield "from_type_v2 of a dict", call("torch._tensor", "_rebuild_from_type_v2", 1, OrderedDict, (), {})
    yield "sparse tensor", call("torch._utils", "_rebuild_sparse_tensor", 1, 2)
    yield "quantized tensor", call("torch._utils", "_rebuild_qtensor", 1, 2)
    yield "meta tensor", call("torch._utils", "_rebuild_meta_tensor_no_storage", 1, 2)
    yield "complex64 dtype", b"\x80\x02" + _g("torch", "complex64") + P.STOP
    yield "REDUCE of a dtype", b"\x80\x02" + _g("torch", "float32") + P.EMPTY_TUPLE + P.REDUCE + P.STOP
    yield "REDUCE with a list", b"\x80\x02" + _g("torch", "Size") + P.EMPTY_LIST + P.REDUCE + P.STOP
    yield (
        "BUILD a tensor's slots",
        _v2((4,), (1,))[:-3] + P.TUPLE + P.REDUCE + _frag({"_storage": 1}) + P.BUILD + P.STOP,
    )
    yield (
        "BUILD a tensor's class",
        _v2((4,), (1,))[:-3] + P.TUPLE + P.REDUCE + _frag({"__class__": 1}) + P.BUILD + P.STOP,
    )
    yield "OrderedDict state with int keys", call("collections", "OrderedDict")[:-1] + _frag({1: 2}) + P.BUILD + P.STOP
    yield "huge sizes", _v2((2**40, 2**40), (1, 1))
    yield "size past the storage", _v2((5,), (1,))
    yield "offset past the storage", _v2((2,), (1,), offset=3)
    yield "stride past the storage", _v2((2, 2), (3, 1))
    yield "negative stride", _v2((2,), (-1,), offset=1)
    yield "negative size", _v2((-2,), (1,))
    yield "negative offset", _v2((2,), (1,), offset=-1)
    yield "float size", _v2((2.0,), (1,))
    yield "bool size", _v2((True,), (1,))
    yield "sizes and strides of two lengths", _v2((2, 2), (1,))
    yield "65 dimensions", _v2((1,) * 65, (1,) * 65)
    yield "numel past int64", _v2((2**40, 2**40), (0, 0))
    yield "size a str", _v2("ab", (1, 1))
    yield "requires_grad a str", _v2((2,), (1,), rg="yes")
    yield "conjugate bit", _v2((2,), (1,), extra=_frag({"conj": True}))
    yield "hooks not a dict", _v2((2,), (1,))[:-6] + _frag(3) + P.TUPLE + P.REDUCE + P.STOP
    yield "storage numel negative", _v2((1,), (1,), numel=-4)
    yield "storage numel a str", _v2((1,), (1,), numel="4")
    yield "storage numel 2**40", _v2((1,), (1,), numel=2**40)
    yield "storage numel 2**62", _v2((1,), (1,), numel=2**62)
    yield "storage of complex", b"\x80\x02" + _pid(storage="ComplexFloatStorage") + P.BINPERSID + P.STOP
    yield "storage location junk", b"\x80\x02" + _pid(location="::") + P.BINPERSID + P.STOP
    yield "storage key an int", b"\x80\x02" + _pid(key=0) + P.BINPERSID + P.STOP
    yield "storage key missing", b"\x80\x02" + _pid(key="7") + P.BINPERSID + P.STOP
    yield "persistent id short", b"\x80\x02" + _frag(("storage", 1)) + P.BINPERSID + P.STOP
    yield "storage type not a storage", b"\x80\x02" + _frag(("storage", 1, "0", "cpu", 4)) + P.BINPERSID + P.STOP
    yield "empty stack STOP", b"\x80\x02" + P.STOP
    yield "two objects at STOP", b"\x80\x02" + P.NONE + P.NONE + P.STOP
    yield "unclosed MARK", b"\x80\x02" + P.MARK + P.NONE + P.STOP
    yield "TUPLE without MARK", b"\x80\x02" + P.NONE + P.TUPLE + P.STOP
    yield "memo miss", b"\x80\x02" + P.BINGET + b"\x07" + P.STOP
    yield "unhashable key", b"\x80\x02" + P.EMPTY_DICT + P.EMPTY_LIST + _frag(1) + P.SETITEM + P.STOP
    yield "no STOP", b"\x80\x02" + P.NONE
    yield "protocol 9", b"\x80\x09" + P.NONE + P.STOP
    yield "BINUNICODE longer than the file", b"\x80\x02" + P.BINUNICODE + struct.pack("<I", 2**31) + b"ab" + P.STOP
    yield "BINUNICODE8 of 2**60", b"\x80\x04" + P.BINUNICODE8 + struct.pack("<Q", 2**60) + P.STOP
    yield "LONG4 of 2**30", b"\x80\x02" + P.LONG4 + struct.pack("<i", 2**30) + P.STOP
    yield "LONG4 negative", b"\x80\x02" + P.LONG4 + struct.pack("<i", -5) + P.STOP
    yield "BINBYTES8 of 2**63", b"\x80\x04" + P.BINBYTES8 + struct.pack("<Q", 2**63) + P.STOP
    yield "text LONG of 10**5 digits", b"\x80\x02" + P.LONG + b"9" * 100_000 + b"L\n" + P.STOP
    yield "text FLOAT junk", b"\x80\x02" + P.FLOAT + b"one\n" + P.STOP
    yield "text line without end", b"\x80\x02" + P.INT + b"12"
    yield "STRING unquoted", b"\x80\x02" + P.STRING + b"abc\n" + P.STOP
    yield "invalid utf-8", b"\x80\x02" + P.BINUNICODE + struct.pack("<I", 2) + b"\xff\xfe" + P.STOP
    yield "GLOBAL name not utf-8", b"\x80\x02" + P.GLOBAL + b"\xff\n\xfe\n" + P.STOP
    yield "STACK_GLOBAL of ints", b"\x80\x04" + _frag(1) + _frag(2) + P.STACK_GLOBAL + P.STOP


def test_bad_arguments_to_allowed_calls_are_malformed_files():
    cases = list(_bad_calls())
    failures = []
    for label, pkl in cases:
        try:
            _load(_archive(pkl))
        except ValueError as e:
            assert str(e).startswith("kiln.load:"), (label, str(e))
            assert isinstance(e, pickle.UnpicklingError), label
            continue
        except BaseException as e:  # noqa: BLE001
            failures.append((label, f"{type(e).__name__}: {e}"))
            continue
        failures.append((label, "loaded"))
    assert failures == []
    assert len(cases) == 75


def test_the_allowed_forms_of_those_calls_load():
    # the same builders with good arguments load: the refusals above are about the arguments
    assert _load(_archive(_v2((2, 2), (2, 1)))).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert _load(_archive(_v2((4, 2**50), (1, 0)))).shape == (4, 2**50)  # a broadcast view: no memory
    data = np.arange(4, dtype="<f4").tobytes()
    t = _load(_archive(_v2((2,), (2,), offset=1), {"data/0": data}))
    assert t.tolist() == [1.0, 3.0] and t.stride() == (2,) and t.storage_offset() == 1


# ------------------------------------------------------------------------------ broken archives


def _torch_zip(obj=None) -> bytes:
    b = io.BytesIO()
    torch.save({"w": torch.arange(8.0), "v": torch.arange(3)} if obj is None else obj, b)
    return b.getvalue()


def _rezip(blob: bytes, edit, compression=zipfile.ZIP_STORED) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(blob))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as dst:
        for info in src.infolist():
            for name, data in edit(info.filename, src.read(info)):
                dst.writestr(name, data)
    return out.getvalue()


def _broken_archives():
    good = _torch_zip()

    def drop(rel):
        return _rezip(good, lambda n, d: [] if n == f"archive/{rel}" else [(n, d)])

    def replace(rel, data):
        return _rezip(good, lambda n, d: [(n, data if n == f"archive/{rel}" else d)])

    def add(name, data=b"x"):
        return _rezip(good, lambda n, d: [(n, d)] + ([(name, data)] if n == "archive/version" else []))

    yield "no data.pkl", drop("data.pkl")
    yield "no version", drop("version")
    yield "no storage record", drop("data/0")
    yield "version 99", replace("version", b"99\n")
    yield "version junk", replace("version", b"three")
    yield "version huge", replace("version", b"1" * 100_000)
    yield "byteorder middle", replace("byteorder", b"middle")
    yield "storage record short", replace("data/0", bytes(31))
    yield "storage record long", replace("data/0", bytes(33))
    yield "storage record empty", replace("data/0", b"")
    yield "data.pkl empty", replace("data.pkl", b"")
    yield "data.pkl garbage", replace("data.pkl", b"\xff" * 64)
    yield "TorchScript", add("archive/constants.pkl")
    yield "traversal ../", add("archive/../evil")
    yield "traversal leading ../", add("../evil")
    yield "absolute name", add("/etc/passwd")
    yield "backslash name", add("archive\\data.pkl")
    yield "drive name", add("C:/evil")
    yield "outside the folder", add("other/data.pkl")
    yield "no folder", add("toplevel")
    yield "duplicate name", add("archive/data.pkl", b"\x80\x02N.")
    yield "deflated records", _rezip(good, lambda n, d: [(n, d)], zipfile.ZIP_DEFLATED)
    yield "empty zip", _rezip(good, lambda n, d: [])
    yield "not a zip after the magic", b"PK\x03\x04" + bytes(range(200))
    yield "zip magic only", b"PK\x03\x04"
    corrupt = bytearray(good)
    data_at = good.index(np.arange(8.0, dtype="<f4").tobytes())
    corrupt[data_at + 5] ^= 0xFF
    yield "CRC mismatch", bytes(corrupt)
    renamed = bytearray(good)
    at = good.index(b"archive/data/0")  # the local header's name (the central directory's comes later)
    renamed[at + 13] = ord("9")
    yield "local header names another record", bytes(renamed)
    enc = bytearray(good)
    cd = good.rindex(b"PK\x01\x02archive/data/0"[:4], 0, good.rindex(b"archive/data/0"))
    enc[cd + 8] |= 1  # general purpose flag bit 0: encrypted
    yield "encrypted record", bytes(enc)
    for size in (2**40, 2**31, 2**32 - 1):  # the central directory claims a bigger storage record
        big = bytearray(good)
        big[cd + 20 : cd + 28] = struct.pack("<II", size & 0xFFFFFFFF, size & 0xFFFFFFFF)
        yield f"central size {size}", bytes(big)
    off = bytearray(good)
    off[cd + 42 : cd + 46] = struct.pack("<I", 2**31)
    yield "local header offset past the end", bytes(off)


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_broken_archives_raise_value_error():
    cases = list(_broken_archives())
    failures = [(label, got) for label, blob in cases if (got := _outcome(blob)) != "ValueError"]
    assert failures == []
    assert len(cases) == 32


def test_overlapping_records_cannot_multiply_memory():
    # Two storages whose central entries point at the same bytes: together they claim more than the file.
    n = 1 << 20
    pkl = b"\x80\x02" + P.MARK + _pid("0", n // 4) + P.BINPERSID + _pid("1", n // 4) + P.BINPERSID + P.TUPLE + P.STOP
    blob = bytearray(_archive(pkl, {"data/0": bytes(n), "data/1": b""}))
    cd0 = blob.index(b"PK\x01\x02", blob.index(b"archive/version") + 20)
    entries = []
    at = cd0
    while blob[at : at + 4] == b"PK\x01\x02":
        nlen, elen, clen = struct.unpack("<HHH", blob[at + 28 : at + 34])
        entries.append((at, bytes(blob[at + 46 : at + 46 + nlen])))
        at += 46 + nlen + elen + clen
    first = next(a for a, name in entries if name == b"archive/data/0")
    second = next(a for a, name in entries if name == b"archive/data/1")
    blob[second + 16 : second + 28] = blob[first + 16 : first + 28]  # same CRC and sizes
    blob[second + 42 : second + 46] = blob[first + 42 : first + 46]  # same local header
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            _load(bytes(blob))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * n


def _cuts(blob: bytes, step: int):
    return [blob[:i] for i in range(0, len(blob), step)]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_truncated_files_raise_value_error(legacy):
    b = io.BytesIO()
    torch.save(
        {"w": torch.arange(8.0), "p": torch.nn.Parameter(torch.ones(2))}, b, _use_new_zipfile_serialization=not legacy
    )
    kb = io.BytesIO()
    kiln.save({"w": kiln.arange(8.0)}, kb, format="torch")
    cases = _cuts(b.getvalue(), 3 if legacy else 7) + ([] if legacy else _cuts(kb.getvalue(), 7))
    failures = [(len(c), got) for c in cases if (got := _outcome(c)) != "ValueError"]
    assert failures == []
    assert len(cases) > 100


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_flipped_bytes_never_escape_as_other_errors(legacy):
    b = io.BytesIO()
    obj = {"w": torch.arange(6.0).reshape(2, 3), "t": torch.arange(6.0).reshape(2, 3).t(), "n": [1, "a", (2.5,)]}
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy)
    blob = b.getvalue()
    rng = np.random.default_rng(0)
    cases = []
    for i in range(len(blob)):
        for flip in (0xFF, 1 << int(rng.integers(8))):
            mutated = bytearray(blob)
            mutated[i] ^= flip
            cases.append(bytes(mutated))
    tracemalloc.start()
    try:
        outcomes = [_outcome(c) for c in cases]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a location changed into another valid device name ("cpu" -> "gpu") asks for a device that isn't
    # installed: PyTorch's RuntimeError, as for any missing device
    missing_device = "is not registered by any installed kiln plugin"
    bad = [o for o in outcomes if o not in ("loaded", "ValueError", "UnpicklingError") and missing_device not in o]
    assert bad == []
    assert peak < 32 * 2**20
    assert len(cases) > 1000


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_hostile_files_write_nothing(tmp_path):
    before = sorted(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for _, blob in _broken_archives():
            _outcome(blob)
    finally:
        os.chdir(cwd)
    assert sorted(os.listdir(tmp_path)) == before


def test_weights_only_false_maps_torch_names_it_knows_and_refuses_the_rest():
    blob = _archive(b"\x80\x02" + _g("torch.nn.functional", "relu") + P.STOP)
    with pytest.raises(ValueError, match=r"torch\.nn\.functional\.relu, which has no kiln counterpart"):
        _load(blob, weights_only=False)
    assert _load(_archive(_v2((2,), (1,))), weights_only=False).tolist() == [0.0, 0.0]
    od = _load(_archive(b"\x80\x02" + _g("collections", "OrderedDict") + P.EMPTY_TUPLE + P.REDUCE + P.STOP))
    assert od == OrderedDict()
