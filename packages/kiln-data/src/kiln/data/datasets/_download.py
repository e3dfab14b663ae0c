"""Downloading data set files: stream to a temp file, verify the checksum, rename into place."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

__all__ = ["download_url", "check_integrity", "file_digest"]

_CHUNK = 1 << 20


def file_digest(path: str | os.PathLike, algorithm: str = "md5") -> str:
    """The hex digest of a file's bytes (``md5`` or ``sha256``)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def check_integrity(path: str | os.PathLike, md5: str | None = None, sha256: str | None = None) -> bool:
    """True if ``path`` exists and matches the checksums given (any that are ``None`` are not checked)."""
    if not os.path.isfile(path):
        return False
    if md5 is not None and file_digest(path, "md5") != md5:
        return False
    return sha256 is None or file_digest(path, "sha256") == sha256


def download_url(
    url: str, path: str | os.PathLike, md5: str | None = None, sha256: str | None = None, timeout: float = 60.0
) -> Path:
    """Fetch ``url`` into ``path`` atomically (temp file + rename) after checking its md5/sha256.

    A file already at ``path`` with the right checksums is kept as it is. A mismatch raises a
    RuntimeError and leaves nothing behind.
    """
    path = Path(path)
    if check_integrity(path, md5, sha256) and (md5 or sha256):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    hashes = {"md5": hashlib.md5(), "sha256": hashlib.sha256()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                for h in hashes.values():
                    h.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        for name, expected in (("md5", md5), ("sha256", sha256)):
            got = hashes[name].hexdigest()
            if expected is not None and got != expected:
                raise RuntimeError(f"{name} checksum mismatch for {url}: expected {expected}, got {got}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
