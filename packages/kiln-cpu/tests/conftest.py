"""kiln-cpu tests: every size runs the Numba kernels, a spy records which loops ran, and
``kiln_cpu_helpers`` is importable under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln_cpu import _jit_elementwise, _jit_norm, _jit_reduce, config

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def numba_for_every_size(monkeypatch):
    """Send every size to the Numba kernels (by default small tensors go to the reference)."""
    monkeypatch.setattr(config, "min_numel", 0)


@pytest.fixture
def spy(monkeypatch):
    """A list that receives ``(kind, code, layout)`` for every elementwise and reduction Numba loop the
    kernels call (kinds "binary", "unary", "reduce", "ternary"), with the half-precision kind appended for
    float16/bfloat16 loops (a ternary loop: its result's)."""
    calls: list[tuple] = []
    for kind, module in (("binary", _jit_elementwise), ("unary", _jit_elementwise), ("reduce", _jit_reduce)):
        real = getattr(module, kind)

        def record(code, layout, *half, _real=real, _kind=kind):
            calls.append((_kind, code, layout, *[h for h in half if h]))
            return _real(code, layout, *half)

        monkeypatch.setattr(module, kind, record)
    real_ternary = _jit_elementwise.ternary

    def ternary(code, layout, hout=0, *rest):
        calls.append(("ternary", code, layout, *([hout] if hout else [])))
        return real_ternary(code, layout, hout, *rest)

    monkeypatch.setattr(_jit_elementwise, "ternary", ternary)
    return calls


@pytest.fixture
def norm_spy(monkeypatch):
    """A list that receives the name of every softmax/norm Numba loop the kernels call (``name:kind`` for
    the half-precision loops: ``kind`` 1 for float16, 2 for bfloat16)."""
    calls: list[str] = []
    real = _jit_norm.norm

    def record(name, half=0):
        calls.append(f"{name}:{half}" if half else name)
        return real(name, half)

    monkeypatch.setattr(_jit_norm, "norm", record)
    return calls
