"""Tests of kiln-testing itself: the kiln.testing helpers against PyTorch (the oracle for their
semantics and messages), the argument-spec table against the op registry, and the conformance
plugin against deliberately broken devices (it must catch them)."""

from __future__ import annotations

import os
import sys
import types

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "kiln-ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("kiln-thorough", max_examples=300, deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("KILN_HYPOTHESIS_PROFILE", "kiln-ci"))

# A toy device for these tests: bytearray storage, kernels for add, relu and _threshold_backward (the rest
# is missing), and switchable bugs so the tests can check that the conformance suite catches them. The
# same source runs in-process (the `toydev` fixture) and in subprocess pytest runs (written to a file).
TOY_SOURCE = '''
"""A toy kiln device for kiln-testing's own tests (bytearray storage, three kernels, optional bugs)."""
import numpy as np

import kiln

NAME = "toydev"


class Storage:
    def __init__(self, data, np_dtype):
        self.buf = bytearray(data)
        self.np_dtype = np.dtype(np_dtype)

    def __len__(self):
        return len(self.buf) // self.np_dtype.itemsize

    def array(self):
        return np.frombuffer(self.buf, dtype=self.np_dtype)


def view(t):
    if t.device.type != NAME:
        return t.numpy()
    mem = t.untyped_storage().array()
    isz = mem.itemsize
    return np.lib.stride_tricks.as_strided(
        mem[t.storage_offset():], tuple(t.shape), tuple(s * isz for s in t.stride())
    )


def operand(x, np_dtype):
    if isinstance(x, kiln.Tensor):
        return view(x).astype(np_dtype)
    return np.array(x).astype(np_dtype)[()]


def write(storage, start, array):
    storage.array()[start:start + array.size] = array


class Plugin:
    """``bugs``: "add-int32" (add is off by one for int32), "to_host" (the last element is lost on the way
    to the host), "threshold_backward" (relu's gradient kernel lets negative results through),
    "add-0d-shape" (add returns shape (1,) where its result is 0-d)."""

    def __init__(self, bugs=()):
        self.bugs = set(bugs)

    def kiln_register_devices(self, register):
        bugs = self.bugs

        def to_host(storage):
            a = storage.array().copy()
            if "to_host" in bugs and a.size > 1:
                a[-1] = a[0]
            return a

        register(
            NAME,
            empty=lambda n, dtype, index=None: Storage(bytes(n * dtype.itemsize), dtype.numpy),
            to_host=to_host,
            from_host=lambda a, index=None: Storage(np.ascontiguousarray(a).tobytes(), a.dtype),
            write=write,
            device_count=lambda: 2,
        )

    def kiln_register_kernels(self, register):
        bugs = self.bugs

        def new(spec):
            out = kiln.empty(spec[0], dtype=spec[1], device=spec[2])
            return out, view(out)

        def add(spec, input, other, alpha=1):
            out, dst = new(spec)
            c = np.dtype(spec[1].numpy)
            r = operand(input, c) + operand(other, c) * operand(alpha, c)
            if "add-int32" in bugs and spec[1] is kiln.int32:
                r = r + 1
            dst[...] = r
            if "add-0d-shape" in bugs and not spec[0]:
                return out.reshape(1)
            return out

        def relu(spec, input):
            out, dst = new(spec)
            a = operand(input, np.dtype(spec[1].numpy))
            dst[...] = np.maximum(a, np.zeros((), a.dtype))
            return out

        def threshold_backward(spec, grad, output):
            out, dst = new(spec)
            c = np.dtype(spec[1].numpy)
            keep = operand(output, c) > 0
            if "threshold_backward" in bugs:
                keep = operand(output, c) > -1
            dst[...] = np.where(keep, operand(grad, c), np.zeros((), c))
            return out

        register("add", NAME, add)
        register("relu", NAME, relu)
        register("_threshold_backward", NAME, threshold_backward)
'''


def load_toy_module() -> types.ModuleType:
    """The toy device module (one instance per process)."""
    mod = sys.modules.get("kiln_testing_toydev")
    if mod is None:
        mod = types.ModuleType("kiln_testing_toydev")
        exec(compile(TOY_SOURCE, "<kiln_testing_toydev>", "exec"), mod.__dict__)  # noqa: S102 - the toy's source
        sys.modules["kiln_testing_toydev"] = mod
    return mod


@pytest.fixture(scope="session")
def toydev():
    """Device type "toydev" registered in this process (bug-free); yields its name."""
    from kiln import plugins

    plugins.register_plugin(load_toy_module().Plugin(), name="toy")
    yield "toydev"
    plugins.unregister_plugin("toy")


@pytest.fixture(scope="session")
def toy_source() -> str:
    return TOY_SOURCE


@pytest.fixture
def cpu_fallback():
    """KILN_CPU_FALLBACK=1 for one test (kernel caches refilled on entry and exit), its warnings quiet."""
    import warnings

    from kiln_testing._runner import FALLBACK_WARNING
    from kiln_testing._runner import cpu_fallback as fallback

    with fallback(True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", FALLBACK_WARNING, UserWarning)
        yield
