"""The compilers hook is marked provisional, in its docstring (the API reference renders it) and in the
architecture page's plugin section, until its first reader lands. The modes hook is settled (kiln-amp's
autocast reads it), and so is the collectives hook (kiln-distributed's process groups read it)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kiln import hookspecs

PROVISIONAL = {
    "kiln_register_compilers": "kiln-compile",
}


@pytest.mark.parametrize(("hook", "package"), sorted(PROVISIONAL.items()))
def test_the_hook_docstring_says_provisional(hook, package):
    doc = inspect.getdoc(getattr(hookspecs, hook))
    assert ".. note::" in doc and "Provisional" in doc
    assert f"may change when {package} lands" in doc


def test_the_settled_hooks_are_not_marked():
    for name in (
        "kiln_register_devices",
        "kiln_register_kernels",
        "kiln_register_fused_updates",
        "kiln_register_modes",
        "kiln_register_collectives",
    ):
        assert "rovisional" not in inspect.getdoc(getattr(hookspecs, name))


def test_the_architecture_page_has_the_note():
    page = Path(__file__).resolve().parents[3] / "docs" / "architecture.rst"
    if not page.is_file():
        pytest.skip("not a checkout of the kiln repository")
    text = page.read_text(encoding="utf-8")
    note = text[text.index(".. note::") :].split("\n\n", 2)[1]
    assert "provisional" in note
    for hook, package in PROVISIONAL.items():
        assert hook in note and package in note
