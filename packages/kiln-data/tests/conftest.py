"""kiln-data's tests: PyTorch's torch.utils.data is the oracle for order, structure and lengths."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # kiln_data_helpers: datasets importable by spawned workers


def _shm_names() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("kiln_")}
    except OSError:
        return set()


@pytest.fixture
def no_shm_leak():
    """Fails the test if it leaves kiln DataLoader shared-memory segments in /dev/shm."""
    before = _shm_names()
    yield
    mine = {n for n in _shm_names() - before if n.startswith(f"kiln_{os.getpid()}_")}
    assert not mine, f"leaked shared memory segments: {sorted(mine)}"
