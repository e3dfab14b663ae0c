"""The core's import graph is layered (the architecture page, "Layers"):

    dtype/device/state -> tensor -> dispatch/plugins -> ops -> autograd -> public API

A module imports, at module level, only from its own layer or the layers below it, so the module-level
graph has no cycle. Calls that must go upward (a Tensor method implemented by an op, the dispatcher
recording an autograd node) import inside the function, at call time; each module allowed to do so is
listed here with its reason, and the architecture page names the same list. A new upward import fails
this test until it is added to both, with a reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = ("dtype/device/state", "tensor", "dispatch/plugins", "ops", "autograd", "public API")
_BOTTOM = {
    "kiln._dtype",
    "kiln._device",
    "kiln._state",
    "kiln._spec",
    "kiln._threads",
    "kiln._memory_format",
    "kiln._flags",
    "kiln._lazy",
}
_DISPATCH = {
    "kiln._dispatch",
    "kiln._modes",
    "kiln._plugins",
    "kiln._reference",
    "kiln._public",
    "kiln._device_module",
    "kiln.hookspecs",
}

# module -> why it imports upward at call time (never at import time)
DEFERRED_UPWARD = {
    "kiln._threads": "set_num_threads reaches the backends' thread controls through the plugin manager",
    "kiln._tensor": "Tensor's methods (printing, backward, device moves, NumPy interop) are ops and autograd",
    "kiln._dispatch": "the dispatcher records autograd nodes; the autograd graph imports OpDef from it",
    "kiln._public": "an op's public function records autograd nodes, as the dispatcher does",
    "kiln._plugins": "the built-in reference plugin defines every op; the CPU fallback copies through ops",
    "kiln._reference": "registering the reference kernels imports the ops that define them",
    "kiln._device_module": "kiln.<device>.manual_seed seeds that device's generator in kiln.random",
    "kiln._ops.creation": "as_tensor wraps foreign GPU memory through kiln._interop (the CUDA array interface)",
    "kiln._ops.copy": "in-place variants move autograd history (autograd.graph, autograd.inplace)",
    "kiln._ops.random_ops": "random tensors are drawn from kiln.random's generators",
    "kiln._ops.embedding": "composite backward pieces run under no_grad",
    "kiln._ops.normalization": "composite backward pieces run under no_grad",
    "kiln._ops.softmax": "composite backward pieces run under no_grad and through autograd.grad",
    "kiln._ops.loss_reduction": "composite losses are written against the public kiln namespace",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (SRC / "kiln").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def layer(module: str) -> int:
    """The layer index of a core module (see the module docstring)."""
    if module in _BOTTOM:
        return 0
    if module == "kiln._tensor":
        return 1
    if module in _DISPATCH:
        return 2
    if module.startswith("kiln._ops"):
        return 3
    if module.startswith("kiln.autograd"):
        return 4
    return 5


def imports(path: Path, *, module_level: bool) -> set[str]:
    """The core modules ``path`` imports (``from kiln import _dtype`` counts as ``kiln._dtype`` alone). A
    function bound on first call (``kiln._lazy.first_call(globals(), "kiln.x", ...)``) is a call-time import
    of its module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if not module_level and _first_call_module(node):
            out.add(_first_call_module(node))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("kiln"):
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kiln"))
    return {m for m in out if m in MODULES}


def _first_call_module(node: ast.AST) -> str | None:
    """The module of a ``first_call(namespace, "module", ...)`` call, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "first_call"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def _upward(module_level: bool) -> dict[str, set[str]]:
    found = {}
    for name, path in MODULES.items():
        up = {m for m in imports(path, module_level=module_level) if layer(m) > layer(name)}
        if up:
            found[name] = up
    return found


def test_module_level_imports_never_go_up_a_layer():
    assert _upward(module_level=True) == {}


def test_module_level_import_graph_has_no_cycle():
    graph = {name: imports(path, module_level=True) - {name} for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_upward_imports_at_call_time_are_the_documented_ones():
    found = set(_upward(module_level=False))
    assert found - DEFERRED_UPWARD.keys() == set(), "upward imports not documented (add them with a reason)"
    assert DEFERRED_UPWARD.keys() - found == set(), "documented upward imports that no longer exist"


def test_the_layer_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from kiln._ops.views import view\n")
    assert layer("kiln._tensor") < layer("kiln._ops.views")
    assert imports(bad, module_level=True) == {"kiln._ops.views"}
    deferred = tmp_path / "deferred.py"
    deferred.write_text('from kiln._lazy import first_call\nview = first_call(globals(), "kiln._ops.views", "view")\n')
    assert imports(deferred, module_level=True) == {"kiln._lazy"}  # bound at call time, not at import
    assert "kiln._ops.views" in imports(deferred, module_level=False)
