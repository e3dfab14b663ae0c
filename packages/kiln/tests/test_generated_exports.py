"""The files ``python -m kiln._codegen`` generates from the op registry are up to date.

``kiln/__init__.py``'s op imports, ``kiln/nn_functional.py`` and the
``Tensor`` stub ``kiln/_tensor.pyi`` are checked in; a new op, method or ``__all__`` entry makes them
stale, and this test names the files to regenerate.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import kiln
from kiln import _codegen

STUB = Path(_codegen.__file__).with_name("_tensor.pyi")


def _stub_class_names(cls_name: str) -> set[str]:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    names = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _from_kiln(value) -> bool:
    # tests define ops of their own (test_dispatch's cube_op binds Tensor.cube); those are not the core's
    return not isinstance(value, types.FunctionType) or value.__module__.split(".")[0] == "kiln"


def test_generated_files_are_up_to_date():
    stale = _codegen.stale()
    assert not stale, "stale generated files, run `python -m kiln._codegen`: " + ", ".join(map(str, stale))


def test_check_command_exits_0_when_up_to_date():
    result = subprocess.run(
        [sys.executable, "-m", "kiln._codegen", "--check"], capture_output=True, text=True, cwd=Path.home()
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_stale_lists_a_file_whose_text_differs(monkeypatch):
    monkeypatch.setattr(_codegen, "tensor_pyi", lambda: "# something else\n")
    assert _codegen.stale() == [STUB]


def test_stub_declares_every_public_tensor_attribute():
    declared = _stub_class_names("Tensor")
    public = {n for n in dir(kiln.Tensor) if not n.startswith("_") and _from_kiln(getattr(kiln.Tensor, n))}
    assert not public - declared, f"missing from {STUB.name}: {sorted(public - declared)}"
    operators = {
        n for n in vars(kiln.Tensor) if n.startswith("__") and n.endswith("__") and callable(vars(kiln.Tensor)[n])
    }
    assert not operators - declared - {"__init_subclass__", "__subclasshook__"}


def test_stub_declares_what_the_core_imports_from_kiln_tensor():
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    declared = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    declared |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    imported = set()
    for path in Path(kiln.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "kiln._tensor":
                imported |= {a.name for a in node.names}
    assert imported and not imported - declared, sorted(imported - declared)
    size = _stub_class_names("Size")
    assert "numel" in size


def test_nn_functional_is_the_nn_modules_all():
    from kiln import nn_functional

    expected = {n for m in _codegen.NN_MODULES for n in __import__(f"kiln._ops.{m}", fromlist=["x"]).__all__}
    assert set(nn_functional.__all__) == expected
    assert all(hasattr(nn_functional, n) for n in nn_functional.__all__)
