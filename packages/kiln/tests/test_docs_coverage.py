"""Every public name has a docstring and an entry in the API reference of the docs.

The public names are ``__all__`` of ``kiln``, ``kiln.autograd``, ``kiln.random``, ``kiln.plugins``,
the hooks and markers of ``kiln.hookspecs``, and every public attribute of ``kiln.Tensor`` (plus the
public modules of any other package of the checkout that is installed here). Both the names and the
reference pages come from ``docs/_ext/kilndocs/api.py``, the module the docs build uses to generate the
reference, so this test needs kiln but not Sphinx. Handwritten pages under ``docs/`` count as entries
too.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.fixture(scope="module")
def api():
    """``kilndocs.api`` from the docs of this checkout."""
    ext = DOCS / "_ext"
    if not (ext / "kilndocs" / "api.py").is_file():
        pytest.skip("no docs/_ext/kilndocs beside this package (not a checkout of the kiln repository)")
    sys.path.insert(0, str(ext))
    try:
        return importlib.import_module("kilndocs.api")
    finally:
        sys.path.remove(str(ext))


@pytest.fixture(scope="module")
def modules(api):
    """The documented modules that import here: other packages may not be installed in this session."""
    found = [m for m in api.documented_modules() if api.importable(m)]
    assert "kiln" in found
    return found


def _listing(names: list[str]) -> str:
    return "\n  ".join(names)


def test_the_public_surface_is_enumerated(api, modules):
    names = api.public_api(modules)
    for expected in (
        "kiln.add",
        "kiln.Tensor",
        "kiln.float32",
        "kiln.Tensor.add",
        "kiln.Tensor.backward",
        "kiln.Tensor.shape",
        "kiln.Tensor.grad",
        "kiln.autograd.grad",
        "kiln.autograd.Function",
        "kiln.random.manual_seed",
        "kiln.plugins.op_coverage",
        "kiln.hookspecs.kiln_register_kernels",
        "kiln.hookspecs.hookimpl",
    ):
        assert expected in names, f"{expected} is missing from the public names the docs enumerate"
    for modname in ("kiln", "kiln.autograd", "kiln.random", "kiln.plugins"):
        module = importlib.import_module(modname)
        for n in getattr(module, "__all__", ()):
            assert f"{modname}.{n}" in names, f"{modname}.{n} is in __all__ but not enumerated"


def test_every_public_name_has_a_docstring(api, modules):
    missing = api.missing_docstrings(modules)
    assert not missing, f"{len(missing)} public names have no docstring:\n  {_listing(missing)}"


def test_every_public_name_has_a_reference_entry(api, modules):
    missing = api.missing_reference_entries(modules)
    assert not missing, f"{len(missing)} public names have no entry in the API reference:\n  {_listing(missing)}"


def test_reference_entries_are_read_from_the_pages(api, modules):
    # The check above is only as good as the parser: it must see autosummary rows, auto* directives
    # relative to currentmodule, and py:data entries.
    entries = api.reference_entries(api.reference_pages(modules).values())
    for expected in ("kiln", "kiln.add", "kiln.Tensor", "kiln.Tensor.add", "kiln.float32", "kiln.autograd.grad"):
        assert expected in entries
    assert "kiln.no_such_name" not in entries


def test_packages_of_the_checkout_are_installed_or_skipped(api, modules):
    absent = [m for m in api.documented_modules() if m not in modules]
    if absent:
        pytest.skip(f"not installed in this environment, so not checked here: {', '.join(absent)}")
