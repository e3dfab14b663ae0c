"""Every collective on 2 and 3 processes per engine, rendezvous by env://, tcp:// and file://, and the
faults: mismatched calls, a rank killed mid-all-reduce, a rank that stalls, a wrong master address and an
object that must not be unpickled. Workers are real processes (c10d_scripts/); every wait has a timeout."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kiln.distributed as dist
from kiln.distributed.store import TCPStore

SCRIPTS = Path(__file__).parent / "c10d_scripts"
ENGINES = [b for b in ("gloo", "mpi") if dist.is_backend_available(b)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(script: str, args: list[str], world: int, env: dict | None = None, timeout: float = 120):
    """Run ``world`` copies of ``script`` as ranks 0..world-1; return [(returncode, stdout+stderr)].

    The free port is chosen before rank 0 binds it; if another process took it meanwhile (the machine is
    shared), the run is repeated once on another port."""
    results = _spawn_once(script, args, world, env, timeout)
    if any("address already in use" in out for _, out in results):
        results = _spawn_once(script, args, world, env, timeout)
    return results


def _spawn_once(script: str, args: list[str], world: int, env: dict | None, timeout: float):
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        e.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / script), *args],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            pytest.fail(f"a rank hung past {timeout} s:\n{out}")
        results.append((p.returncode, out))
    return results


def spawn_mpi(script: str, args: list[str], world: int, timeout: float = 120):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this python (the mpich wheel)")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    p = subprocess.run(
        [str(mpiexec), "-n", str(world), sys.executable, str(SCRIPTS / script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stdout


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("engine", ENGINES)
def test_every_collective(engine, world):
    if engine == "mpi":
        code, out = spawn_mpi("collectives.py", [engine], world)
        assert code == 0, out
        assert all(f"rank {r}: ok" in out for r in range(world)), out  # (mpiexec may interleave the lines)
        return
    results = spawn("collectives.py", [engine], world)
    for rank, (code, out) in enumerate(results):
        assert code == 0 and f"rank {rank}: ok" in out, out


@pytest.mark.parametrize("engine", ENGINES)
def test_every_collective_under_kiln_run_after_a_restart(engine):
    """kiln-run serves the store and restarts the group once: the second attempt's rendezvous must not
    see the first attempt's keys, and MPI ranks form one world through the launcher's PMI server."""
    env = dict(os.environ, KILN_TEST_FAIL_FIRST="1", KILN_RDZV_TIMEOUT="60")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kiln.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            str(SCRIPTS / "collectives.py"),
            engine,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stdout
    assert "rank 0: ok" in p.stdout and "rank 1: ok" in p.stdout, p.stdout


@pytest.mark.skipif("gloo" not in ENGINES, reason="needs the gloo engine")
@pytest.mark.parametrize("method", ["tcp", "file"])
def test_init_methods(method, tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}" if method == "tcp" else f"file://{tmp_path / 'store'}"
    for rank, (code, out) in enumerate(spawn("collectives.py", ["gloo", url], 2)):
        assert code == 0 and f"rank {rank}: ok" in out, out
    if method == "file":
        assert not (tmp_path / "store").exists()  # the last rank to finish removed it: the path is reusable


def _agent_store(world: int):
    """A store served by the test process, as kiln-run's agent serves it: it outlives the ranks, so a
    failure's diagnosis can always read it."""
    store = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    return store, {"MASTER_PORT": str(store.port), "KILN_USE_AGENT_STORE": "1"}


def _faults(fault: str, world: int, timeout: float = 20, store_env: dict | None = None):
    env = {"KILN_TEST_TIMEOUT": str(timeout), **(store_env or {})}
    return spawn("faults.py", [fault], world, env=env)


gloo_only = pytest.mark.skipif("gloo" not in ENGINES, reason="needs the gloo engine")


@gloo_only
@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("shapes", "different sizes to all_reduce"),
        ("dtypes", "different dtypes to all_reduce"),
        ("ops", "Ranks called different collectives"),
    ],
)
def test_mismatched_calls_raise_on_every_rank(fault, words):
    results = _faults(fault, 2)
    for code, out in results:
        assert code == 1 and "DistBackendError" in out and words in out, out
    if fault == "shapes":
        assert "rank 0: all_reduce(float32[3]); rank 1: all_reduce(float32[4])" in results[0][1]


@gloo_only
def test_rank_killed_mid_all_reduce_is_named_within_the_timeout():
    store, env = _agent_store(3)
    try:
        start = time.monotonic()
        results = _faults("kill", 3, timeout=20, store_env=env)
        elapsed = time.monotonic() - start
    finally:
        store.close()
    assert results[1][0] == 17
    for rank in (0, 2):
        code, out = results[rank]
        assert code == 1 and "rank 1 exited" in out, out
    assert elapsed < 20, elapsed  # a dead peer is noticed at once, not after the 20 s timeout


@gloo_only
def test_stalled_rank_fails_the_others_after_the_timeout():
    store, env = _agent_store(3)
    try:
        results = _faults("stall", 3, timeout=2, store_env={**env, "KILN_TEST_STALL": "15"})
    finally:
        store.close()
    for rank in (0, 2):
        code, out = results[rank]
        assert code == 1 and "rank 1 did not reach this call" in out and "Timed out" in out, out
        after = float(out.rsplit("[after ", 1)[1].split(" s]")[0])
        assert after < 12, out  # the 2 s timeout and the diagnosis, long before rank 1 wakes up


@gloo_only
def test_wrong_master_address_fails_within_the_timeout():
    port = free_port()  # nothing listens there
    env = {"KILN_TEST_TIMEOUT": "2", "MASTER_PORT": str(port), "KILN_USE_AGENT_STORE": "1"}
    start = time.monotonic()
    results = spawn("faults.py", ["none"], 2, env=env, timeout=60)
    assert time.monotonic() - start < 30
    for code, out in results:
        assert code == 1 and "DistNetworkError" in out and f"127.0.0.1:{port}" in out, out


@gloo_only
def test_object_collectives_refuse_arbitrary_pickles():
    results = _faults("object", 2)
    code, out = results[1]
    assert code == 1 and "cannot be decoded safely" in out and "pwned" not in out, out


def test_errors_without_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.get_rank()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.all_reduce(__import__("kiln").ones(2))
    with pytest.raises(ValueError, match="Invalid backend: 'nosuch'"):
        dist.init_process_group("nosuch", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    with pytest.raises(ValueError, match="environment variable MASTER_ADDR expected, but not set"):
        env = {k: os.environ.pop(k) for k in ("MASTER_ADDR",) if k in os.environ}
        try:
            dist.init_process_group("gloo", rank=0, world_size=1)
        finally:
            os.environ.update(env)
    with pytest.raises(ValueError, match="Cannot specify both init_method and store"):
        dist.init_process_group("gloo", init_method="env://", store=dist.HashStore(), rank=0, world_size=1)


def test_a_torchrun_launch_is_named(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.delenv("KILN_USE_AGENT_STORE", raising=False)
    with pytest.raises(RuntimeError, match=r"started by PyTorch's torchrun.*kiln-run"):
        next(dist.rendezvous(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1))


@gloo_only
def test_argument_errors_in_a_one_process_group():
    import kiln

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    try:
        with pytest.raises(ValueError, match="trying to initialize the default process group twice"):
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        with pytest.raises(TypeError, match=r"Expected parameter `tensor` of type kiln\.Tensor"):
            dist.all_reduce([1, 2])
        with pytest.raises(ValueError, match="Tensors must be contiguous"):
            dist.all_reduce(kiln.ones(3, 2).t())
        with pytest.raises(ValueError, match=r"ReduceOp\.AVG needs a floating point tensor"):
            dist.all_reduce(kiln.ones(2, dtype=kiln.int64), dist.ReduceOp.AVG)
        with pytest.raises(ValueError, match="Global rank 3 is not part of group"):
            dist.broadcast(kiln.ones(2), src=3)
        with pytest.raises(ValueError, match="tensor_list has 2 tensors, the group has 1 ranks"):
            dist.all_gather([kiln.ones(1), kiln.ones(1)], kiln.ones(1))
        with pytest.raises(ValueError, match="must be equal to world_size times input tensor size"):
            dist.all_gather_into_tensor(kiln.ones(3), kiln.ones(2))
        with pytest.raises(RuntimeError, match="No backend type associated with device type cuda"):
            dist.group.WORLD._engine("cuda")
        with pytest.raises(ValueError, match="a rank cannot send to itself"):
            dist.send(kiln.ones(1), dst=0)
        with pytest.raises(ValueError, match="Invalid ``op``"):
            dist.P2POp(dist.all_reduce, kiln.ones(1), 0)
        t = kiln.arange(4.0)
        dist.all_reduce(t)
        assert t.tolist() == [0, 1, 2, 3]
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        with pytest.warns(UserWarning, match="does not belong to the given group"):
            assert dist.all_reduce(t, group=dist.GroupMember.NON_GROUP_MEMBER) is None
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_backend_names():
    assert dist.Backend("GLOO") == "gloo" and dist.Backend.GLOO == "gloo"
    with pytest.raises(ValueError, match="Invalid backend"):
        dist.Backend("carrier-pigeon")
    assert dist.is_available()
    assert isinstance(dist.is_nccl_available(), bool)
    assert dist.get_debug_level() in tuple(dist.DebugLevel)
