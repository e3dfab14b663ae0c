"""kiln-cpu's source layout: no import cycle among its modules, no oversized file, a docstring in each; and
the lazy getters of its jitted modules, safe when threads import one at once.

The sources are parsed, not imported (importing the jitted modules would import Numba). An import counts
wherever it is written (module level or inside a function: a deferred import still ties two modules
together), and so does a kernel family's lazy getter of a jitted module, ``loops("_jit_<area>")``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kiln_cpu

SRC = Path(kiln_cpu.__file__).parent
MAX_LINES = 800
# Files allowed past MAX_LINES, each with its reason. Empty: every file is within the limit.
LONG_FILES_ALLOWED: dict[str, str] = {}


def _module_name(path: Path) -> str:
    return "kiln_cpu" if path.stem == "__init__" else f"kiln_cpu.{path.stem}"


def _imports(path: Path, known: set[str]) -> set[str]:
    """The kiln_cpu modules that the source at ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module):
            base = node.module if not node.level else ".".join(filter(None, ("kiln_cpu", node.module)))
            # ``from kiln_cpu import config``: the submodule; a name defined in ``base``: ``base`` itself
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(base)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "loops"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(f"kiln_cpu.{node.args[0].value}")
    return {m for m in found if m in known}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the kiln_cpu modules it imports (itself excluded), over every ``.py`` file in ``src``."""
    paths = {_module_name(p): p for p in sorted(src.glob("*.py"))}
    known = set(paths)
    return {name: _imports(path, known) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules (the first repeated at the end), else None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_deferred_imports_and_lazy_getters(tmp_path):
    (tmp_path / "one.py").write_text("def f():\n    from kiln_cpu import two\n")
    (tmp_path / "two.py").write_text('_j = loops("one")\n')
    graph = import_graph(tmp_path)
    assert graph == {"kiln_cpu.one": {"kiln_cpu.two"}, "kiln_cpu.two": {"kiln_cpu.one"}}
    assert find_cycle(graph) == ["kiln_cpu.one", "kiln_cpu.two", "kiln_cpu.one"]


def test_no_import_cycle_among_kiln_cpu_modules():
    graph = import_graph()
    assert "kiln_cpu.registry" in graph and "kiln_cpu._kernel_support" in graph  # the sources were found
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_only_the_plugin_imports_the_kernel_table():
    importers = {m for m, deps in import_graph().items() if "kiln_cpu.registry" in deps}
    assert importers == {"kiln_cpu.plugin"}


def test_no_source_file_is_too_long():
    too_long = {}
    for path in sorted(SRC.glob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and path.name not in LONG_FILES_ALLOWED:
            too_long[path.name] = lines
    assert not too_long, f"over {MAX_LINES} lines (split them, or allow them with a reason): {too_long}"


def test_every_module_has_a_docstring():
    missing = [p.name for p in sorted(SRC.glob("*.py")) if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing


def test_lazy_getter_waits_for_an_import_another_thread_has_begun(tmp_path, monkeypatch):
    """A kernel family's getter called while another thread imports the jitted module (in ``sys.modules``
    before its names are defined) waits for that import instead of returning the half-made module: threads
    starting their first large ops together raised "partially initialized module ... has no attribute"."""
    import sys
    import threading
    import types

    from kiln_cpu._kernel_support import loops

    gate = types.ModuleType("_kiln_cpu_probe_gate")
    gate.started, gate.release = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "_kiln_cpu_probe_gate", gate)
    (tmp_path / "_probe_slow.py").write_text(
        '"""A module whose import stops halfway until the test releases it."""\n'
        "import _kiln_cpu_probe_gate as gate\n\ngate.started.set()\ngate.release.wait(30)\nVALUE = 1\n"
    )
    monkeypatch.setattr(kiln_cpu, "__path__", [*kiln_cpu.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "kiln_cpu._probe_slow", raising=False)
    get = loops("_probe_slow")
    seen: dict[str, object] = {}
    first = threading.Thread(target=lambda: seen.setdefault("first", get()))
    first.start()
    assert gate.started.wait(30)
    second = threading.Thread(target=lambda: seen.setdefault("second", getattr(get(), "VALUE", None)))
    second.start()
    second.join(0.2)  # (old getter: done at once, with the half-made module)
    gate.release.set()
    first.join(30)
    second.join(30)
    sys.modules.pop("kiln_cpu._probe_slow", None)
    assert seen["second"] == 1
