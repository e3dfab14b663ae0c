"""Numba's on-disk cache index under concurrent writers: kiln-cpu serialises it (``_jit_support``), since
pytest-xdist's workers and nox's shared cache folder compile specialisations of one function at once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock: the lock is POSIX-only")

N = 300
_WRITER = f"""
import sys
import time
N = {N}
from kiln_cpu import _jit_support  # installs the lock
from numba.core.caching import IndexDataCacheFile

folder, tag, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
cache = IndexDataCacheFile(folder, "f-1.py311", ("stamp", 1))
while time.time() < start:  # both write at once
    pass
for i in range(N):
    cache.save((tag, i), f"{{tag}}-{{i}}".encode())
"""


def test_concurrent_writers_keep_each_entry_with_its_own_data(tmp_path):
    """Two processes saving entries of one index at once: every key loads its own data (without the lock,
    both picked the same free data file, and one key loaded the other's machine code)."""
    from numba.core.caching import IndexDataCacheFile

    from kiln_cpu import _jit_support  # noqa: F401

    start = str(time.time() + 3)  # after both interpreters have started
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), tag, start]) for tag in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=120) == 0
    cache = IndexDataCacheFile(str(tmp_path), "f-1.py311", ("stamp", 1))
    for tag in ("a", "b"):
        for i in range(N):
            assert cache.load((tag, i)) == f"{tag}-{i}".encode()
