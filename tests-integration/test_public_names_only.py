"""Every package outside the core builds on public kiln names only (kiln.backend is the SDK).

A backend, feature package or device plugin that imports ``kiln._something`` breaks whenever the core
reorganises its internals; the architecture page promises plugin authors they never need to. This test
reads the sources of every distribution under ``packages/`` except the core, and of the example device
plugin, and fails naming each file and line that imports a private core module or name.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sources() -> list[Path]:
    roots = [p / "src" for p in sorted((REPO / "packages").iterdir()) if p.name != "kiln" and (p / "src").is_dir()]
    roots.append(REPO / "tests-integration" / "example_device" / "src")
    return [f for root in roots for f in sorted(root.rglob("*.py"))]


def _contributed() -> set[str]:
    """The modules of ``kiln`` that packages other than the core provide (``nn``, ``compile``, ``_dynamo``: a
    feature package's module named as PyTorch's, ``torch._dynamo``)."""
    return {
        p.name.removesuffix(".py")
        for pkg in (REPO / "packages").iterdir()
        if pkg.name != "kiln" and (pkg / "src" / "kiln").is_dir()
        for p in (pkg / "src" / "kiln").iterdir()
    }


def _private(module: str) -> bool:
    """Whether a dotted module path is one of the core's private modules (``kiln._ops.x``); a feature
    package's own private modules (``kiln.nn._x``, ``kiln._dynamo``) are its business."""
    parts = module.split(".")
    return (
        parts[0] == "kiln"
        and len(parts) > 1
        and parts[1].startswith("_")
        and not parts[1].startswith("__")
        and parts[1] not in _contributed()
    )


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each import of a private kiln module or name, and each ``kiln._x`` attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _private(node.module):
                found.append((node.lineno, f"from {node.module} import ..."))
            elif node.module == "kiln":
                hidden = [a.name for a in node.names if a.name.startswith("_")]
                if hidden:
                    found.append((node.lineno, f"from {node.module} import {', '.join(hidden)}"))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "kiln"
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append((node.lineno, f"kiln.{node.attr}"))
    return found


def test_the_checker_finds_each_kind_of_private_use():
    src = (
        "import kiln._ops.views\nfrom kiln._dispatch import OPS\nfrom kiln import _plugins\n"
        "import kiln\nx = kiln._state\nfrom kiln.backend import Spec\nfrom kiln.nn import functional\n"
        "from kiln.nn._lazy import LazyModule\nfrom kiln._dynamo import exc\n"
    )
    assert [line for line, _ in private_uses(src)] == [1, 2, 3, 5]  # kiln._dynamo is kiln-compile's


def test_packages_outside_the_core_import_only_public_kiln_names():
    offenders = []
    for path in _sources():
        for line, what in private_uses(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not offenders, "private kiln names used outside the core (use kiln.backend):\n" + "\n".join(offenders)
