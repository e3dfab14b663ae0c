"""The one thread-count rule (``kiln._threads``): the default every backend starts from, and the check
every backend's ``set_num_threads`` applies, both as PyTorch."""

from __future__ import annotations

import re

import pytest

import kiln
from kiln import _threads

_NAMES = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_threads, "_requested", None)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OMP_NUM_THREADS": "3"}, 3),
        ({"NUMBA_NUM_THREADS": "5"}, 5),
        ({"OMP_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "5"}, 2),  # PyTorch's OMP_NUM_THREADS first
        ({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "4"}, 4),  # ATen: MKL_NUM_THREADS overrides it
        ({"OMP_NUM_THREADS": "0", "NUMBA_NUM_THREADS": "6"}, 6),  # not a positive count: skipped
        ({"OMP_NUM_THREADS": "abc"}, None),
        ({}, None),
    ],
)
def test_default_num_threads_follows_pytorch_order(clean_env, env, expected):
    import os

    for name, value in env.items():
        clean_env.setenv(name, value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert _threads.default_num_threads() == (expected or cpus)


def test_default_num_threads_follows_every_change_of_the_environment(clean_env):
    """The count is remembered only while the variables hold: each change shows at the next call."""
    import os

    cpus = _threads.default_num_threads()
    assert cpus == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    for value, expected in (("3", 3), (" 7 ", 7), ("0", cpus), ("3", 3)):
        clean_env.setenv("OMP_NUM_THREADS", value)
        assert _threads.default_num_threads() == expected
    clean_env.setenv("MKL_NUM_THREADS", "2")
    assert _threads.default_num_threads() == 2
    clean_env.delenv("MKL_NUM_THREADS")
    clean_env.delenv("OMP_NUM_THREADS")
    assert _threads.default_num_threads() == cpus


def test_get_num_threads_without_a_backend_reports_the_default(clean_env):
    clean_env.setenv("OMP_NUM_THREADS", "3")
    clean_env.setattr("kiln._plugins.threading_controls", lambda: {})
    assert kiln.get_num_threads() == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_check_num_threads_raises_what_torch_raises(bad):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as theirs:
        torch.set_num_threads(bad)
    with pytest.raises(RuntimeError) as ours:
        _threads.check_num_threads(bad)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(RuntimeError, match=f"^{re.escape(str(theirs.value))}$"):
        kiln.set_num_threads(bad)


def test_check_num_threads_passes_a_positive_int():
    assert _threads.check_num_threads(4) == 4
