"""kiln.save / kiln.load against hostile input and hostile conditions.

A generator derives thousands of malformed files from one valid checkpoint (truncations, every header
field of the wrong type or out of range, size bombs, nesting bombs, duplicate keys, PyTorch files):
``ValueError`` is the only allowed outcome, with bounded memory. Saves are killed with SIGKILL at
random moments: the target always holds the old or the new checkpoint, and the debris of dead writers
is cleaned by the next save, and debris that cannot be removed never fails it. New files get the
umask's mode, a file saved over keeps its mode, symlinks stay symlinks, and loading needs about one
copy of the tensors' bytes, not two.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import stat
import struct
import subprocess
import sys
import time
import tracemalloc
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import kiln

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes, signals and fork")


def _base() -> tuple[dict, bytes]:
    """A valid checkpoint's parsed header and its data bytes."""
    buf = io.BytesIO()
    obj = {
        "w": kiln.arange(6.0).reshape(2, 3),
        "b": kiln.tensor([1, 2, 3]),
        "flag": kiln.tensor([True, False]),
        "nested": {"h": kiln.ones(2, dtype=kiln.bfloat16), 0: [kiln.zeros(0, 4), 1.5, None, "s"]},
        "step": 7,
    }
    kiln.save(obj, buf)
    blob = buf.getvalue()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _file(header: dict | bytes | str, data: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else (header if isinstance(header, str) else json.dumps(header)).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _with(header: dict, path: tuple, value) -> dict:
    """A deep copy of ``header`` with the item at ``path`` replaced (or deleted for ``_DELETE``)."""
    out = json.loads(json.dumps(header))
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_DELETE = object()
# Values of the wrong type or out of range for any header field (bools are not ints, floats are not ints).
WRONG = [[], [1], [[0, 8]], {}, {"a": 1}, None, True, False, 1.5, 8.0, 2**64, 10**30, -1, -(2**63), "x", "", "F32"]


def _structure(header: dict, root) -> dict:
    meta = {"kiln.structure": json.dumps({"version": 1, "root": root})}
    return _with(header, ("__metadata__",), meta)


def _malformed() -> Iterator[tuple[str, bytes]]:
    header, data = _base()
    blob = _file(header, data)
    names = [k for k in header if k != "__metadata__"]
    w = header["w"]  # F32 [2, 3]
    structure = json.loads(header["__metadata__"]["kiln.structure"])

    for cut in range(len(blob)):  # truncation anywhere: length field, header, data
        yield f"truncated at {cut}", blob[:cut]

    for name in names:  # every field of every entry replaced by wrong types and values
        for field in ("dtype", "shape", "data_offsets"):
            for v in WRONG:
                if v != header[name][field]:
                    yield f"{name}.{field}={v!r}", _file(_with(header, (name, field), v), data)
            yield f"{name}.{field} missing", _file(_with(header, (name, field), _DELETE), data)
        for v in WRONG:
            yield f"{name}={v!r}", _file(_with(header, (name,), v), data)
        yield f"{name} extra key", _file(_with(header, (name, "extra"), 1), data)
    for v in WRONG:  # null and {} are a valid (absent / empty) __metadata__
        if v is not None and v != {}:
            yield f"__metadata__={v!r}", _file(_with(header, ("__metadata__",), v), data)
        if not isinstance(v, str):
            yield f"structure={v!r}", _file(_with(header, ("__metadata__", "kiln.structure"), v), data)
    yield "metadata value int", _file(_with(header, ("__metadata__", "other"), 1), data)
    yield "metadata value nested", _file(_with(header, ("__metadata__", "other"), {"a": "b"}), data)
    for root in (json.dumps(v) for v in WRONG):
        yield f"header root {root}", _file(root, data)

    # dtypes, shapes and offsets out of range: size bombs and overflowing products
    for dtype in ("C64", "f32", "F32 ", "U16", "I128", "F8_E4M3"):
        yield f"dtype {dtype}", _file(_with(header, ("w", "dtype"), dtype), data)
    for shape in ([-2, 3], [2, -3], [2**63, 1], [2**64], [2**32, 2**32, 2**32], [0, 2**62], [0] + [2**40] * 3):
        yield f"shape {shape}", _file(_with(header, ("w", "shape"), shape), data)
    yield "65 dims", _file(_with(header, ("w", "shape"), [1] * 62 + [2, 3, 1]), data)
    yield "shape mismatch", _file(_with(header, ("w", "shape"), [3, 3]), data)
    b, e = w["data_offsets"]
    for offs in (
        [e, b],
        [b, e + 4],
        [b + 4, e + 4],
        [b - 4, e - 4] if b else [b + 8, e + 8],
        [b, b],
        [b],
        [b, e, e],
        [-b - 1, e],
        [b, 2**64 + e],
        [2**64, 2**64 + e - b],
        [float(b), float(e)],
        [str(b), str(e)],
        [b, True],
    ):
        yield f"offsets {offs}", _file(_with(header, ("w", "data_offsets"), offs), data)
    big = _with(header, ("w", "shape"), [2**20, 2**20])  # 4 TiB that the file does not have
    big["w"]["data_offsets"] = [b, b + 4 * 2**40]
    yield "4 TiB tensor", _file(big, data)
    yield "trailing bytes", _file(header, data + b"\0" * 8)
    yield "missing data", _file(header, data[:-1])

    # the header length field
    raw = json.dumps(header).encode()
    for length in (0, 1, len(raw) - 1, len(raw) + 1, len(raw) + len(data) + 1, 100_000_001, 2**63, 2**64 - 1):
        yield f"header length {length}", _file(header, data, length=length)

    # duplicate keys anywhere in the header; bytes that are not UTF-8; not JSON at all
    entry = json.dumps(w)
    dup = raw.decode().replace('"w": ', f'"w": {entry}, "w": ', 1)
    yield "duplicate tensor", _file(dup, data)
    yield "duplicate field", _file(raw.decode().replace('"dtype": "F32"', '"dtype": "F32", "dtype": "F64"', 1), data)
    yield (
        "duplicate metadata key",
        _file(raw.decode().replace('"__metadata__": {', '"__metadata__": {"k": "1", "k": "2", ', 1), data),
    )
    yield "non-UTF-8 name", _file(raw.replace(b'"w"', b'"\xff"', 1), data)
    yield "non-UTF-8 anywhere", _file(raw[:20] + b"\xc3\x28" + raw[22:], data)
    yield "NaN offset", _file(raw.decode().replace(f"[{b}, {e}]", f"[{b}, NaN]", 1), data)
    yield "not JSON", _file(b"{" + b" " * 7, data)
    yield "huge integer", _file(raw.decode().replace(f"[{b}, {e}]", f"[{b}, {'9' * 5000}]", 1), data)

    # nesting bombs: in the header itself, in __metadata__, in kiln.structure (parseable and not)
    yield "header [ bomb", _file("[" * 100_000 + "]" * 100_000, data)
    yield "header { bomb", _file('{"a":' * 100_000 + "1" + "}" * 100_000, data)
    yield "metadata bomb", _file(_with(header, ("__metadata__", "deep"), json.loads("[" * 500 + "]" * 500)), data)
    raw_bomb = raw.decode().replace(
        '"__metadata__": {', '"__metadata__": {"deep": ' + "[" * 100_000 + "]" * 100_000 + ", ", 1
    )
    yield "metadata raw bomb", _file(raw_bomb, data)
    for depth in (101, 400, 100_000):  # 100 levels of containers load (see below); these don't
        deep = '{"version": 1, "root": ' + '{"list": [' * depth + '{"none": null}' + "]}" * depth + "}"
        yield f"structure depth {depth}", _file(_with(header, ("__metadata__", "kiln.structure"), deep), data)
    yield "structure [ bomb", _file(_with(header, ("__metadata__", "kiln.structure"), "[" * 100_000), data)

    # kiln.structure with wrong types and values
    for v in WRONG:
        yield (
            f"structure version {v!r}",
            _file(
                _with(
                    header, ("__metadata__", "kiln.structure"), json.dumps({"version": v, "root": structure["root"]})
                ),
                data,
            ),
        )
        yield f"structure wrapper {v!r}", _file(_with(header, ("__metadata__", "kiln.structure"), json.dumps(v)), data)
        for key in ("tensor", "device", "requires_grad"):
            # a well-formed device string naming a device not installed here is not a broken file (as
            # in torch, moving the tensor there raises RuntimeError); a string is a valid tensor name
            if not (key == "requires_grad" and isinstance(v, bool)) and not (key == "device" and v):
                yield (
                    f"tensor node {key}={v!r}",
                    _file(_structure(header, {"tensor": "w", "device": "cpu", key: v}), data),
                )
        for kind in ("none", "bool", "int", "float", "str", "list", "tuple", "dict"):
            ok = {"none": v is None, "bool": type(v) is bool, "int": type(v) is int, "str": isinstance(v, str)}
            ok |= {"list": isinstance(v, list) and not v, "tuple": isinstance(v, list) and not v}
            ok |= {"dict": isinstance(v, list) and not v}
            if not ok.get(kind, False):
                yield f"{kind} node {v!r}", _file(_structure(header, {kind: v}), data)
        if not isinstance(v, str):
            yield f"dict key {v!r}", _file(_structure(header, {"dict": [[v, {"none": None}]]}), data)
        yield f"dict item {v!r}", _file(_structure(header, {"dict": [v]}), data)
        yield f"list item {v!r}", _file(_structure(header, {"list": [v]}), data)
    yield "int key float", _file(_structure(header, {"dict": [[{"int": 1.0}, {"none": None}]]}), data)
    yield "missing tensor", _file(_structure(header, {"tensor": "nope"}), data)
    yield "bad device", _file(_structure(header, {"tensor": "w", "device": "cpu:-1"}), data)
    yield "empty device", _file(_structure(header, {"tensor": "w", "device": ""}), data)
    yield "int requires_grad", _file(_structure(header, {"tensor": "b", "requires_grad": True}), data)
    yield "two kinds", _file(_structure(header, {"int": 1, "str": "x"}), data)
    yield "empty node", _file(_structure(header, {}), data)
    yield "float text", _file(_structure(header, {"float": "one"}), data)
    yield "no root", _file(_with(header, ("__metadata__", "kiln.structure"), '{"version": 1}'), data)
    yield "structure not JSON", _file(_with(header, ("__metadata__", "kiln.structure"), '{"version": 1,'), data)


def _pytorch_files(tmp_path) -> list[tuple[str, bytes]]:
    import torch

    out = []
    for i, obj in enumerate(({"w": torch.ones(3, 2), "step": 1}, torch.arange(5))):
        zip_path, legacy_path = tmp_path / f"z{i}.pt", tmp_path / f"l{i}.pt"
        torch.save(obj, zip_path)
        torch.save(obj, legacy_path, _use_new_zipfile_serialization=False)
        out += [(f"torch zip {i}", zip_path.read_bytes()), (f"torch legacy {i}", legacy_path.read_bytes())]
    return out


class _Stream(io.RawIOBase):
    """A readable stream that can't seek or tell its size (a pipe, a socket)."""

    def __init__(self, blob: bytes) -> None:
        self._buf = io.BytesIO(blob)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._buf.readinto(b)


def _outcome(source) -> str | None:
    """None when ``kiln.load(source)`` raised ValueError, else what happened instead."""
    try:
        kiln.load(source)
    except ValueError:
        return None
    except BaseException as e:  # noqa: BLE001 - anything but ValueError is the bug being looked for
        return f"{type(e).__name__}: {str(e)[:200]}"
    return "loaded without an error"


def test_every_malformed_file_raises_value_error(tmp_path):
    cases = list(_malformed())
    p = tmp_path / "bad.safetensors"
    failures = []
    peak = 0
    tracemalloc.start()  # also catches any allocation sized by the file's claims rather than its bytes
    try:
        for i, (label, blob) in enumerate(cases):
            p.write_bytes(blob)
            sources = {"path": p, "BytesIO": io.BytesIO(blob)}
            if i % 5 == 0:  # a stream that can't tell its size takes another path through load
                sources["stream"] = io.BufferedReader(_Stream(blob))
            for how, source in sources.items():
                tracemalloc.reset_peak()
                if (got := _outcome(source)) is not None:
                    failures.append((label, how, got))
                peak = max(peak, tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()
    assert failures == []
    assert len(cases) > 1500
    assert peak < 32 * 2**20


def test_pytorch_files_are_recognised_and_loaded(tmp_path):
    # never mistaken for a corrupt safetensors header (their first 8 bytes read as a huge length)
    for label, blob in _pytorch_files(tmp_path):
        p = tmp_path / "model.pt"
        p.write_bytes(blob)
        out = kiln.load(p)
        if isinstance(out, dict):
            assert out["w"].tolist() == [[1.0, 1.0]] * 3 and out["step"] == 1, label
        else:
            assert out.tolist() == [0, 1, 2, 3, 4], label


def test_nesting_is_bounded_on_save_and_load_alike(tmp_path):
    def nested(depth):
        obj = kiln.ones(1)
        for i in range(depth):
            obj = {i: obj, "s": "x"} if i % 2 else [obj]
        return obj

    p = tmp_path / "deep.kt"
    kiln.save(nested(100), p)
    out = kiln.load(p)
    for i in reversed(range(100)):
        out = out[i] if i % 2 else out[0]
    assert out.tolist() == [1.0]
    with pytest.raises(ValueError, match="more than 100 levels deep"):
        kiln.save(nested(101), p, format="safetensors")
    kiln.load(p)  # the refused save left the previous file
    kiln.save(nested(101), p)  # the default format writes what safetensors can't hold in torch's format
    assert p.read_bytes()[:4] == b"PK\x03\x04"
    out = kiln.load(p)
    for i in reversed(range(101)):
        out = out[i] if i % 2 else out[0]
    assert out.tolist() == [1.0]


# ------------------------------------------------------------------------------------------ killed saves


def _checkpoint(value: int, n: int) -> dict:
    # Built from NumPy: a forked child must not run kernels (a backend may keep a thread pool).
    return {
        "a": kiln.from_numpy(np.full(n, value, np.float32)),
        "b": kiln.from_numpy(np.full(n, -value, np.float32)),
        "value": value,
    }


def _value_of(path) -> int:
    """The checkpoint's value, after checking the file is whole and self-consistent."""
    out = kiln.load(path)
    v = out["value"]
    a, b = out["a"].numpy(), out["b"].numpy()
    assert a.size == b.size > 0 and (a == v).all() and (b == -v).all(), v
    return v


def _temps(directory) -> set[str]:
    return {f for f in os.listdir(directory) if f.endswith(".tmp")}


@posix_only
def test_saves_killed_at_random_moments_leave_old_or_new_and_no_debris(tmp_path):
    n = 3_000_000  # 24 MB a checkpoint: long enough to be killed mid-write
    target = tmp_path / "ckpt.kt"
    kiln.save(_checkpoint(0, n), target)
    rng = random.Random(20240613)
    current, kills, mid_write, deadline = 0, 0, 0, time.monotonic() + 40
    while kills < 20 and time.monotonic() < deadline:
        base = (kills + 1) * 1000
        before = _temps(tmp_path)
        r, w = os.pipe()
        with warnings.catch_warnings():  # Python 3.12+ warns about forking a process that has threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child saves over the target until it is killed, reporting each finished save
            try:
                os.close(r)
                for v in range(base + 1, base + 1000):
                    kiln.save(_checkpoint(v, n), target)
                    os.write(w, struct.pack("<q", v))
            finally:
                os._exit(0)
        os.close(w)
        try:  # wait until the child is writing a temp file, then kill it somewhere in the next 250 ms
            wait_until = time.monotonic() + 5
            while time.monotonic() < wait_until and not _temps(tmp_path) - before:
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.25))
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # reaped: a zombie would still count as a live writer
        with os.fdopen(r, "rb") as fh:
            done = [v for (v,) in struct.iter_unpack("<q", fh.read())]
        kills += 1
        mid_write += bool(_temps(tmp_path) - before)
        got = _value_of(target)
        latest = done[-1] if done else current
        assert got in (latest, latest + 1 if done else base + 1), (got, current, done)
        current = got
    assert kills >= 15
    assert mid_write >= 3  # the kills did land inside writes, so there was debris to clean
    kiln.save(_checkpoint(-1, n), target)
    assert os.listdir(tmp_path) == ["ckpt.kt"]
    assert _value_of(target) == -1


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@posix_only
def test_stale_temp_files_of_dead_writers_only_are_removed(tmp_path):
    import fcntl

    target = tmp_path / "m.kt"
    dead = _dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        files = {
            "dead": f".m.kt.{dead}.{'a' * 16}.tmp",
            "live": f".m.kt.{sleeper.pid}.{'b' * 16}.tmp",
            "mine": f".m.kt.{os.getpid()}.{'c' * 16}.tmp",  # another thread of this process
            "locked": f".m.kt.{dead}.{'d' * 16}.tmp",  # a writer in another PID namespace holds its lock
            "other target": f".n.kt.{dead}.{'e' * 16}.tmp",
            "not ours": ".m.kt.abc123.tmp",
        }
        for f in files.values():
            (tmp_path / f).write_bytes(b"partial")
        with open(tmp_path / files["locked"], "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            kiln.save(kiln.ones(2), target)
        left = set(os.listdir(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert files["dead"] not in left
    assert left == {"m.kt"} | {f for k, f in files.items() if k != "dead"}


@posix_only
def test_stale_temp_files_that_cannot_be_removed_do_not_fail_the_save(tmp_path, monkeypatch):
    # Another user's stale temp file in a sticky shared directory (/tmp): unlink says EPERM.
    target = tmp_path / "m.kt"
    dead = _dead_pid()
    theirs, ours = f".m.kt.{dead}.{'a' * 16}.tmp", f".m.kt.{dead}.{'b' * 16}.tmp"
    for f in (theirs, ours):
        (tmp_path / f).write_bytes(b"partial")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)) == theirs:
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    kiln.save(kiln.ones(2), target)
    assert kiln.load(target).tolist() == [1.0, 1.0]
    assert set(os.listdir(tmp_path)) == {"m.kt", theirs}  # the other stale file is still removed

    def listdir(path="."):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "listdir", listdir)  # a directory that cannot be listed: no cleanup, no error
    kiln.save(kiln.zeros(2), target)
    monkeypatch.undo()
    assert kiln.load(target).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------------------------ files


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@posix_only
def test_new_file_mode_follows_the_umask(tmp_path):
    for umask in (0o022, 0o077, 0o002):
        p = tmp_path / f"m{umask:o}.kt"
        old = os.umask(umask)
        try:
            kiln.save(kiln.ones(2), p)
        finally:
            os.umask(old)
        assert _mode(p) == 0o666 & ~umask, oct(umask)


@posix_only
def test_saving_over_a_file_keeps_its_mode(tmp_path):
    # As torch.save (open(path, "wb") truncates in place): the umask does not widen, or narrow, it.
    old = os.umask(0o022)
    try:
        for mode in (0o600, 0o640, 0o444, 0o666):
            p = tmp_path / f"m{mode:o}.kt"
            kiln.save(kiln.ones(2), p)
            os.chmod(p, mode)
            kiln.save(kiln.zeros(2), p)
            assert _mode(p) == mode, oct(mode)
            assert kiln.load(p).tolist() == [0.0, 0.0]
        new = tmp_path / "new.kt"
        kiln.save(kiln.ones(2), new)
        assert _mode(new) == 0o644
        real = tmp_path / "m600.kt"  # through a symlink, the mode of the file it points to is kept
        link = tmp_path / "link.kt"
        link.symlink_to(real.name)
        kiln.save(kiln.full((2,), 5.0), link)
        assert link.is_symlink() and _mode(real) == 0o600 and kiln.load(real).tolist() == [5.0, 5.0]
    finally:
        os.umask(old)
    assert not _temps(tmp_path)


@posix_only
def test_saving_through_a_symlink_keeps_the_link(tmp_path):
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    kiln.save(kiln.ones(2), real_dir / "model.kt")
    link = link_dir / "latest.kt"
    link.symlink_to("../real/model.kt")
    kiln.save(kiln.full((2,), 3.0), link)
    assert link.is_symlink() and os.readlink(link) == "../real/model.kt"
    assert kiln.load(real_dir / "model.kt").tolist() == [3.0, 3.0]
    assert os.listdir(link_dir) == ["latest.kt"] and os.listdir(real_dir) == ["model.kt"]
    dangling = link_dir / "next.kt"  # a link to a file not written yet: the file appears where it points
    dangling.symlink_to("../real/next.kt")
    kiln.save(kiln.zeros(1), dangling)
    assert dangling.is_symlink() and kiln.load(real_dir / "next.kt").tolist() == [0.0]


def test_loading_needs_one_copy_of_the_data_not_two(tmp_path):
    p = tmp_path / "big.kt"
    nbytes = 48 * 2**20  # 32 MiB + 16 MiB of float32
    kiln.save({"a": kiln.from_numpy(np.ones(8 * 2**20, np.float32)), "b": [kiln.zeros(4 * 2**20)]}, p)
    tracemalloc.start()
    try:
        out = kiln.load(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out["a"].numpy().sum() == 8 * 2**20 and not out["b"][0].numpy().any()
    assert peak < 1.15 * nbytes, peak / nbytes  # the tensors themselves, plus small change
