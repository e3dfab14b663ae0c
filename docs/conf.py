"""Sphinx configuration of the kiln documentation (one site for every kiln package).

Build it with ``python3 -m nox -s docs`` (warnings are errors). The API reference of the core is
generated here, at configuration time, from the names ``import kiln`` exports, grouped by the module
that defines them: a new public op shows up in the reference without anyone editing an index.
"""

from __future__ import annotations

import importlib
import inspect
import types
from pathlib import Path

import kiln

project = "kiln"
author = "kiln developers"
copyright = "kiln developers"  # noqa: A001 - Sphinx's setting name
release = kiln.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
templates_path = ["_templates"]
exclude_patterns = ["_build", "examples"]
html_theme = "furo"
html_title = f"kiln {release}"
default_role = "code"  # `x` in a docstring is inline code, as in PyTorch's docs

autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

# ------------------------------------------------------------------------ the generated API page

HERE = Path(__file__).resolve().parent
GENERATED = HERE / "api" / "generated"

# Defining module -> section of the reference, in page order. A name from a module not listed here
# lands in "Other", so nothing public is ever left out.
SECTIONS: list[tuple[str, list[str], str]] = [
    ("Tensors", ["kiln._tensor"], "The tensor type and its shape type."),
    ("Creation", ["kiln._ops.creation"], "New tensors from data, shapes, ranges and random draws."),
    ("Elementwise math and comparisons", ["kiln._ops.elementwise"], "Broadcasting elementwise ops."),
    ("Reductions", ["kiln._ops.reduction"], "Reductions over all elements or over dimensions."),
    ("Linear algebra", ["kiln._ops.linalg"], "Matrix products."),
    (
        "Shapes and views",
        ["kiln._ops.views", "kiln._ops.strided", "kiln._ops.copy"],
        "Views share their input's storage.",
    ),
    ("Types and promotion", ["kiln._dtype", "kiln._ops._meta"], "dtypes, the default dtype, type promotion."),
    ("Devices", ["kiln._device"], "Device objects (``kiln.device('cpu')``, ``'cuda:1'``)."),
    ("Random numbers", ["kiln.random"], "Seeding and generators."),
    ("Gradient modes", ["kiln.autograd.grad_mode"], "Turn gradient recording off and on."),
    ("Utilities", ["kiln"], "Small helpers on tensors and dtypes."),
]


def _public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return sorted(names, key=str.lower)


def _underline(title: str, char: str) -> str:
    return f"{title}\n{char * len(title)}\n"


def _autosummary(names: list[str]) -> str:
    """A summary table of ``names`` (relative to the page's current module), one stub page each."""
    lines = [".. autosummary::", "   :toctree: .", "   :nosignatures:", ""]
    lines += [f"   {n}" for n in names]
    return "\n".join(lines) + "\n"


def _kiln_page() -> str:
    """``api/generated/kiln.rst``: every public name of ``kiln``, grouped by the module defining it."""
    groups: dict[str, list[str]] = {}
    dtypes: list[str] = []
    for name in _public_names(kiln):
        obj = getattr(kiln, name)
        if isinstance(obj, types.ModuleType) or name == "annotations":
            continue  # submodules get their own pages; `annotations` is the __future__ import
        if isinstance(obj, kiln.dtype):
            dtypes.append(name)
            continue
        groups.setdefault(getattr(obj, "__module__", None) or "kiln", []).append(name)
    out = [_underline("kiln", "="), ".. module:: kiln\n", ".. currentmodule:: kiln\n"]
    out.append("Everything ``import kiln`` exports, grouped by topic. Names and signatures follow PyTorch's.\n")
    placed: set[str] = set()
    for title, modules, blurb in SECTIONS:
        names = sorted((n for m in modules for n in groups.get(m, [])), key=str.lower)
        placed.update(modules)
        if names:
            out += [_underline(title, "-"), blurb + "\n", _autosummary(names)]
        if title.startswith("Types"):
            out.append(_dtype_table(dtypes))
    rest = sorted((n for m, ns in groups.items() if m not in placed for n in ns), key=str.lower)
    if rest:
        out += [_underline("Other", "-"), _autosummary(rest)]
    return "\n".join(out)


def _dtype_table(names: list[str]) -> str:
    """The dtype objects (``kiln.float32`` and its aliases) as one table."""
    by_dtype: dict[object, list[str]] = {}
    for n in names:
        by_dtype.setdefault(getattr(kiln, n), []).append(n)
    rows = []
    order = sorted(
        by_dtype, key=lambda d: (d.is_floating_point, str(d) != "kiln.bool", d.itemsize, d.is_signed, str(d))
    )
    for d in order:
        aliases = by_dtype[d]
        canonical = str(d).removeprefix("kiln.")
        others = ", ".join(f"``kiln.{a}``" for a in sorted(aliases) if a != canonical) or "—"
        kind = "floating point" if d.is_floating_point else ("boolean" if canonical == "bool" else "integer")
        rows.append(f"   * - ``kiln.{canonical}``\n     - {others}\n     - {kind}\n     - {d.itemsize}")
    head = (
        "dtype objects\n^^^^^^^^^^^^^\n\n"
        "Instances of :class:`kiln.dtype`; the default floating point dtype is ``kiln.float32``.\n\n"
        ".. list-table::\n   :header-rows: 1\n\n"
        "   * - dtype\n     - aliases\n     - kind\n     - bytes\n"
    )
    return head + "\n".join(rows) + "\n"


def _module_page(modname: str, blurb: str) -> str:
    """A page for a public submodule (``kiln.autograd``): its docstring's summary and its ``__all__``.

    Names that ``kiln`` re-exports (``no_grad``, ...) are documented once, on the ``kiln`` page, and
    linked from here: documenting a class under two names makes Sphinx report a duplicate.
    """
    module = importlib.import_module(modname)
    names = _public_names(module)
    shared = [n for n in names if getattr(kiln, n, None) is getattr(module, n)]
    out = [_underline(modname, "="), f".. module:: {modname}\n", f".. currentmodule:: {modname}\n", blurb + "\n"]
    out.append(_autosummary([n for n in names if n not in shared]))
    if shared:
        links = ", ".join(f":obj:`kiln.{n}`" for n in shared)
        out.append(f"Also here, and documented as part of ``kiln``: {links}.\n")
    return "\n".join(out)


def _write_if_changed(path: Path, text: str) -> None:
    # Rewriting an unchanged file would make Sphinx rebuild every page on each run.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _case_safe_filenames() -> dict[str, str]:
    """Stub file names that differ only by case (kiln.tensor, kiln.Tensor) clash on macOS and Windows."""
    seen: dict[str, str] = {}
    renames = {}
    for name in sorted(_public_names(kiln)):
        full = f"kiln.{name}"
        if full.lower() in seen and name[:1].islower():
            renames[full] = f"{full}-function"
        seen.setdefault(full.lower(), full)
    return renames


autosummary_filename_map = _case_safe_filenames()

GENERATED.mkdir(parents=True, exist_ok=True)
_write_if_changed(GENERATED / "kiln.rst", _kiln_page())
for _modname in ("kiln.autograd", "kiln.plugins"):
    _summary = (inspect.getdoc(importlib.import_module(_modname)) or "").splitlines()[0]
    _write_if_changed(GENERATED / f"{_modname}.rst", _module_page(_modname, _summary.removeprefix(f"{_modname}: ")))
