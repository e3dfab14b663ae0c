"""The kiln docs' Sphinx extension: generated content, and the rule that every example runs.

Directives (each renders reStructuredText computed while the page is read, so it is never stale):

``.. kiln-op-coverage::``  op x backend x dtype tables, probed from the live registry (:mod:`kilndocs.ops`)
``.. kiln-op-list::``      the public ops as one paragraph of links
``.. kiln-api-coverage::`` kiln's coverage of PyTorch's namespaces, with PyTorch as the oracle (:mod:`kilndocs.surface`)
``.. kiln-benchmarks::``   the latest ``benchmarks/results/*.json`` records (:mod:`kilndocs.benchmarks`)
``.. kiln-packages::``     the distributions of the design, each marked available or planned
``.. kiln-not-yet::``      which of the PyTorch names in its content kiln still lacks
``.. kiln-command:: kiln ARGS`` runs ``python -m kiln ARGS`` and shows the command and its output

Checks (warnings, so ``-W`` makes them errors):

* a Python code block that mentions kiln must be a ``doctest``/``testcode`` block (run by
  ``sphinx-build -b doctest``), and a ``literalinclude`` of a Python file under ``docs/`` must be run
  by a ``testcode``/``testsetup`` block of the same page that names the file (excerpts of package
  sources are run by their package's tests);
* every package in ``packages/`` needs a guide (:func:`kilndocs.packages.problems`).

The one-page-per-name API stubs that autosummary writes stay out of the site's navigation
(:func:`keep_stubs_out_of_navigation`): the theme renders the whole navigation tree into every page, and
with the ~730 stubs in it that took most of the HTML build (each page's tree rebuilt and re-parsed).
The package and module pages list every name in their tables, which link to the stubs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from kilndocs import DOCS, ROOT, api, benchmarks, ops, packages, surface

logger = logging.getLogger(__name__)

PYTHON_LANGUAGES = {"python", "python3", "py", "pycon", "ipython", "ipython3", "default"}
# What makes a block "kiln code": it imports kiln or calls into it (a file listing that merely names a
# kiln_* package is not code).
_KILN_CODE = re.compile(r"^\s*(import|from)\s+kiln\b|\bkiln\.[A-Za-z_]", re.MULTILINE)


class _GeneratedRst(SphinxDirective):
    """Base: parse the reStructuredText that :meth:`rst` returns, in place."""

    has_content = False

    def rst(self) -> str:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        return self.parse_text_to_nodes(self.rst(), allow_section_headings=True)


class OpCoverage(_GeneratedRst):
    """``.. kiln-op-coverage::``"""

    def rst(self) -> str:
        return ops.render()


class ApiCoverage(_GeneratedRst):
    """``.. kiln-api-coverage::``"""

    def rst(self) -> str:
        return surface.render()


class OpList(_GeneratedRst):
    """``.. kiln-op-list::``"""

    def rst(self) -> str:
        return ops.op_list()


class Benchmarks(_GeneratedRst):
    """``.. kiln-benchmarks::``"""

    def rst(self) -> str:
        return benchmarks.render()


class Packages(_GeneratedRst):
    """``.. kiln-packages::``: a table of every distribution, available or planned."""

    def rst(self) -> str:
        here = {p.distribution for p in packages.available()}
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "",
            "   * - distribution\n     - import\n     - what it provides\n     - status",
        ]
        for p in packages.PACKAGES:
            status = f":doc:`available </{packages.guide(p.distribution)}>`" if p.distribution in here else "planned"
            lines.append(f"   * - ``{p.distribution}``\n     - {p.imports}\n     - {p.summary}\n     - {status}")
        return "\n".join(lines) + "\n"


class NotYet(_GeneratedRst):
    """``.. kiln-not-yet::`` with PyTorch names as content (``cat``, ``Tensor.masked_fill``, ``nn``):
    the ones kiln lacks when the docs are built, as a comma-separated list. Names that have arrived
    drop out by themselves, so the page never claims a gap that is gone."""

    has_content = True

    def rst(self) -> str:
        missing = [n for line in self.content for n in line.split() if not _kiln_has(n)]
        if not missing:
            return "(Every name this list once held has arrived in kiln.)\n"
        return ", ".join(f"``{n}``" for n in missing) + ".\n"


def _kiln_has(name: str) -> bool:
    """Whether ``kiln.<name>`` exists: an attribute, a ``Tensor`` attribute or a submodule."""
    import importlib.util

    import kiln

    if name.startswith("Tensor."):
        return hasattr(kiln.Tensor, name.removeprefix("Tensor."))
    try:
        if importlib.util.find_spec(f"kiln.{name}") is not None:
            return True
    except ImportError:
        pass
    return name in getattr(kiln, "__all__", ()) or hasattr(kiln, name)


_PYTEST_PROGRESS = re.compile(r"^[.sFEXx]+ *\[ *\d+%\]$")  # pytest's rows of dots: noise in a page


class KilnCommand(SphinxDirective):
    """``.. kiln-command:: kiln doctor``: run ``python -m kiln doctor`` now, in the repository root, and
    show it as a console session. The first word is a module run with ``python -m`` (``kiln``,
    ``pytest``); ``:head: N`` and ``:tail: N`` keep only the first or last lines of long output, and
    pytest's rows of progress dots are left out."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec = {"head": directives.nonnegative_int, "tail": directives.nonnegative_int}

    def run(self) -> list[nodes.Node]:
        args = self.arguments[0].split()
        shown = " ".join(args)
        try:
            done = subprocess.run(
                [sys.executable, "-m", *args],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=ROOT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("kiln-command: `%s` did not run: %s", shown, exc, location=self.get_location())
            return []
        if done.returncode != 0:
            logger.warning(
                "kiln-command: `%s` exited with %d: %s",
                shown,
                done.returncode,
                (done.stderr or done.stdout).strip()[-2000:],
                location=self.get_location(),
            )
        lines = [line for line in done.stdout.rstrip().splitlines() if not _PYTEST_PROGRESS.match(line)]
        head, tail = self.options.get("head"), self.options.get("tail")
        if head is not None and len(lines) > head + (tail or 0):
            lines = lines[:head] + ["..."] + (lines[-tail:] if tail else [])
        elif tail is not None and len(lines) > tail:
            lines = ["...", *lines[-tail:]]
        text = "\n".join([f"$ {shown}", *lines])
        block = nodes.literal_block(text, text, language="console")
        self.set_source_info(block)
        return [block]


def check_examples(app: Sphinx, doctree: nodes.document) -> None:
    """Warn about Python examples that the doctest builder would not run."""
    tested = [
        n.astext()
        for n in doctree.findall(lambda n: isinstance(n, (nodes.literal_block, nodes.comment)) and "testnodetype" in n)
    ]
    for node in doctree.findall(nodes.literal_block):
        if "testnodetype" in node:
            continue
        language = node.get("language", app.config.highlight_language)
        source = node.get("source")
        if source and Path(source).suffix == ".py":  # a literalinclude of a Python file
            if not Path(source).resolve().is_relative_to(DOCS):
                continue  # an excerpt of a package's source: its package's tests run it
            if not any(Path(source).stem in t for t in tested):
                logger.warning(
                    "%s is shown with literalinclude but no testcode/testsetup block on this page runs it "
                    "(import or name it in one)",
                    Path(source).name,
                    location=node,
                )
            continue
        if language in PYTHON_LANGUAGES and _KILN_CODE.search(node.astext()):
            logger.warning(
                "a Python example that the doctest builder does not run: write it as a doctest "
                "(>>>) or a testcode block",
                location=node,
            )


def check_packages(app: Sphinx) -> None:
    """Every package in ``packages/`` has a guide and a place in the reference."""
    for problem in packages.problems():
        logger.warning("docs do not cover every package: %s", problem)


def keep_stubs_out_of_navigation(app: Sphinx, doctree: nodes.document) -> None:
    """Drop the hidden toctree of every autosummary table (before the toctree collector sees it) and
    remember its pages, which :func:`mark_stubs_orphan` then marks as orphans (no page's toctree includes
    them; the tables' links reach them)."""
    from sphinx.ext.autosummary import autosummary_toc

    stubs = _stub_set(app.env)
    for node in list(doctree.findall(autosummary_toc)):
        for toc in node.findall(addnodes.toctree):
            stubs.update(toc["includefiles"])
        node.parent.remove(node)


def _stub_set(env) -> set:
    if not hasattr(env, "kiln_api_stubs"):
        env.kiln_api_stubs = set()
    return env.kiln_api_stubs


def mark_stubs_orphan(app: Sphinx, env) -> None:
    """After every page is read: the stub pages are orphans, so Sphinx does not warn that no toctree
    includes them."""
    for docname in _stub_set(env):
        env.metadata.setdefault(docname, {})["orphan"] = True


def merge_stubs(app: Sphinx, env, docnames, other) -> None:
    """Parallel reads: the stub pages found by each reader."""
    _stub_set(env).update(_stub_set(other))


# Pages whose contents list (the "On this page" column) shows their sections, not every object described.
TOPIC_CONTENTS = {f"{api.GENERATED}/tensor"}  # kiln.Tensor: ~700 members under a dozen topics


def topics_only_contents(app: Sphinx, doctree: nodes.document) -> None:
    """Leave the object descriptions of :data:`TOPIC_CONTENTS` pages out of their table of contents (as
    ``:no-contents-entry:`` would; autodoc's directives do not take that option).

    Sphinx copies the tables of contents of every page in the sidebar's tree for each page it writes: the
    Tensor page's ~2,800 entries made that three quarters of the HTML build's time.
    """
    if app.env.docname in TOPIC_CONTENTS:
        for desc in doctree.findall(addnodes.desc):
            desc["no-contents-entry"] = True


def setup(app: Sphinx) -> dict:
    app.add_directive("kiln-op-coverage", OpCoverage)
    app.add_directive("kiln-op-list", OpList)
    app.add_directive("kiln-api-coverage", ApiCoverage)
    app.add_directive("kiln-benchmarks", Benchmarks)
    app.add_directive("kiln-packages", Packages)
    app.add_directive("kiln-command", KilnCommand)
    app.add_directive("kiln-not-yet", NotYet)
    app.connect("doctree-read", check_examples)
    app.connect("builder-inited", check_packages)
    # before the toctree collector (priority 500) records the autosummary toctrees
    app.connect("doctree-read", keep_stubs_out_of_navigation, priority=400)
    app.connect("env-updated", mark_stubs_orphan)
    app.connect("env-merge-info", merge_stubs)
    app.connect("doctree-read", topics_only_contents, priority=400)  # before the toctree collector (500)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
