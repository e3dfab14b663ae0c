"""Sphinx configuration of the kiln documentation (one site for every kiln package).

Build it with ``python3 -m nox -s docs``: the HTML site with warnings as errors, then
``sphinx-build -b doctest``, which runs every example on every page. What is generated comes from the
live code when the docs are built, never from a list kept by hand:

* the API reference pages (``api/generated/``), from the public names of every package
  (:mod:`kilndocs.api`, which the unit tests also use to check docstrings and reference entries);
* the op coverage tables, probed from the op registry (:mod:`kilndocs.ops`);
* the benchmark tables, from ``benchmarks/results/*.json`` (:mod:`kilndocs.benchmarks`);
* the output of ``kiln doctor`` and ``kiln plugins`` shown in the guides.
"""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from kilndocs import api  # noqa: E402

import kiln  # noqa: E402

project = "kiln"
author = "kiln developers"
copyright = "kiln developers"  # noqa: A001 - Sphinx's setting name
release = kiln.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "kilndocs.sphinxext",
]
templates_path = ["_templates"]
exclude_patterns = ["_build", "_ext", "examples"]
html_theme = "furo"  # with its search box in the sidebar
html_title = f"kiln {release}"
html_static_path = ["_static"]
html_css_files = ["kiln.css"]
default_role = "code"  # `x` in a docstring is inline code, as in PyTorch's docs

autosummary_generate = True
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

# -------------------------------------------------------------------------------------------- doctest
# Every example is a doctest (>>>) or a testcode/testoutput pair, run by `sphinx-build -b doctest`.
# Each page's default group shares one namespace, so a page reads as one session from top to bottom.
# docs/examples/ is importable, so a page can run the example scripts it shows.
doctest_global_setup = f"""
import sys
import kiln
if {str(HERE / "examples")!r} not in sys.path:
    sys.path.insert(0, {str(HERE / "examples")!r})
"""
# Exception messages are compared in full: the docs quote PyTorch-compatible error messages.
doctest_default_flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
doctest_test_doctest_blocks = "default"

# ----------------------------------------------------------------------------------- the API reference
# Written before Sphinx reads the sources (autosummary then makes one stub page per name). Files whose
# text did not change are left alone.
api.write_reference_pages()
autosummary_filename_map = api.case_safe_filenames()
