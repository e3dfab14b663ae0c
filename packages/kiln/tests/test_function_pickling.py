"""Every function kiln binds pickles by reference, as PyTorch's do (``pickle.dumps(torch.erf)``; a module that
keeps ``self.act = torch.erf`` saves whole): the op factories make functions in one module that others bind,
and ``kiln._names`` gives those the names of a binding."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import pytest

import kiln
import kiln.fft
import kiln.linalg
import kiln.sparse
import kiln.special

_NAMESPACES = [kiln, kiln.Tensor, kiln.linalg, kiln.special, kiln.fft, kiln.sparse]


def _functions():
    for space in _NAMESPACES:
        for name, value in vars(space).items():
            if isinstance(value, types.FunctionType) and not name.startswith("__"):
                yield f"{getattr(space, '__name__', space)}.{name}", value


def test_every_bound_function_pickles_by_reference():
    found = list(_functions())
    assert len(found) > 1000
    wrong = []
    for where, fn in found:
        try:
            back = pickle.loads(pickle.dumps(fn))
        except Exception as exc:  # noqa: BLE001 - each one is reported
            wrong.append(f"{where}: {type(exc).__name__}")
            continue
        if back is not fn:
            wrong.append(f"{where}: loads as {back!r}")
    assert wrong == []


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_fresh_interpreter_loads_them(protocol):
    """The names lead back in a process that has not imported kiln: a Tensor method made by a factory
    (``abs_``), one of kiln's own methods bound under another name (``float``), an alias (``arccos``) and
    functions of the submodules."""
    fns = [
        kiln.Tensor.abs_,
        kiln.Tensor.float,
        kiln.arccos,
        kiln.erf,
        kiln.special.erf,
        kiln.linalg.lu_factor,
    ]
    code = (
        "import pickle, sys\n"
        "fns = pickle.loads(sys.stdin.buffer.read())\n"
        "import kiln, kiln.special, kiln.linalg\n"
        "want = [kiln.Tensor.abs_, kiln.Tensor.float, kiln.arccos, kiln.erf, kiln.special.erf,"
        " kiln.linalg.lu_factor]\n"
        "print(all(a is b for a, b in zip(fns, want)), fns[0](kiln.tensor([-2.0])).tolist())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(fns, protocol), capture_output=True, timeout=120
    )
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["True", "[2.0]"]


def test_names_keep_pythons_argument_errors():
    """A function keeps its names where its module can hold them (``Tensor.abs_`` is bound in the module that
    made it), and its own name over an alias (``acos``, not ``arccos``); a method the class's module made is
    named as a method written in the class (``Tensor.float``)."""
    assert kiln.Tensor.abs_.__qualname__ == "abs_" and kiln.Tensor.abs_.__module__.startswith("kiln._ops")
    assert kiln.arccos.__qualname__ == "acos" and kiln.arccos.__module__.startswith("kiln._ops")
    assert kiln.Tensor.float.__qualname__ == "Tensor.float"
    with pytest.raises(TypeError, match=r"float\(\) takes"):
        kiln.ones(2).float(1, 2, 3)
