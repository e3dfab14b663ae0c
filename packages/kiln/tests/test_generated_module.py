"""``kiln.backend.generated_module``: generated source written once, by hash, and run as a module; a cache
file that differs from the source (cut short, or planted in a shared cache folder) is never what runs."""

from __future__ import annotations

import hashlib

import kiln.backend as kb


def _path(tmp_path, text):
    return tmp_path / f"k_{hashlib.sha256(text.encode()).hexdigest()[:24]}.py"


def test_writes_once_and_runs_the_text(tmp_path):
    text = "value = 41 + 1\n"
    mod = kb.generated_module(text, tmp_path, "kiln_test_generated_a")
    assert mod.value == 42
    assert _path(tmp_path, text).read_text() == text
    assert kb.generated_module(text, tmp_path, "kiln_test_generated_a") is mod


def test_a_planted_or_cut_file_is_replaced_not_run(tmp_path):
    for planted in ("raise SystemExit('planted code ran')\n", "value = 4"):  # foreign code; a cut-short file
        text = f"value = {len(planted)}\n"
        path = _path(tmp_path, text)
        path.write_text(planted)
        want = len(planted)
        mod = kb.generated_module(text, tmp_path, f"kiln_test_generated_{want}")
        assert mod.value == want
        assert path.read_text() == text
