"""Every kiln workflow, one nox session each (DESIGN §1).

    python3 -m nox                                   the whole test suite: tests, integration, lint, docs
    python3 -m nox -s demo                           the demo training job (docs/examples/train_synthetic.py)
    python3 -m nox -s tests                          the unit tests on every backend
    python3 -m nox -s "tests(backend='reference')"   one backend
    python3 -m nox -s bench                          benchmarks/bench_*.py, JSON under benchmarks/results/
    python3 -m nox -l                                list the sessions

Anything after ``--`` is passed on: ``nox -s "tests(backend='reference')" -- -x -k matmul``.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.needs_version = ">=2024.4.15"  # nox.options.reuse_venv

ROOT = Path(__file__).resolve().parent

# Backend under test -> what to install beside the core (pip arguments). Adding a backend is one line
# here, e.g. "cpu": ["-e", "packages/kiln-cpu"]. Its session is then "tests(backend='cpu')".
BACKENDS: dict[str, list[str]] = {
    "reference": [],
}
# Extra environment for a backend's test run (read only for the backends listed above).
BACKEND_ENV: dict[str, dict[str, str]] = {
    "cuda-sim": {"NUMBA_ENABLE_CUDASIM": "1"},  # numba's CUDA simulator: CUDA kernels run on the CPU
}

# PyTorch is the test oracle (a test-only dependency). This exact pin matters: it resolves to the CPU
# build kept on disk, where a looser range could pull a multi-gigabyte CUDA build.
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", TORCH]
RUFF = "ruff==0.17.6"  # pinned: new ruff releases add rules and change formatting
DOCS_DEPS = ["sphinx>=8,<10", "furo"]  # a new Sphinx major can add warnings, and -W makes them errors
LINT_PATHS = ["packages", "tests-integration", "benchmarks", "docs", "noxfile.py"]

nox.options.sessions = ["tests", "integration", "lint", "docs"]
# Reuse each session's virtualenv between runs. This does not cost correctness: every session still
# runs its installs, so the editable kiln and every pinned or ranged requirement are checked each time
# (pip only skips what is already satisfied); what reuse can leave behind is a package no session asks
# for any more, and `nox --reuse-venv=no` (or deleting .nox/) clears that. CI starts from a fresh clone,
# so it always builds new environments. Locally it saves reinstalling torch on every run.
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "virtualenv"  # with pip; uv is not assumed to be installed
# Every command must come from the session's own virtualenv, never from whatever is on PATH.
nox.options.error_on_external_run = True


def _prepare(session: nox.Session) -> None:
    """Environment shared by every session."""
    # Numba's JIT cache (kiln-cpu, kiln-cuda compile with cache=True) persists across sessions and runs.
    cache = ROOT / ".nox" / ".numba-cache"
    cache.mkdir(parents=True, exist_ok=True)
    session.env["NUMBA_CACHE_DIR"] = str(cache)


def _install_kiln(session: nox.Session, *extra: str) -> None:
    """The core from the working tree (editable), plus ``extra`` pip arguments."""
    session.install("-e", "packages/kiln", *extra)


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """Unit tests of the core (packages/kiln/tests) against one backend; PyTorch is the oracle."""
    _prepare(session)
    _install_kiln(session, *TEST_DEPS, *BACKENDS[backend])
    session.env["KILN_BACKEND"] = backend
    session.env.update(BACKEND_ENV.get(backend, {}))
    session.run("pytest", "packages/kiln/tests", "--import-mode=importlib", "-q", *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests (tests-integration/): wheel builds and installs in fresh venvs, plugins, training."""
    _prepare(session)
    if not (ROOT / "tests-integration").is_dir():
        session.skip("tests-integration/ does not exist yet")
    # The suite builds wheels with the running interpreter (`pip wheel --no-build-isolation`): hatchling.
    _install_kiln(session, "pytest>=8", "hatchling")
    session.run("pytest", "tests-integration", "--import-mode=importlib", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over every package, the tests, benchmarks, docs and this file."""
    _prepare(session)
    session.install(RUFF)
    paths = [p for p in LINT_PATHS if (ROOT / p).exists()]
    session.run("ruff", "check", *paths, *session.posargs)
    session.run("ruff", "format", "--check", *paths)


@nox.session
def docs(session: nox.Session) -> None:
    """The Sphinx site (docs/ -> docs/_build/html), with warnings treated as errors."""
    _prepare(session)
    _install_kiln(session, *DOCS_DEPS)
    # -E: read every page each time. An incremental build re-reads only changed pages and so would not
    # repeat the warnings of unchanged ones; -W would then let a broken page pass on the second run.
    session.run("sphinx-build", "-E", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py script: kiln vs PyTorch vs NumPy, JSON under benchmarks/results/."""
    _prepare(session)
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if not scripts:
        session.skip("no benchmarks/bench_*.py scripts yet")
    _install_kiln(session, TORCH)
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    for script in scripts:
        session.run("python", str(script.relative_to(ROOT)), *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train a small MLP on synthetic data (docs/examples/train_synthetic.py)."""
    _prepare(session)
    _install_kiln(session)
    session.run("python", "docs/examples/train_synthetic.py", *session.posargs)
