"""kiln-cpu tests: every size runs the Numba kernels, a spy records which loops ran, and
``kiln_cpu_helpers`` is importable under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln_cpu import _jit, config

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def numba_for_every_size(monkeypatch):
    """Send every size to the Numba kernels (by default small tensors go to the reference)."""
    monkeypatch.setattr(config, "min_numel", 0)


@pytest.fixture
def spy(monkeypatch):
    """A list that receives ``(kind, code, layout)`` for every Numba loop the kernels call."""
    calls: list[tuple] = []
    for kind in ("binary", "unary", "reduce"):
        real = getattr(_jit, kind)

        def record(code, layout, _real=real, _kind=kind):
            calls.append((_kind, code, layout))
            return _real(code, layout)

        monkeypatch.setattr(_jit, kind, record)
    return calls
