"""kiln-cuda's tests run on numba's CUDA simulator unless a GPU is present (``NUMBA_ENABLE_CUDASIM=1``
is set by the nox cell ``tests(backend='cuda-sim')``); without either they are skipped."""

import pytest

import kiln


def pytest_collection_modifyitems(config, items):
    if kiln.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no GPU and no CUDA simulator (set NUMBA_ENABLE_CUDASIM=1)")
    for item in items:
        if "needs_device" not in item.keywords or item.get_closest_marker("needs_device"):
            item.add_marker(skip)


def pytest_sessionstart(session):
    """Record every kernel launch, so that test_ptx.py can compile each one for a real GPU."""
    from kiln_cuda import codegen

    codegen.start_recording()
