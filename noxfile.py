"""Every kiln workflow, one nox session each (architecture page, "The packages").

    python3 -m nox                                   the whole suite: tests, mkl, packaging, integration, distributed, lint, docs
    python3 -m nox -s demo                           the demo training job (docs/examples/train_digits.py)
    python3 -m nox -s tests                          unit and conformance tests on every backend
    python3 -m nox -s "tests(backend='reference')"   one backend
    python3 -m nox -s mkl                            kiln-cpu's products on Intel MKL (the mkl extra; x86-64)
    python3 -m nox -s packaging                      every package from built wheels: install, import, smoke test
    python3 -m nox -s distributed                    kiln-distributed's multi-process tests (gloo, mpi, kiln-run, DDP)
    python3 -m nox -s bench                          benchmarks/bench_*.py, JSON under benchmarks/results/
    python3 -m nox -l                                list the sessions

Anything after ``--`` is passed on: ``nox -s "tests(backend='reference')" -- -x -k matmul``.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.needs_version = ">=2024.4.15"  # nox.options.reuse_venv

ROOT = Path(__file__).resolve().parent

EXAMPLE_DEVICE = "tests-integration/example_device"  # the out-of-tree example device plugin

# Backend under test -> what to install beside the core and kiln-testing (pip arguments). Adding a
# backend is one line here, e.g. "cpu": ["-e", "packages/kiln-cpu"] or "cuda-sim": ["-e", "packages/kiln-cuda"].
# Its session is then "tests(backend='cpu')", in a venv of its own with only that backend installed.
BACKENDS: dict[str, list[str]] = {
    "reference": [],  # the core alone: NumPy reference kernels for device "cpu"
    "example": ["-e", EXAMPLE_DEVICE],  # device "example": the primitive set, the rest through decompositions
    "cpu": ["-e", "packages/kiln-cpu"],  # Numba kernels for device "cpu" over the reference ones
    # device "cuda" on numba's CUDA simulator; the cu13 extra brings NVVM, so the same kernels are also
    # compiled to PTX for real GPUs (kiln-cuda's test_ptx.py), with no GPU and no system toolkit
    "cuda-sim": ["-e", "packages/kiln-cuda[cu13]"],
}
# Packages a backend's own tests use, installed in its cell but not tested there (kiln-cuda's training tests
# build kiln.nn models and compile them; kiln-nn's and kiln-compile's tests run in the cpu cells).
BACKEND_SUPPORT: dict[str, list[str]] = {
    "cuda-sim": ["-e", "packages/kiln-nn", "-e", "packages/kiln-compile"],  # fused kernels: test_fusion.py
}
# The device each backend's conformance run checks (`pytest --kiln-device=...`): "cpu" unless listed.
BACKEND_DEVICE: dict[str, str] = {
    "cuda-sim": "cuda",
    "example": "example",
}
# Extra environment for a backend's test runs (read only for the backends listed above).
BACKEND_ENV: dict[str, dict[str, str]] = {
    "cuda-sim": {"NUMBA_ENABLE_CUDASIM": "1"},  # numba's CUDA simulator: CUDA kernels run on the CPU
}
# The cell that runs the core's and the conformance kit's own tests: they run on device "cpu" whatever is
# installed (kiln-cpu hands their small tensors to the reference kernels), so another cell would repeat them.
CORE_CELL = "reference"
# The cell that runs the feature packages' tests (kiln-nn, kiln-data, ...): on device "cpu" with kiln-cpu's
# kernels, as users install them. The core alone is the reference cell's; kiln-cpu's kernels are checked
# op by op in its own cell (its tests and the conformance suite).
FEATURE_CELL = "cpu"
# Extra arguments of a backend's conformance run. The simulator runs each CUDA thread as a Python thread:
# its cell checks the dtypes with their own code paths (integers, float32, bfloat16's bit conversion) to
# stay within CI's time; kiln-cuda's own tests cover float16, float64, bool and int8 against PyTorch.
CONFORMANCE_ARGS: dict[str, list[str]] = {
    "cuda-sim": ["--kiln-dtypes=int64,float32,bfloat16"],
}
# Extra environment for the conformance run only.
CONFORMANCE_ENV: dict[str, dict[str, str]] = {
    # kiln-cpu hands small tensors to the reference kernels (cheaper below ~256k elements); the suite's
    # tensors are small, so this makes every one of them go through the Numba kernels.
    "cpu": {"KILN_CPU_MIN_NUMEL": "0"},
}
TESTING = "packages/kiln-testing"  # the conformance kit (a pytest plugin) and kiln.testing
# Backend packages: each is a cell of the tests matrix (BACKENDS), never a feature package.
BACKEND_PACKAGES = {"packages/kiln-cpu", "packages/kiln-cuda"}
# kiln-distributed's tests start processes (2-3 per test) and need its engines' libraries: they run once,
# in a session of their own ("distributed"), not in every backend cell.
DISTRIBUTED = "packages/kiln-distributed"

# PyTorch is the test oracle (a test-only dependency). This exact pin matters: it resolves to the CPU
# build kept on disk, where a looser range could pull a multi-gigabyte CUDA build.
TORCH = "torch==2.13.0"
# safetensors: interop tests only; Pillow: kiln-data's ImageFolder (its "images" extra)
# kiln.utils.tensorboard imports tensorboard (the core's "tensorboard" extra): tests, docs and packaging install it
TENSORBOARD = "tensorboard>=2.14"
TEST_DEPS = [
    "pytest>=8",
    "pytest-xdist>=3.5",
    "hypothesis>=6.100",
    TORCH,
    "safetensors>=0.4,<1",
    "Pillow>=10",
    TENSORBOARD,
]
# What only the feature packages' tests use, installed in FEATURE_CELL with them: kiln-compile's ONNX export,
# checked by onnx.checker and run by onnxruntime.
FEATURE_TEST_DEPS = ["onnx>=1.16", "onnxruntime>=1.18"]
# pytest-xdist: the suites that only compute run in a process per core (CI has two), the conformance suite
# included (each cell's status travels on its test report to the process that prints the coverage tables);
# the backends in SERIAL_OWN_TESTS stay in one (kiln-cuda's test_ptx.py compiles every kernel the earlier
# tests recorded).
PARALLEL = ("-n", "auto")
SERIAL_OWN_TESTS = {"cuda-sim"}
# The demo job (docs/examples/train_digits.py) and what runs it (integration test, benchmarks).
DEMO_DEPS = [
    *("-e", "packages/kiln-nn", "-e", "packages/kiln-data", "-e", "packages/kiln-amp", "-e", "packages/kiln-compile"),
    *("tqdm", "matplotlib"),
]
RUFF = "ruff==0.17.6"  # pinned: new ruff releases add rules and change formatting
# a new Sphinx major can add warnings, and -W makes them errors; onnx and onnxruntime: kiln-compile's guide
DOCS_DEPS = ["sphinx>=8,<10", "furo", TENSORBOARD, "onnx>=1.16", "onnxruntime>=1.18"]
DOCTREES = "docs/_build/doctrees"  # the pages the docs session reads once, for both of its builds
LINT_PATHS = ["packages", "tests-integration", "benchmarks", "docs", "noxfile.py"]

nox.options.sessions = ["tests", "mkl", "packaging", "integration", "distributed", "lint", "docs"]
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
    # Numba's JIT cache (kiln-cpu, kiln-cuda compile with cache=True) persists across sessions and runs,
    # one folder per version of the backends' sources: Numba checks only the timestamp of the file that
    # defines a kernel, not of the files whose jitted helpers it inlines, so an edit to a shared helper
    # would otherwise leave stale machine code in the cache.
    digest = hashlib.sha256()
    for path in sorted((ROOT / "packages").glob("kiln-c*/src/**/*.py")):
        digest.update(path.read_bytes())
    root = ROOT / ".nox" / ".numba-cache"
    cache = root / digest.hexdigest()[:16]
    if not cache.is_dir() and root.is_dir():
        for old in root.iterdir():  # caches of earlier sources: never valid again
            shutil.rmtree(old, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    session.env["NUMBA_CACHE_DIR"] = str(cache)
    # pip installs without byte-compiling every module it writes (pip's --compile off): PyTorch alone is
    # ~5,000 modules, and compiling them took 30 of the 48 s of its install in each of seven venvs. Python
    # compiles what a session actually imports, once, on first import.
    session.env["PIP_COMPILE"] = "0"


def _install_kiln(session: nox.Session, *extra: str) -> None:
    """The core from the working tree (editable), plus ``extra`` pip arguments."""
    session.install("-e", "packages/kiln", *extra)


def _own_tests(install_args: list[str]) -> list[str]:
    """The tests/ folders of the projects a backend installs (``-e path`` arguments)."""
    paths = [a.split("[")[0] for a in install_args if not a.startswith("-")]  # without extras ("pkg[cu13]")
    paths = [p for p in paths if (ROOT / p / "tests").is_dir()]
    return [f"{p}/tests" for p in paths]


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """The backend's own tests and the conformance suite against its device; the core's and kiln-testing's
    tests in CORE_CELL, the feature packages' tests in FEATURE_CELL."""
    _prepare(session)
    _install_kiln(session, "-e", TESTING, *TEST_DEPS, *BACKENDS[backend], *BACKEND_SUPPORT.get(backend, []))
    session.env["KILN_BACKEND"] = backend
    session.env.update(BACKEND_ENV.get(backend, {}))
    # With posargs (`-- -k matmul`) a run may select no tests at all (pytest's exit code 5): not a failure.
    ok = [0, 5] if session.posargs else [0]
    pytest = ("pytest", "--import-mode=importlib", "-q")
    runs = _PytestRuns(session, ok)
    if backend == CORE_CELL:
        runs.run(*pytest, *PARALLEL, "packages/kiln/tests", f"{TESTING}/tests", *session.posargs)
    own = _own_tests(BACKENDS[backend])
    if own:
        runs.run(*pytest, *(() if backend in SERIAL_OWN_TESTS else PARALLEL), *own, *session.posargs)
    device = BACKEND_DEVICE.get(backend, "cpu")
    conformance = [f"--kiln-device={device}", *CONFORMANCE_ARGS.get(backend, [])]
    runs.run(*pytest, *PARALLEL, *conformance, *session.posargs, env=CONFORMANCE_ENV.get(backend, {}))
    features = _feature_packages()
    if backend == FEATURE_CELL and features:
        session.install(*[a for f in features for a in ("-e", f)], *FEATURE_TEST_DEPS)
        runs.run(*pytest, *PARALLEL, *[f"{f}/tests" for f in features], *session.posargs)
    runs.finish()


class _PytestRuns:
    """A cell's pytest commands: each one runs even when an earlier one failed (a failure in the core's
    tests must not hide the state of the backend's or the conformance suite); the session fails at the
    end, naming every command that failed."""

    def __init__(self, session: nox.Session, ok: list[int]) -> None:
        self.session, self.ok, self.failed = session, ok, []

    def run(self, *args: str, env: dict[str, str] | None = None) -> None:
        """Run one pytest command; a failure is recorded, not raised."""
        try:
            self.session.run(*args, env=env or {}, success_codes=self.ok)
        except CommandFailed:
            self.failed.append(" ".join(args))

    def finish(self) -> None:
        """Fail the session if any command failed."""
        if self.failed:
            self.session.error(f"{len(self.failed)} pytest command(s) failed: " + "; ".join(self.failed))


@nox.session
def packaging(session: nox.Session) -> None:
    """Every package from built wheels, not editable: import each namespace, list plugins, run conformance.

    All of packages/* are built with ``pip wheel`` and installed into one venv; every package in the
    wheels must import from site-packages (never from the repository), ``kiln plugins`` must work, and
    the conformance suite must run from the installed kiln-testing (its pytest11 entry point).
    """
    _prepare(session)
    session.install("hatchling")  # wheels are built with this venv's hatchling (no isolated build env)
    tmp = Path(session.create_tmp())
    wheels_dir = tmp / "wheels"
    if wheels_dir.exists():
        for old in wheels_dir.glob("*.whl"):
            old.unlink()
    projects = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/pyproject.toml"))
    session.run(
        "python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels_dir), *projects
    )
    wheels = sorted(str(w) for w in wheels_dir.glob("*.whl"))
    if len(wheels) != len(projects):
        session.error(f"expected {len(projects)} wheels, built {len(wheels)}: {wheels}")
    session.install(*wheels, TENSORBOARD)  # their dependencies (from the index or pip's cache)
    # the reused venv may hold an older build of the same version: replace it, whatever pip thinks
    session.install("--force-reinstall", "--no-deps", *wheels)
    modules = _packages_in_wheels([Path(w) for w in wheels])
    session.log(f"importing {len(modules)} packages from {len(wheels)} wheels: {', '.join(modules)}")
    session.chdir(tmp)  # nothing in the working directory may shadow the installed packages
    session.run("python", "-c", _IMPORT_CHECK, *modules)
    session.run("kiln", "plugins")
    # every op, in the dtypes with their own code paths: the suite's whole matrix runs in the cpu cell, from the
    # same sources; here it shows that the installed plugin and kernels load and run (half of the time)
    dtypes = "--kiln-dtypes=int64,float32,bfloat16"
    session.run("python", "-m", "pytest", "--kiln-device=cpu", dtypes, "-q", "-p", "no:cacheprovider", "-x")


# Imports each named package and fails unless it (and every portion of the kiln namespace) comes from
# site-packages: an editable install or the repository on sys.path would defeat the check.
_IMPORT_CHECK = """
import importlib, sys, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"]).resolve()
for name in sys.argv[1:]:
    mod = importlib.import_module(name)
    where = [Path(p).resolve() for p in getattr(mod, "__path__", [mod.__file__])]
    bad = [str(p) for p in where if not p.is_relative_to(site)]
    if bad:
        sys.exit(f"{name} imported from outside site-packages: {bad}")
    print(f"ok  {name:32} {where[0]}")
"""


def _packages_in_wheels(wheels: list[Path]) -> list[str]:
    """Every package (a folder with ``__init__.py``) in the wheels, as dotted names, parents first."""
    import zipfile

    names: set[str] = set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for entry in zf.namelist():
                parts = entry.split("/")
                if parts[-1] == "__init__.py" and not parts[0].endswith((".dist-info", ".data")):
                    names.add(".".join(parts[:-1]))
    return sorted(names, key=lambda n: (n.count("."), n))


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests (tests-integration/): wheel builds and installs in fresh venvs, plugins, training."""
    _prepare(session)
    if not (ROOT / "tests-integration").is_dir():
        session.skip("tests-integration/ does not exist yet")
    # The suite builds wheels with the running interpreter (`pip wheel --no-build-isolation`): hatchling.
    # DEMO_DEPS: test_demo_digits.py runs the demo; TORCH: test_api_surface.py compares kiln's names with PyTorch's
    _install_kiln(session, "pytest>=8", "pytest-xdist>=3.5", "hatchling", TORCH, *DEMO_DEPS)
    # tests-integration/example_device is a plugin project (its own tests run in "tests(backend='example')").
    session.run(
        "pytest",
        "tests-integration",
        f"--ignore={EXAMPLE_DEVICE}",
        *PARALLEL,
        "--import-mode=importlib",
        "-q",
        *session.posargs,
    )


@nox.session
def mkl(session: nox.Session) -> None:
    """kiln-cpu's products on Intel MKL (the ``mkl`` extra, x86-64): its own product tests and the conformance
    suite's products, with MKL installed (the cpu cell runs them on NumPy's OpenBLAS). Elsewhere it skips."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        session.skip("the mkl wheel is built for x86-64 only")
    _prepare(session)
    _install_kiln(session, "-e", TESTING, *TEST_DEPS, "-e", "packages/kiln-cpu[mkl]")
    session.env["KILN_BACKEND"] = "cpu"
    session.env["KILN_CPU_MKL_MIN_MACS"] = "0"  # every product MKL can read runs MKL, the tests' small ones too
    session.run("python", "-c", "from kiln_cpu import _mkl; assert _mkl.load() is not None, _mkl.error()")
    tests = ("packages/kiln-cpu/tests/test_mkl.py", "packages/kiln-cpu/tests/test_linalg.py")
    ok = [0, 5] if session.posargs else [0]  # (a `-k` in posargs may select nothing)
    pytest = ("pytest", "--import-mode=importlib", "-q", *PARALLEL)
    session.run(*pytest, *tests, *session.posargs, success_codes=ok)
    # the suite's products (the ops whose names contain these: bmm also selects baddbmm), on kiln-cpu's kernels
    products = "matmul or addmm or bmm or einsum"
    session.run(
        *pytest, "--kiln-device=cpu", "-k", products, *session.posargs, env=CONFORMANCE_ENV["cpu"], success_codes=ok
    )


@nox.session
def distributed(session: nox.Session) -> None:
    """kiln-distributed's tests: every collective on 2 and 3 processes for the gloo and mpi engines, the
    faults, DistributedDataParallel and ZeroRedundancyOptimizer against one process, and kiln-run (one host,
    two hosts in network namespaces when run as root). On the reference backend: the engines move bytes, and
    kiln-cpu's kernels are tested in their own cell."""
    _prepare(session)
    # [gloo]: PyTorch's Gloo (TORCH first, so that pip keeps the CPU build); [mpi]: mpi4py and MPICH's wheel;
    # tqdm and matplotlib: the digits demo, trained on 2 processes under kiln-run (test_demo_distributed.py)
    demo = ["tqdm", "matplotlib"]
    _install_kiln(session, "pytest>=8", TORCH, "-e", "packages/kiln-nn", "-e", "packages/kiln-data", *demo)
    session.install("-e", f"{DISTRIBUTED}[gloo,mpi]")
    session.run("pytest", f"{DISTRIBUTED}/tests", "--import-mode=importlib", "-q", *session.posargs)


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
    """The Sphinx site (docs/ -> docs/_build/html), warnings as errors; then every example, as a doctest."""
    _prepare(session)
    # every package of packages/: the API reference documents them all, and their examples run
    _install_kiln(session, *_every_package(), *DOCS_DEPS, TORCH)  # TORCH: the API coverage page (PyTorch's names)
    # -E: read every page each time. An incremental build re-reads only changed pages and so would not
    # repeat the warnings of unchanged ones; -W would then let a broken page pass on the second run.
    # -j auto: pages are read and written in parallel, one process per core
    session.run(
        "sphinx-build",
        "-j",
        "auto",
        "-E",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "-d",
        DOCTREES,
        "docs",
        "docs/_build/html",
        *session.posargs,
    )
    # The examples run with device "cuda" on numba's CUDA simulator (the kiln-cuda guide's examples need it).
    # No -E here: the HTML build has just read every page (warnings as errors), and its environment serves.
    session.run(
        "sphinx-build",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "doctest",
        "-d",
        DOCTREES,
        "docs",
        "docs/_build/doctest",
        env={"NUMBA_ENABLE_CUDASIM": "1"},
    )


def _feature_packages() -> list[str]:
    """packages/* that are neither the core, the conformance kit nor a backend (kiln-nn, kiln-data, ...)."""
    dirs = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/pyproject.toml"))
    return [d for d in dirs if d not in ("packages/kiln", TESTING, DISTRIBUTED) and d not in BACKEND_PACKAGES]


def _every_package() -> list[str]:
    """``-e packages/<dist>`` for every package but the core (which _install_kiln installs)."""
    dirs = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml") if p.parent.name != "kiln")
    return [arg for d in dirs for arg in ("-e", f"packages/{d}")]


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py script: kiln vs PyTorch vs NumPy, JSON under benchmarks/results/."""
    _prepare(session)
    scripts = sorted((ROOT / "benchmarks").glob("bench_*.py"))
    if not scripts:
        session.skip("no benchmarks/bench_*.py scripts yet")
    # bench_cpu.py, bench_data.py; kiln-distributed's gloo engine: bench_ddp.py (kiln DDP beside PyTorch DDP)
    _install_kiln(session, TORCH, *BACKENDS["cpu"], *DEMO_DEPS, "-e", f"{DISTRIBUTED}[gloo]")
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    for script in scripts:
        session.run("python", str(script.relative_to(ROOT)), *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train a small CNN on the embedded handwritten digits (docs/examples/train_digits.py)."""
    _prepare(session)
    _install_kiln(session, *DEMO_DEPS)
    session.run("python", "docs/examples/train_digits.py", *session.posargs)
