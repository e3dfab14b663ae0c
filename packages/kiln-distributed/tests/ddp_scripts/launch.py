"""Start the ranks of a worker script (this folder) and collect what each rank reported.

Imported by test_ddp.py and test_zero.py by path. Every wait has a timeout; a hung rank is killed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(script: str, world: int, backend: str = "gloo", timeout: float = 150) -> tuple[list[dict], str]:
    """Run ``world`` ranks of ``script`` (env:// rendezvous, or mpiexec for ``backend="mpi"``); return each
    rank's ``{check: "ok" | "FAIL: ..."}`` and the ranks' combined output."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(HERE / script), backend, out]
        procs = []
        if backend == "mpi":
            env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
            mpiexec = Path(sys.executable).parent / "mpiexec"
            procs.append(
                subprocess.Popen(
                    [str(mpiexec), "-n", str(world), *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True,
                )
            )  # fmt: skip
        else:
            port = free_port()
            for rank in range(world):
                env = dict(
                    os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
                )
                procs.append(
                    subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                )
        deadline = time.monotonic() + timeout
        outputs = []
        for p in procs:
            try:
                text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                text, _ = p.communicate(timeout=30)
                text = f"[killed after {timeout} s]\n{text}"
            outputs.append(f"--- exit {p.returncode}\n{text}")
        reports = []
        for rank in range(world):
            f = Path(out) / f"rank{rank}.json"
            reports.append(json.loads(f.read_text()) if f.exists() else {})
        return reports, "\n".join(outputs)


def backends() -> list[str]:
    """The backends the worker tests run on here: gloo, and mpi where mpi4py and mpiexec are installed."""
    import kiln.distributed as dist

    out = []
    if dist.is_backend_available("gloo"):
        out.append("gloo")
    if dist.is_backend_available("mpi") and (Path(sys.executable).parent / "mpiexec").exists():
        out.append("mpi")
    return out


class Reports:
    """The reports of one run of ``script`` on ``world`` ranks per backend, made on first use and kept
    (one run serves every check of a test file)."""

    def __init__(self, script: str, world: int, checks: list[str]) -> None:
        self.script, self.world, self.checks = script, world, checks
        self._runs: dict[str, tuple[list[dict], str]] = {}

    def _get(self, backend: str) -> tuple[list[dict], str]:
        if backend not in self._runs:
            self._runs[backend] = run_workers(self.script, self.world, backend)
        return self._runs[backend]

    def assert_ok(self, backend: str, name: str) -> None:
        """Every rank reported check ``name`` as ``"ok"``."""
        reports, output = self._get(backend)
        for rank, report in enumerate(reports):
            assert name in report, f"rank {rank} did not report {name}:\n{output[-6000:]}"
            assert report[name] == "ok", f"rank {rank}: {report[name]}"

    def assert_complete(self, backend: str) -> None:
        """Every rank reported exactly the listed checks, and every rank exited with 0."""
        reports, output = self._get(backend)
        assert reports and all(set(r) == set(self.checks) for r in reports), output[-6000:]
        exits = [line for line in output.splitlines() if line.startswith("--- exit")]
        assert all(line.startswith("--- exit 0") for line in exits), output
