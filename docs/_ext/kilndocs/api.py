"""The API reference: which names are public, and the pages that document them.

The public surface of a package is the ``__all__`` of each module listed for it in
:data:`kilndocs.packages.PACKAGES` (for a module without ``__all__``, the
names it defines itself), plus every public attribute of :class:`kiln.Tensor`. :func:`reference_pages`
turns that surface into reStructuredText (autosummary tables, ``automethod`` entries, ``py:data`` entries) that ``conf.py``
writes under ``docs/api/generated/`` before Sphinx reads the sources; a new public op thus shows up
in the reference without anyone editing an index.

:func:`missing_docstrings` and :func:`missing_reference_entries` are what the unit test
``packages/kiln/tests/test_docs_coverage.py`` asserts empty. They need kiln, not Sphinx.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from collections.abc import Iterable
from pathlib import Path

import kiln
from kilndocs import DOCS, packages

GENERATED = "api/generated"
"""Where the generated pages go, relative to ``docs/`` (ignored by git)."""

# Defining module -> section of the ``kiln`` page (and of the ``kiln.Tensor`` page), in page order. A
# name from a module not listed here lands in "Other", so nothing public is ever left out.
SECTIONS: list[tuple[str, tuple[str, ...], str]] = [
    ("Tensors", ("kiln._tensor",), "The tensor type and its shape type."),
    (
        "Creation",
        ("kiln._ops.creation", "kiln._ops.random_ops", "kiln._ops.factories", "kiln._ops.windows"),
        "New tensors from data, shapes, ranges and random draws.",
    ),
    (
        "Elementwise math and comparisons",
        (
            "kiln._ops.elementwise",
            "kiln._ops.unary_math",
            "kiln._ops.special",
            "kiln._ops.binary_math",
            "kiln._ops.clamp",
            "kiln._ops.ternary_math",
        ),
        "Broadcasting elementwise ops.",
    ),
    ("Reductions", ("kiln._ops.reduction",), "Reductions over all elements or over dimensions."),
    ("Linear algebra", ("kiln._ops.linalg",), "Matrix products."),
    (
        "Shapes and views",
        (
            "kiln._ops.views",
            "kiln._ops.strided",
            "kiln._ops.copy",
            "kiln._ops.views_more",
            "kiln._ops.joining",
            "kiln._ops.splitting",
            "kiln._ops.scatter_views",
            "kiln._ops.view_copies",
            "kiln._ops.index_writes",
        ),
        "Views share their input's storage; ``clone`` and ``contiguous`` copy.",
    ),
    ("Types and promotion", ("kiln._dtype", "kiln._ops._meta"), "dtypes, the default dtype, type promotion."),
    ("Devices", ("kiln._device",), "Device objects (``kiln.device('cpu')``, ``'cuda:1'``)."),
    ("Random numbers", ("kiln.random",), "Seeding and generators."),
    ("Gradient modes", ("kiln.autograd.grad_mode",), "Turn gradient recording off and on."),
    ("Utilities", ("kiln",), "Small helpers on tensors and dtypes."),
]

# Methods of Tensor defined outside the ops (kiln._tensor, kiln._pinned), by topic (the rest come from ops).
TENSOR_AUTOGRAD = {
    "backward",
    "detach",
    "detach_",
    "register_hook",
    "requires_grad_",
    "retain_grad",
    "grad",
    "grad_fn",
    "requires_grad",
    "is_leaf",
    "retains_grad",
    "data",
}
TENSOR_CONVERSION = {
    "to",
    "cpu",
    "cuda",
    "numpy",
    "tolist",
    "item",
    "type",
    "float",
    "double",
    "half",
    "bfloat16",
    "int",
    "long",
    "short",
    "bool",
    "byte",
    "char",
    "resolve_conj",
    "resolve_neg",
    "pin_memory",
    "is_pinned",
}
TENSOR_VIEWS = {"T", "mT"}

# Python syntax -> the dunder that implements it, for the operator table of the Tensor page.
OPERATORS: list[tuple[str, str]] = [
    ("a + b", "__add__"),
    ("b + a (b a number)", "__radd__"),
    ("a - b", "__sub__"),
    ("b - a (b a number)", "__rsub__"),
    ("a * b", "__mul__"),
    ("b * a (b a number)", "__rmul__"),
    ("a / b", "__truediv__"),
    ("b / a (b a number)", "__rtruediv__"),
    ("a // b", "__floordiv__"),
    ("b // a (b a number)", "__rfloordiv__"),
    ("a ** b", "__pow__"),
    ("b ** a (b a number)", "__rpow__"),
    ("a @ b", "__matmul__"),
    ("-a", "__neg__"),
    ("abs(a)", "__abs__"),
    ("~a", "__invert__"),
    ("a & b", "__and__"),
    ("a | b", "__or__"),
    ("a ^ b", "__xor__"),
    ("a == b", "__eq__"),
    ("a != b", "__ne__"),
    ("a < b", "__lt__"),
    ("a <= b", "__le__"),
    ("a > b", "__gt__"),
    ("a >= b", "__ge__"),
    ("a += b", "__iadd__"),
    ("a -= b", "__isub__"),
    ("a *= b", "__imul__"),
    ("a /= b", "__itruediv__"),
    ("a **= b", "__ipow__"),
    ("a &= b", "__iand__"),
    ("a |= b", "__ior__"),
    ("a ^= b", "__ixor__"),
    ("a[index]", "__getitem__"),
    ("a[index] = value", "__setitem__"),
    ("len(a)", "__len__"),
    ("iter(a)", "__iter__"),
    ("bool(a)", "__bool__"),
    ("float(a), int(a)", "__float__"),
    ("operator.index(a)", "__index__"),
    ("numpy.asarray(a)", "__array__"),
    ("DLPack export (``numpy.from_dlpack(a)``, ``torch.from_dlpack(a)``)", "__dlpack__"),
    ("pickle, copy.deepcopy", "__reduce_ex__"),
]

# ------------------------------------------------------------------------------------- public names


def _is_data(obj: object) -> bool:
    """A public object that is neither a class, a routine nor a module (dtypes, markers, formats)."""
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, types.ModuleType))


def module_public_names(modname: str) -> list[str]:
    """The public names of a module: its ``__all__``, else the non-module names it defines itself."""
    module = importlib.import_module(modname)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and not isinstance(v, types.ModuleType)
            and not (inspect.isroutine(v) and getattr(v, "__module__", modname) != modname)
            and not (inspect.isclass(v) and v.__module__ != modname)
            and type(v).__name__ != "_Feature"  # `from __future__ import annotations`
        ]
    return sorted(dict.fromkeys(names), key=str.lower)


# Modules whose page shows their whole docstring (an overview that the names alone do not give), not only
# its first paragraph.
FULL_DOCSTRING = frozenset({"kiln.backend"})


def documented_modules() -> list[str]:
    """Every public module of every package in this checkout, in page order."""
    return [m for p in packages.available() for m in p.modules]


def importable(modname: str) -> bool:
    """Whether ``modname`` imports here (a package of the checkout may not be installed)."""
    try:
        importlib.import_module(modname)
    except ImportError:
        return False
    return True


def _modules(modules: list[str] | None) -> list[str]:
    """``modules``, or every documented module; those that do not import are an error naming the fix."""
    if modules is not None:
        return modules
    missing = [m for m in documented_modules() if not importable(m)]
    if missing:
        raise ImportError(
            f"cannot import {', '.join(missing)}: install every package of packages/ where the docs are built "
            "(the docs session of noxfile.py)"
        )
    return documented_modules()


def tensor_members() -> list[str]:
    """Public attributes of :class:`kiln.Tensor` (methods, properties, slots), sorted."""
    return sorted((n for n in dir(kiln.Tensor) if not n.startswith("_")), key=str.lower)


def public_api(modules: list[str] | None = None) -> dict[str, object]:
    """Fully qualified public name -> object, over ``modules`` (default: every documented module) and
    ``kiln.Tensor``."""
    out: dict[str, object] = {}
    for modname in _modules(modules):
        module = importlib.import_module(modname)
        out[modname] = module
        for n in module_public_names(modname):
            out[f"{modname}.{n}"] = getattr(module, n)
    for n in tensor_members():
        out[f"kiln.Tensor.{n}"] = inspect.getattr_static(kiln.Tensor, n)
    return out


def docstring(obj: object) -> str:
    """The docstring that documents ``obj`` (for data objects: their type's), stripped.

    ``__doc__`` is read directly rather than through :func:`inspect.getdoc`, which would hand a class
    without a docstring its base class's docstring.
    """
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        doc = obj.__doc__ or (obj.fget.__doc__ if obj.fget else None)
    elif isinstance(obj, (types.MemberDescriptorType, types.GetSetDescriptorType)):
        doc = inspect.getdoc(obj)  # a slot's docstring is the value in a dict ``__slots__``
    elif _is_data(obj):
        doc = type(obj).__doc__
    else:
        doc = getattr(obj, "__doc__", None)
    return (doc or "").strip()


# Values of these types document nothing by their type's docstring: a public constant needs an
# attribute docstring (a string literal right after the assignment) or a ``#:`` comment above it.
_PLAIN_VALUES = (int, float, complex, str, bytes, bool, tuple, list, dict, set, frozenset, type(None))


def attribute_doc(modname: str, name: str, follow_imports: bool = True) -> str:
    """The attribute docstring or ``#:`` comment of ``modname.name`` in its source (as autodoc reads them).

    A constant that ``modname`` imports (``from kiln._dispatch import TAGS`` in ``kiln.backend``) is
    documented where it is defined: unless ``follow_imports`` is false, the import is followed.
    """
    try:
        source = inspect.getsource(importlib.import_module(modname))
    except (OSError, TypeError):
        return ""
    lines = source.splitlines()
    body = ast.parse(source).body
    if follow_imports:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return attribute_doc(node.module, alias.name)
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            return after.value.value.strip()
        comments = []
        j = node.lineno - 2
        while j >= 0 and lines[j].lstrip().startswith("#:"):
            comments.insert(0, lines[j].lstrip()[2:].strip())
            j -= 1
        return " ".join(comments)
    return ""


def docstring_of(qualname: str, obj: object) -> str:
    """:func:`docstring`, or for a plain value (a tuple, a string) its attribute docstring in the source."""
    if isinstance(obj, _PLAIN_VALUES):
        modname, _, name = qualname.rpartition(".")
        return attribute_doc(modname, name)
    return docstring(obj)


def missing_docstrings(modules: list[str] | None = None) -> list[str]:
    """Public names without a docstring."""
    return [name for name, obj in public_api(modules).items() if not docstring_of(name, obj)]


# ------------------------------------------------------------------------------------------ pages


def _underline(title: str, char: str) -> str:
    return f"{title}\n{char * len(title)}\n"


def _autosummary(names: list[str], toctree: bool = True) -> str:
    """A summary table of ``names`` (relative to the current module), with one stub page each."""
    lines = [".. autosummary::"]
    if toctree:
        lines.append("   :toctree: .")
    lines += ["   :nosignatures:", ""]
    lines += [f"   {n}" for n in names]
    return "\n".join(lines) + "\n"


def _canonical_names(modules: list[str]) -> dict[int, str]:
    """id(object) -> the one name under which the reference documents it (the first module wins)."""
    canonical: dict[int, str] = {}
    for modname in modules:
        module = importlib.import_module(modname)
        for n in module_public_names(modname):
            obj = getattr(module, n)
            if not isinstance(obj, (int, float, str, bytes, type(None))):
                canonical.setdefault(id(obj), f"{modname}.{n}")
    return canonical


def _dtype_entries(names: list[str]) -> str:
    """``py:data`` entries for the dtype objects (``kiln.float32``) and their aliases (``kiln.float``)."""
    canonical = {}
    for n in names:
        d = getattr(kiln, n)
        if str(d).removeprefix("kiln.") == n:
            canonical[d] = n
    out = []
    order = sorted(
        {getattr(kiln, n) for n in names},
        key=lambda d: (d.is_floating_point, str(d) != "kiln.bool", d.itemsize, d.is_signed, str(d)),
    )
    for d in order:
        name = canonical.get(d, str(d).removeprefix("kiln."))
        aliases = sorted(n for n in names if getattr(kiln, n) is d and n != name)
        if d.is_floating_point:
            kind = "floating point"
        else:
            kind = "boolean" if name == "bool" else ("signed integer" if d.is_signed else "unsigned integer")
        text = f"{kind}, {d.itemsize} byte{'s' if d.itemsize > 1 else ''} per element"
        if d is kiln.get_default_dtype():
            text += "; the default floating point dtype"
        if aliases:
            text += "; also " + ", ".join(f"``kiln.{a}``" for a in aliases)
        out.append(f".. py:data:: {name}\n   :type: kiln.dtype\n\n   A :class:`kiln.dtype`: {text}.\n")
        out += [f".. py:data:: {a}\n   :type: kiln.dtype\n\n   Alias of :data:`kiln.{name}`.\n" for a in aliases]
    return "\n".join(out)


def _data_entries(module: types.ModuleType, names: list[str]) -> str:
    """``py:data`` entries for public objects that are instances (memory formats, pluggy markers)."""
    out = []
    for n in names:
        obj = getattr(module, n)
        if isinstance(obj, _PLAIN_VALUES):
            if attribute_doc(module.__name__, n, follow_imports=False):
                # a constant defined here: autodoc shows its value and attribute docstring
                out.append(f".. autodata:: {n}\n")
            else:  # imported from the module that defines it (autodoc would not find its docstring)
                doc = attribute_doc(module.__name__, n).replace("\n", "\n   ")
                out.append(f".. py:data:: {n}\n   :type: {type(obj).__name__}\n\n   {doc}\n")
            continue
        cls = type(obj)
        top = cls.__module__.split(".")[0]
        if getattr(kiln, cls.__name__, None) is cls:
            what = f":class:`kiln.{cls.__name__}`"
        elif getattr(importlib.import_module(top), cls.__name__, None) is cls:  # pluggy.HookimplMarker
            what = f"``{top}.{cls.__name__}``"
        else:
            what = f"``{cls.__module__}.{cls.__qualname__}``"
        first = docstring(obj).split("\n\n")[0].replace("\n", " ")
        out.append(f".. py:data:: {n}\n\n   An instance of {what}. {first}\n")
    return "\n".join(out)


def kiln_page() -> str:
    """``kiln.rst``: every public name of ``kiln``, grouped by the module that defines it."""
    groups: dict[str, list[str]] = {}
    data: dict[str, list[str]] = {}
    dtypes: list[str] = []
    for name in module_public_names("kiln"):
        obj = getattr(kiln, name)
        if isinstance(obj, types.ModuleType):
            continue  # submodules have their own pages
        if isinstance(obj, kiln.dtype):
            dtypes.append(name)
            continue
        module = getattr(obj, "__module__", None) or "kiln"
        if _is_data(obj):
            data.setdefault(type(obj).__module__, []).append(name)
        else:
            groups.setdefault(module, []).append(name)
    out = [_underline("kiln", "="), ".. module:: kiln\n", ".. currentmodule:: kiln\n"]
    out.append(
        "Everything ``import kiln`` exports, grouped by topic. Names and signatures follow PyTorch's. "
        "The methods of tensors are on the :doc:`kiln.Tensor <tensor>` page.\n"
    )
    placed: set[str] = set()
    for title, modules, blurb in SECTIONS:
        names = sorted((n for m in modules for n in groups.get(m, [])), key=str.lower)
        entries = sorted((n for m in modules for n in data.get(m, [])), key=str.lower)
        placed.update(modules)
        if not (names or entries or (title.startswith("Types") and dtypes)):
            continue
        out += [_underline(title, "-"), blurb + "\n"]
        if "Tensor" in names:  # documented on its own page (tensor.rst), with every method
            names.remove("Tensor")
            out.append(_autosummary(["Tensor"], toctree=False))
        if names:
            out.append(_autosummary(names))
        if entries:
            out.append(_data_entries(kiln, entries))
        if title.startswith("Types") and dtypes:
            out += [_underline("dtype objects", "^"), _dtype_entries(dtypes)]
    rest = sorted((n for m, ns in groups.items() if m not in placed for n in ns), key=str.lower)
    rest_data = sorted((n for m, ns in data.items() if m not in placed for n in ns), key=str.lower)
    if rest or rest_data:
        out.append(_underline("Other", "-"))
        if rest:
            out.append(_autosummary(rest))
        if rest_data:
            out.append(_data_entries(kiln, rest_data))
    return "\n".join(out)


def _tensor_section(name: str) -> str:
    """The section of the Tensor page for one public attribute."""
    static = inspect.getattr_static(kiln.Tensor, name)
    if name in TENSOR_AUTOGRAD:
        return "Autograd"
    if name in TENSOR_VIEWS:
        return "Shapes and views"
    if isinstance(static, (property, types.MemberDescriptorType)):
        return "Attributes and metadata"
    module = getattr(static, "__module__", None)
    if name.startswith("new_"):
        return "Creation"
    if name in TENSOR_CONVERSION:
        return "Conversion, dtypes and devices"
    if module == "kiln._tensor":
        return "Attributes and metadata"
    if name.endswith("_"):
        return "In-place ops"
    for title, modules, _blurb in SECTIONS:
        if module in modules:
            return title
    return "Other"


def tensor_page() -> str:
    """``tensor.rst``: :class:`kiln.Tensor` with one entry per public method and attribute."""
    order = [
        "Attributes and metadata",
        "Conversion, dtypes and devices",
        "Creation",
        "Autograd",
        "Elementwise math and comparisons",
        "Reductions",
        "Linear algebra",
        "Shapes and views",
        "In-place ops",
        "Other",
    ]
    sections: dict[str, list[str]] = {t: [] for t in order}
    for name in tensor_members():
        sections.setdefault(_tensor_section(name), []).append(name)
    out = [_underline("kiln.Tensor", "="), ".. currentmodule:: kiln\n", ".. autoclass:: Tensor\n"]
    out.append(
        "Methods mirror ``torch.Tensor``: ``t.add(u)`` is :func:`kiln.add` with ``t`` as ``input``. A method "
        "whose name ends in ``_`` works in place and returns its tensor. Every method and attribute is listed "
        "below by topic, then the operators.\n"
    )
    for title in order:
        names = sections.get(title)
        if not names:
            continue
        out.append(_underline(title, "-"))
        for name in names:
            static = inspect.getattr_static(kiln.Tensor, name)
            if isinstance(static, property):
                directive = "autoproperty"
            elif isinstance(static, types.MemberDescriptorType) or _is_data(static):
                directive = "autoattribute"
            else:
                directive = "automethod"
            out.append(f".. {directive}:: Tensor.{name}\n")
    out.append(_operator_table())
    return "\n".join(out)


def _operator_table() -> str:
    """Python operators on tensors and the method each one is."""
    members = {n: inspect.getattr_static(kiln.Tensor, n) for n in tensor_members()}
    rows = []
    for syntax, dunder in OPERATORS:
        if dunder not in vars(kiln.Tensor):
            continue
        fn = vars(kiln.Tensor)[dunder]
        same = [n for n, m in members.items() if m is fn]
        target = ", ".join(f":meth:`Tensor.{n}`" for n in same[:2]) or "—"
        rows.append(f"   * - ``{syntax}``\n     - ``{dunder}``\n     - {target}")
    head = (
        _underline("Operators", "-")
        + "\nPython's operators call these methods; where an operator is the very same function as a public "
        "method, the method is named.\n\n.. list-table::\n   :header-rows: 1\n\n"
        "   * - expression\n     - method\n     - same as\n"
    )
    return head + "\n".join(rows) + "\n"


def module_page(modname: str, canonical: dict[int, str]) -> str:
    """A page for a public submodule (``kiln.autograd``): its docstring's summary and its public names.

    Names whose object another module documents (``kiln.autograd.no_grad`` is ``kiln.no_grad``) are
    linked, not documented twice: two descriptions of one object make Sphinx report a duplicate.
    """
    module = importlib.import_module(modname)
    names = module_public_names(modname)
    shared = [n for n in names if canonical.get(id(getattr(module, n)), f"{modname}.{n}") != f"{modname}.{n}"]
    own = [n for n in names if n not in shared]
    doc = inspect.getdoc(module) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ").removeprefix(f"{modname}: ").removeprefix(f"``{modname}``: ")
    summary = summary[:1].upper() + summary[1:]
    out = [_underline(modname, "="), f".. module:: {modname}\n", f".. currentmodule:: {modname}\n", summary + "\n"]
    if modname in FULL_DOCSTRING:
        rest = "\n\n".join(doc.split("\n\n")[1:])
        if rest:
            out.append(rest + "\n")
    if modname == "kiln.hookspecs":
        out.append(_hookspecs_body(module, own))
    else:
        submodules = [n for n in own if isinstance(getattr(module, n), types.ModuleType)]
        routines = [n for n in own if n not in submodules and not _is_data(getattr(module, n))]
        data = [n for n in own if n not in submodules and _is_data(getattr(module, n))]
        if routines:
            out.append(_autosummary(routines))
        if data:
            out.append(_data_entries(module, data))
        if submodules:  # each documented on a page of its own
            out.append("Submodules: " + ", ".join(f":mod:`{modname}.{n}`" for n in submodules) + ".\n")
    if shared:
        links = ", ".join(f":obj:`{n} <{canonical[id(getattr(module, n))]}>`" for n in shared)
        out.append(f"Also here, and documented elsewhere in this reference: {links}.\n")
    return "\n".join(out)


def _hookspecs_body(module: types.ModuleType, names: list[str]) -> str:
    """The hooks in the order kiln calls them (source order), then the pluggy markers."""
    rest = "\n\n".join((inspect.getdoc(module) or "").split("\n\n")[1:])
    hooks = [n for n, v in vars(module).items() if n in names and inspect.isfunction(v)]
    markers = [n for n in names if n not in hooks]
    out = [rest + "\n"] if rest else []
    out.append(
        "The hooks, in the order kiln runs them: each hook for every plugin before the next hook, the "
        "built-in reference backend last.\n"
    )
    out += [f".. autofunction:: {h}\n" for h in hooks]
    if markers:
        out.append(
            "A plugin may decorate its hook functions with the marker ``hookimpl`` (also reachable as "
            "``kiln.hookimpl`` and ``kiln.plugins.hookimpl``); plain functions named ``kiln_register_*`` "
            "are recognised without it.\n"
        )
        out.append(_data_entries(module, markers))
    return "\n".join(out)


def reference_pages(modules: list[str] | None = None) -> dict[str, str]:
    """docs-relative path -> reStructuredText of the generated API pages of ``modules`` (default: all)."""
    modules = _modules(modules)
    canonical = _canonical_names(modules)
    pages = {}
    if "kiln" in modules:
        pages = {f"{GENERATED}/kiln.rst": kiln_page(), f"{GENERATED}/tensor.rst": tensor_page()}
    for modname in modules:
        if modname != "kiln":
            pages[f"{GENERATED}/{modname}.rst"] = module_page(modname, canonical)
    return pages


def toctree_include(pages: dict[str, str]) -> str:
    """``api/generated/packages.inc``: the reference pages, one toctree per package, for ``api/index.rst``."""
    out = []
    for p in packages.available():
        docs = []
        for modname in p.modules:
            if modname == "kiln":
                docs += ["kiln", "tensor"]
            elif f"{GENERATED}/{modname}.rst" in pages:
                docs.append(modname)
        if not docs:
            continue
        title = f"``{p.distribution}``"
        out.append(f"{title}\n{'-' * len(title)}\n\n{p.summary} Guide: :doc:`/{packages.guide(p.distribution)}`.\n")
        out.append(".. toctree::\n   :maxdepth: 1\n\n" + "".join(f"   generated/{d}\n" for d in docs))
    return "\n".join(out)


def write_reference_pages() -> list[str]:
    """Write :func:`reference_pages` and their toctrees (only files whose text changed); return the
    docnames."""
    pages = reference_pages()
    _write(DOCS / GENERATED / "packages.inc", toctree_include(pages))
    docnames = []
    for rel, text in pages.items():
        _write(DOCS / rel, text)
        docnames.append(rel.removesuffix(".rst"))
    return docnames


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:  # an unchanged file keeps its mtime
        path.write_text(text)


def case_safe_filenames() -> dict[str, str]:
    """Stub file names that differ only by case (``kiln.tensor``, ``kiln.Tensor``) clash on macOS/Windows."""
    seen: dict[str, str] = {}
    renames = {}
    for modname in _modules(None):
        for name in module_public_names(modname):
            full = f"{modname}.{name}"
            if full.lower() in seen and name[:1].islower():
                renames[full] = f"{full}-function"
            seen.setdefault(full.lower(), full)
    return renames


# ------------------------------------------------------------------------------ reference entries

_DIRECTIVE = re.compile(
    r"^\s*\.\. (?:py:)?(auto)?(module|currentmodule|function|class|method|attribute|property|data|exception"
    r"|decorator)::\s*(\S+)"
)


def reference_entries(texts: Iterable[str]) -> set[str]:
    """Fully qualified names that reStructuredText ``texts`` document: autosummary rows, ``auto*`` and
    ``py:*`` object directives (relative names resolved against ``currentmodule``)."""
    entries: set[str] = set()
    for text in texts:
        current = ""
        in_summary = False
        for line in text.splitlines():
            if in_summary:
                if not line.strip() or line.lstrip().startswith(":"):
                    continue
                if line.startswith("   ") and not line.lstrip().startswith(".."):
                    name = line.strip()
                    entries.add(name if name.startswith(f"{current}.") or not current else f"{current}.{name}")
                    continue
                in_summary = False
            if line.strip().startswith(".. autosummary::"):
                in_summary = True
                continue
            m = _DIRECTIVE.match(line)
            if not m:
                continue
            kind, target = m.group(2), m.group(3)
            if kind in ("module", "currentmodule"):
                current = target
                if kind == "module":
                    entries.add(target)
                continue
            entries.add(target if not current or target.startswith(f"{current}.") else f"{current}.{target}")
    return entries


def handwritten_rst() -> list[Path]:
    """The docs' own ``.rst`` sources (not the build output, not the generated pages)."""
    skip = (DOCS / "_build", DOCS / GENERATED)
    return sorted(p for p in DOCS.rglob("*.rst") if not any(p.is_relative_to(s) for s in skip))


def _resolve(qualname: str) -> object | None:
    parts = qualname.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:]:
                obj = inspect.getattr_static(obj, p) if inspect.isclass(obj) else getattr(obj, p)
        except AttributeError:
            return None
        return obj
    return None


def missing_reference_entries(modules: list[str] | None = None) -> list[str]:
    """Public names with no entry in the API reference.

    A module-level name counts as documented when its own name has an entry or when the object is
    documented under another name (``kiln.autograd.no_grad`` as ``kiln.no_grad``, ``kiln.float`` as an
    alias entry); a ``Tensor`` attribute needs an entry of its own on the Tensor page.
    """
    texts = list(reference_pages(modules).values()) + [p.read_text() for p in handwritten_rst()]
    entries = reference_entries(texts)
    documented_ids = set()
    for e in entries:
        obj = _resolve(e)
        if obj is not None and not isinstance(obj, (int, float, str, bytes, bool, type(None))):
            documented_ids.add(id(obj))
    missing = []
    for name, obj in public_api(modules).items():
        if name in entries:
            continue
        if not name.startswith("kiln.Tensor.") and id(obj) in documented_ids:
            continue
        missing.append(name)
    return missing
