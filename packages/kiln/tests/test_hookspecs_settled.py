"""No hook is provisional any more: each has its reader (the compilers hook, kiln-compile's ``kiln.compile``;
the modes hook, kiln-amp's autocast; the collectives hook, kiln-distributed's process groups), so neither
the hook docstrings (the API reference renders them) nor the architecture page's plugin section may say
otherwise."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kiln import hookspecs

HOOKS = [name for name in dir(hookspecs) if name.startswith("kiln_register_")]


@pytest.mark.parametrize("hook", HOOKS)
def test_no_hook_docstring_says_provisional(hook):
    assert "rovisional" not in inspect.getdoc(getattr(hookspecs, hook))


def test_the_architecture_page_calls_no_hook_provisional():
    page = Path(__file__).resolve().parents[3] / "docs" / "architecture.rst"
    if not page.is_file():
        pytest.skip("not a checkout of the kiln repository")
    text = page.read_text(encoding="utf-8")
    section = text[text.index("There is one entry-point group") : text.index("Loading is **lazy**")]
    assert "rovisional" not in section
    assert len(HOOKS) == 8
