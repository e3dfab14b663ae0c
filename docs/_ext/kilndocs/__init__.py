"""Build-time helpers of the kiln documentation.

Everything here but :mod:`kilndocs.sphinxext` is plain Python that imports kiln and not Sphinx, so the
unit tests (``packages/kiln/tests/test_docs_coverage.py``) can use it without Sphinx installed:

* :mod:`kilndocs.packages` -- which kiln distributions exist and where their guides are;
* :mod:`kilndocs.api` -- the public names of every package and the API reference pages;
* :mod:`kilndocs.ops` -- the op coverage tables, probed from the live op registry;
* :mod:`kilndocs.benchmarks` -- the benchmarks page, from ``benchmarks/results/*.json``;
* :mod:`kilndocs.sphinxext` -- the Sphinx extension: directives for the generated content and the
  check that every Python example in the docs is executed.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2]
"""The ``docs/`` directory."""
ROOT = DOCS.parent
"""The repository root."""
