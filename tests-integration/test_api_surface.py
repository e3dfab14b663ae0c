"""kiln covers PyTorch's API surface: every public name of the namespaces PyTorch programs touch is in
kiln, or listed as left out with its reason (docs/_ext/kilndocs/surface.py, the one list), and the
signatures match where both can be read.

PyTorch is the oracle: the names come from the installed torch, so a new PyTorch release that adds a
name shows up here as missing until kiln has it or lists it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("kiln.nn")
pytest.importorskip("kiln.utils.data")

DOCS_EXT = Path(__file__).resolve().parents[1] / "docs" / "_ext"


@pytest.fixture(scope="module")
def surface():
    sys.path.insert(0, str(DOCS_EXT))
    try:
        return importlib.import_module("kilndocs.surface")
    finally:
        sys.path.remove(str(DOCS_EXT))


@pytest.fixture(scope="module")
def rows(surface):
    return surface.survey()


def test_no_name_is_missing(surface, rows):
    missing = {ns: [r.name for r in rs if r.status == "missing"] for ns, rs in rows.items()}
    missing = {ns: names for ns, names in missing.items() if names}
    assert not missing, f"PyTorch names kiln neither has nor lists in LEFT_OUT: {missing}"


def test_signatures_match(surface, rows):
    """Every signature matches PyTorch's, or its difference is explained in SIGNATURE_NOTES."""
    differs = {
        f"{ns}:{r.name}": r.detail
        for ns, rs in rows.items()
        for r in rs
        if r.status == "differs" and f"{ns}:{r.name}" not in surface.SIGNATURE_NOTES
    }
    assert not differs, f"signatures that differ from PyTorch's: {differs}"


def test_signature_notes_are_current(surface, rows):
    """A note whose name now matches (or is gone) must leave SIGNATURE_NOTES."""
    status = {f"{ns}:{r.name}": r.status for ns, rs in rows.items() for r in rs}
    stale = [key for key in surface.SIGNATURE_NOTES if status.get(key) != "differs"]
    assert not stale, f"SIGNATURE_NOTES entries that no longer differ: {stale}"


def test_left_out_names_are_really_absent(surface, rows):
    """A name kiln has since built must leave the LEFT_OUT list (its reason would be false)."""
    stale = []
    for ns, kns in surface.NAMESPACES:
        ours = surface._resolve(kns)
        for r in rows[ns]:
            if surface.left_out(ns, r.name) and getattr(ours, r.name, None) is not None:
                stale.append(f"{ns}.{r.name}")
    assert not stale, f"listed as left out but present in kiln: {stale}"


def test_every_left_out_pattern_matches_a_name(surface, rows):
    """Each LEFT_OUT entry still matches some PyTorch name (a dead entry would hide nothing, or a typo)."""
    keys = [f"{ns}:{r.name}" for ns, rs in rows.items() for r in rs]
    import re

    dead = [p for p, _ in surface.LEFT_OUT if not any(re.match(p, k) for k in keys)]
    assert not dead, f"LEFT_OUT patterns that match no PyTorch name: {dead}"


def test_compare_is_strict(surface):
    """The signature check itself: it catches renamed, reordered, re-kinded and re-defaulted parameters."""
    t = [("input", "positional", ""), ("dim", "positional", "None"), ("keepdim", "keyword-only", "False")]
    assert surface.compare(t, t) == ""
    assert surface.compare(t, [("x", "positional", ""), *t[1:]]) == "no parameter 'input'"
    assert "position" in surface.compare(t, [t[1], t[0], t[2]])
    assert surface.compare(t, [t[0], t[1], ("keepdim", "positional", "False")]) == ""  # a superset of calls
    assert "keyword-only" in surface.compare(
        [*t[:2], ("keepdim", "positional", "False")], [t[0], t[1], ("keepdim", "keyword-only", "False")]
    )
    assert "defaults to True" in surface.compare(t, [t[0], t[1], ("keepdim", "keyword-only", "True")])
    assert surface.compare(t, [*t, ("extra", "keyword-only", "1")]) == ""
    assert "extra required" in surface.compare(t, [*t, ("extra", "keyword-only", "")])


def test_docstring_signatures_are_read(surface):
    import torch

    sigs = surface.signatures(torch.add, "add", method=False)
    assert sigs and [p[0] for p in sigs[0]][:2] == ["input", "other"]
