"""The package as a plugin: the entry point, the namespace, docstrings on every public name."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points

import pytest

import kiln
import kiln.plugins

MODULES = ["kiln.data", "kiln.data.datasets", "kiln.data.transforms", "kiln.data.sampler", "kiln.data.dataset"]


def test_entry_point_and_extension():
    eps = [ep for ep in entry_points(group="kiln") if ep.name == "data"]
    assert eps and eps[0].value == "kiln_data.plugin"
    ext = kiln.plugins.extensions()["data"]
    assert ext["version"] == "0.1.0" and ext["module"] == "kiln.data"


def test_namespace_has_no_init_at_kiln_level():
    import kiln.data

    assert kiln.data.__file__.endswith("data/__init__.py")
    assert kiln.__file__ != kiln.data.__file__


@pytest.mark.parametrize("modname", MODULES)
def test_every_public_name_has_a_docstring(modname):
    mod = importlib.import_module(modname)
    assert mod.__doc__
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (
                    inspect.isfunction(member) or isinstance(member, property | staticmethod)
                ):
                    continue
                fn = member.__func__ if isinstance(member, staticmethod) else member
                if not inspect.getdoc(fn):
                    missing.append(f"{name}.{attr}")
    assert not missing, missing
