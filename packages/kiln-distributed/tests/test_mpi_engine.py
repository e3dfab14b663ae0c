"""The mpi backend's engine (kiln_distributed.mpi.MPIEngine) under mpiexec, 2 and 3 processes.

Each test runs ``mpi_scripts/engine_worker.py MODE`` under ``mpiexec -n N`` with a timeout; every rank
prints ``OK MODE rank R`` once its checks (against NumPy) passed. Skipped without mpi4py or mpiexec.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")

WORKER = Path(__file__).parent / "mpi_scripts" / "engine_worker.py"
_local = Path(sys.executable).parent / "mpiexec"
MPIEXEC = str(_local) if _local.exists() else shutil.which("mpiexec")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "KILN_USE_AGENT_STORE"):
        env.pop(var, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """Run ``argv`` in its own session; kill the whole session if it outlives ``timeout``."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=WORKER.parent,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s:\n{out}")
    return proc.returncode, out


def _mpirun(n: int, mode: str, timeout: float = 60) -> str:
    rc, out = _run([MPIEXEC, "-n", str(n), sys.executable, str(WORKER), mode], timeout)
    assert rc == 0, out
    for r in range(n):
        assert f"OK {mode} rank {r}" in out, out
    return out


def test_module_import_does_not_load_mpi():
    code = (
        "import sys, kiln_distributed.plugin, kiln_distributed.mpi as m\n"
        "assert 'mpi4py' not in sys.modules, 'mpi4py imported at module import'\n"
        "assert m.MPIEngine.is_available()\n"
        "from mpi4py import MPI\n"
        "assert not MPI.Is_initialized(), 'is_available() initialised MPI'\n"
        "assert m.MPIEngine.name == 'mpi'\n"
        "print('fine')\n"
    )
    rc, out = _run([sys.executable, "-c", code], timeout=60)
    assert rc == 0 and "fine" in out, out


def test_single_process_without_mpiexec():
    # a singleton MPI world: every operation on a group of one
    rc, out = _run([sys.executable, str(WORKER), "ops"], timeout=60)
    assert rc == 0 and "OK ops rank 0" in out, out


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_every_operation(n):
    # world and (n=3) sub-groups [0, 2] and [2, 0]: every op, dtype and root against NumPy
    _mpirun(n, "ops")


@needs_mpiexec
def test_timeout_raises_instead_of_hanging():
    out = _mpirun(2, "timeout")
    assert "OK timeout rank 0 group setup" in out


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_ranks_that_disagree_with_mpi(n):
    _mpirun(n, "mismatch")


@needs_mpiexec
def test_init_process_group_mpi():
    # kiln.distributed.init_process_group("mpi") without MASTER_ADDR: rank and size from MPI
    _mpirun(3, "frontend")
