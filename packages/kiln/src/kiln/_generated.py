"""Generated source as importable files: what kernel generators (kiln-cpu's fusion, kiln-cuda's kernels) build
on, so Numba's ``cache=True`` can keep their machine code on disk (it caches only functions defined in
files). Exposed as :func:`kiln.backend.generated_module`."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import types
from pathlib import Path

from kiln._atomic_write import atomic_write

_lock = threading.Lock()
_modules: dict[tuple[str, str], types.ModuleType] = {}


def generated_module(text: str, folder: str | os.PathLike, package: str) -> types.ModuleType:
    """The module whose source is ``text``: written once to ``folder`` as a file named by the text's hash
    (atomically: a file is whole or absent, whatever runs at the same time), run once per process as
    ``<package>.k_<hash>``.

    The module runs ``text`` itself, never what the file holds: a file that differs from ``text`` (cut
    short, or written by someone else into a shared cache folder) is replaced first, so that Numba's disk
    cache, which reads the file, sees the same source."""
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    mod = _modules.get((package, key))
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get((package, key))
        if mod is None:
            folder = Path(folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"k_{key}.py"
            data = text.encode()
            try:
                same = path.read_bytes() == data
            except OSError:
                same = False
            if not same:
                atomic_write(path, lambda fh, _: fh.write(data))
            name = f"{package}.k_{key}"
            mod = types.ModuleType(name)
            mod.__file__ = str(path)
            sys.modules[name] = mod
            exec(compile(text, str(path), "exec"), mod.__dict__)  # noqa: S102 - the caller's own generated source
            _modules[(package, key)] = mod
    return mod
