"""Fixtures for the integration suite: a wheel of the core, one fresh venv, tiny generated distributions.

The suite proves what unit tests inside ``packages/kiln`` cannot: that kiln installs from a wheel into
an empty environment, and that plugins and feature packages installed beside it are discovered through
real entry points and real ``sys.path`` entries.

Cost model (2 cores, offline except the package registry / pip's cache):

* the core wheel is built once with ``pip wheel --no-build-isolation`` (hatchling is in the running env);
* ONE venv per session gets that wheel (its dependencies numpy, ml_dtypes and pluggy come from the
  registry or pip's cache); every test reuses it;
* a test that needs a plugin generates a tiny hatchling project, builds its wheel with the running
  interpreter (no isolated build env, so no download) and installs it with ``--no-deps --no-index``;
  the :class:`Venv` ``installed`` context manager uninstalls it again, so tests leave the venv as found.

Everything a test checks runs in a subprocess with the venv's interpreter, never in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KILN_SRC = REPO / "packages" / "kiln"

# Generous per-command limits: nothing may hang (architecture page, "Errors"), but a cold pip cache is slow.
PIP_TIMEOUT = 600
RUN_TIMEOUT = 120

# Variables that would leak this process's setup into the venv's subprocesses.
_SCRUB = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH", "__PYVENV_LAUNCHER__")


def _clean_env(extra: dict[str, str] | None = None, bin_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_") and k not in _SCRUB}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if bin_dir is not None:
        env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    if extra:
        env.update(extra)
    return env


def _run(
    cmd: list[str], *, timeout: float, what: str, cwd: Path | None = None, env=None
) -> subprocess.CompletedProcess:
    """Run a command, failing the test with its full output when it fails."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )
    return proc


# --------------------------------------------------------------------------------------- the venv


@dataclass
class Venv:
    """A virtual environment with kiln installed from its wheel, driven through subprocesses."""

    root: Path
    workdir: Path  # neutral cwd for subprocesses: nothing importable in it
    setup_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.root / ("Scripts" if os.name == "nt" else "bin")

    @property
    def python(self) -> Path:
        return self.bin / ("python.exe" if os.name == "nt" else "python")

    @property
    def kiln_script(self) -> Path:
        return self.bin / ("kiln.exe" if os.name == "nt" else "kiln")

    def env(self, **extra: str) -> dict[str, str]:
        return _clean_env(extra, self.bin)

    def run(self, cmd: list, *, env: dict[str, str] | None = None, check: bool = True, timeout: float = RUN_TIMEOUT):
        """Run ``cmd`` (a list) in the venv's environment; ``env`` adds variables (e.g. KILN_*)."""
        full_env = self.env(**(env or {}))
        if check:
            return _run(cmd, timeout=timeout, what="command", cwd=self.workdir, env=full_env)
        return subprocess.run(
            [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=self.workdir, env=full_env
        )

    def py(self, code: str, *, env: dict[str, str] | None = None, check: bool = True, args: tuple = ()):
        """Run a Python snippet (dedented) with the venv's interpreter."""
        return self.run([self.python, *args, "-c", textwrap.dedent(code)], env=env, check=check)

    def py_json(self, code: str, *, env: dict[str, str] | None = None):
        """Run a snippet that prints one JSON document as its last stdout line; return it parsed."""
        out = self.py(code, env=env).stdout.strip().splitlines()
        return json.loads(out[-1])

    def kiln(self, *args: str, env: dict[str, str] | None = None, check: bool = True):
        """The ``kiln`` console script installed by the wheel."""
        return self.run([self.kiln_script, *args], env=env, check=check)

    def plugins_json(self, *, env: dict[str, str] | None = None, via: str = "module") -> dict:
        """``python -m kiln plugins --json`` (or the console script with ``via="script"``), parsed."""
        if via == "module":
            proc = self.run([self.python, "-m", "kiln", "plugins", "--json"], env=env)
        else:
            proc = self.kiln("plugins", "--json", env=env)
        return json.loads(proc.stdout)

    def pip(self, *args: str, timeout: float = PIP_TIMEOUT):
        return _run(
            [self.python, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
            timeout=timeout,
            what="pip",
            cwd=self.workdir,
            env=self.env(),
        )

    def install(self, target: Path, *, editable: bool = False, extra: tuple[str, ...] = ()) -> None:
        """Install a local wheel (offline, no deps) or a project directory in editable mode."""
        if editable:
            # pip builds the editable wheel in an isolated env; hatchling comes from the registry/cache.
            self.pip("install", "-q", "--no-deps", *extra, "-e", str(target))
        else:
            self.pip("install", "-q", "--no-deps", "--no-index", *extra, str(target))

    def uninstall(self, *dists: str) -> None:
        self.pip("uninstall", "-q", "-y", *dists)

    def is_installed(self, dist: str) -> bool:
        proc = self.run([self.python, "-m", "pip", "show", "-q", dist], check=False)
        return proc.returncode == 0

    @contextlib.contextmanager
    def installed(self, target: Path, dist: str, *, editable: bool = False) -> Iterator[None]:
        """Install for the duration of a ``with`` block, uninstalling afterwards even on failure."""
        self.install(target, editable=editable)
        try:
            yield
        finally:
            if self.is_installed(dist):
                self.uninstall(dist)


@pytest.fixture(scope="session")
def kiln_wheel(tmp_path_factory) -> Path:
    """A wheel of packages/kiln built from the working tree with the running interpreter's hatchling."""
    out = tmp_path_factory.mktemp("kiln-wheel")
    t0 = time.perf_counter()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            out,
            KILN_SRC,
        ],
        timeout=PIP_TIMEOUT,
        what="building the kiln wheel",
        env=_clean_env(),
    )
    wheels = sorted(out.glob("kiln-*.whl"))
    assert len(wheels) == 1, wheels
    print(f"\n[integration] built {wheels[0].name} in {time.perf_counter() - t0:.2f}s")
    return wheels[0]


@pytest.fixture(scope="session")
def venv(tmp_path_factory, kiln_wheel) -> Venv:
    """ONE fresh venv for the whole session, with kiln (and its dependencies) installed from the wheel."""
    base = tmp_path_factory.mktemp("venv")
    work = base / "work"
    work.mkdir()
    v = Venv(root=base / "env", workdir=work)
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "venv", v.root], timeout=PIP_TIMEOUT, what="python -m venv", env=_clean_env())
    t1 = time.perf_counter()
    # Dependencies (numpy, ml_dtypes, pluggy) resolve from the configured index / pip's cache.
    v.pip("install", "-q", str(kiln_wheel))
    t2 = time.perf_counter()
    v.setup_seconds = {"venv": t1 - t0, "install": t2 - t1}
    print(f"[integration] venv created in {t1 - t0:.2f}s, kiln wheel + deps installed in {t2 - t1:.2f}s")
    loc = v.py("import kiln, sys; print(kiln.__file__)").stdout.strip()
    assert Path(loc).resolve().is_relative_to(v.root.resolve()), f"kiln imported from outside the venv: {loc}"
    return v


# ------------------------------------------------------------------------------ tiny distributions


@dataclass
class Dist:
    """A generated distribution: its project directory, name and built wheel (when built)."""

    name: str
    project: Path
    wheel: Path | None = None


class DistFactory:
    """Writes tiny hatchling projects and builds their wheels (cached by name for the session)."""

    def __init__(self, root: Path):
        self.root = root
        self._built: dict[str, Dist] = {}

    def project(
        self,
        name: str,
        files: dict[str, str],
        *,
        version: str = "0.1.0",
        entry_points: dict[str, str] | None = None,
        packages: list[str] | None = None,
    ) -> Dist:
        """Write ``pyproject.toml`` and ``files`` (paths relative to the project, sources dedented)."""
        proj = self.root / name
        if proj.exists():
            shutil.rmtree(proj)
        proj.mkdir(parents=True)
        lines = [
            "[build-system]",
            'requires = ["hatchling>=1.21"]',
            'build-backend = "hatchling.build"',
            "",
            "[project]",
            f'name = "{name}"',
            f'version = "{version}"',
            'requires-python = ">=3.11"',
            'dependencies = ["kiln"]',
        ]
        if entry_points:
            lines += ["", "[project.entry-points.kiln]"]
            lines += [f'{k} = "{v}"' for k, v in entry_points.items()]
        if packages:
            lines += ["", "[tool.hatch.build.targets.wheel]", f"packages = {json.dumps(packages)}"]
        (proj / "pyproject.toml").write_text("\n".join(lines) + "\n")
        for rel, src in files.items():
            p = proj / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(src).lstrip())
        return Dist(name=name, project=proj)

    def wheel(self, dist: Dist) -> Dist:
        """Build ``dist``'s wheel with the running interpreter (hatchling is installed here)."""
        out = self.root / "wheels" / dist.name
        if out.exists():
            shutil.rmtree(out)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                out,
                dist.project,
            ],
            timeout=PIP_TIMEOUT,
            what=f"building {dist.name}",
            env=_clean_env(),
        )
        (whl,) = out.glob("*.whl")
        dist.wheel = whl
        return dist

    def plugin(self, name: str, module: str, source: str, *, ep: str, version: str = "0.1.0") -> Dist:
        """A plugin distribution with one module and one entry point in group ``kiln``, built (cached)."""
        if name not in self._built:
            d = self.project(
                name,
                {f"src/{module}/__init__.py": source},
                version=version,
                entry_points={ep: module},
                packages=[f"src/{module}"],
            )
            self._built[name] = self.wheel(d)
        return self._built[name]


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> DistFactory:
    return DistFactory(tmp_path_factory.mktemp("dists"))


# ------------------------------------------------------------------------------------ the plugins
# Sources shared by several test modules; each is built at most once per session.

BROKEN_SOURCE = '''
"""A kiln plugin that cannot even be imported (integration tests)."""
raise ImportError("kiln_broken_plugin is deliberately broken for the integration tests")
'''

DUMMY_SOURCE = '''
"""A working third-party kiln plugin: an extension and a ``neg`` kernel override for "cpu"."""
import kiln
from kiln.hookspecs import hookimpl

NEG_CALLS = 0
MARKER = 42.0


def _neg(spec, input):
    """Not a negation: fills with MARKER so the tests can tell which kernel ran."""
    global NEG_CALLS
    NEG_CALLS += 1
    shape, dtype = spec[0], spec[1]
    return kiln.full(shape, MARKER, dtype=dtype)


@hookimpl
def kiln_register_kernels(register):
    """Override the reference ``neg`` kernel on the CPU."""
    register("neg", "cpu", _neg)


def kiln_register_extensions(register):
    """Announce the feature (a plain function, no hookimpl marker: kiln accepts both)."""
    register("kiln-dummy", "1.2.3")
'''

HOOKFAIL_SOURCE = '''
"""A kiln plugin that imports fine but whose kernel hook raises halfway through."""
import kiln


def _neg(spec, input):
    return kiln.full(spec[0], -999.0, dtype=spec[1])


def kiln_register_kernels(register):
    """Registers a kernel, then fails: the registration must be discarded."""
    register("neg", "cpu", _neg)
    raise RuntimeError("kiln_hookfail_plugin: kernel hook exploded on purpose")


def kiln_register_extensions(register):
    """Never reached: a plugin whose hook failed gets no more hooks called."""
    register("kiln-hookfail", "0.0.1")
'''

HALFBROKEN_SOURCE = '''
"""A kiln plugin whose kernel hook succeeds and whose extension hook (called later) raises."""
import kiln


def _neg(spec, input):
    return kiln.full(spec[0], -777.0, dtype=spec[1])


def kiln_register_kernels(register):
    """A kernel that must not outlive the plugin's failure."""
    register("neg", "cpu", _neg)


def kiln_register_extensions(register):
    """Fails after the kernel hook has been committed."""
    raise RuntimeError("kiln_halfbroken_plugin: extension hook exploded on purpose")
'''

SENTINEL_SOURCE = '''
"""A harmless plugin whose only job is to show whether (and when) plugins are imported."""
'''


@pytest.fixture(scope="session")
def broken_plugin(dists) -> Dist:
    return dists.plugin("kiln-broken-plugin", "kiln_broken_plugin", BROKEN_SOURCE, ep="broken", version="0.0.1")


@pytest.fixture(scope="session")
def dummy_plugin(dists) -> Dist:
    return dists.plugin("kiln-dummy-plugin", "kiln_dummy_plugin", DUMMY_SOURCE, ep="dummy", version="0.3.0")


@pytest.fixture(scope="session")
def hookfail_plugin(dists) -> Dist:
    return dists.plugin("kiln-hookfail-plugin", "kiln_hookfail_plugin", HOOKFAIL_SOURCE, ep="hookfail")


@pytest.fixture(scope="session")
def halfbroken_plugin(dists) -> Dist:
    return dists.plugin("kiln-halfbroken-plugin", "kiln_halfbroken_plugin", HALFBROKEN_SOURCE, ep="halfbroken")


@pytest.fixture(scope="session")
def sentinel_plugin(dists) -> Dist:
    return dists.plugin("kiln-sentinel-plugin", "kiln_sentinel_plugin", SENTINEL_SOURCE, ep="sentinel")


def plugin_row(report: dict, name: str) -> dict:
    """The row for plugin ``name`` in a ``kiln plugins --json`` report."""
    rows = {r["name"]: r for r in report["plugins"]}
    assert name in rows, f"plugin {name!r} not listed; got {sorted(rows)}"
    return rows[name]


@pytest.fixture(scope="session")
def helpers():
    """Plain helper functions for test modules (conftest is not importable under importlib mode)."""

    class H:
        row = staticmethod(plugin_row)

    return H
