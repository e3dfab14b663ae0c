"""kiln-run (kiln.distributed.run): the workers' environment, failure reports, restarts, signals, several
nodes on one machine, rendezvous timeouts, and MPI worlds through the launcher's PMI server.

Every launcher runs as a subprocess with a timeout; the worker scripts live in launch_scripts/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.distributed.launcher.pmi import _parse, process_mapping
from kiln.distributed.run import config_from_args, parse_args

SCRIPTS = Path(__file__).parent / "launch_scripts"
PY = sys.executable
HAS_MPI4PY = importlib.util.find_spec("mpi4py") is not None


@pytest.fixture(autouse=True)
def _launcher_tmpdir(tmp_path, monkeypatch):
    """The launchers keep the logs of failed jobs in a temporary directory: make it this test's."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_cmd(*args: str, module: bool = False) -> list[str]:
    if module:
        return [PY, "-m", "kiln.distributed.run", *args]
    return [PY, "-c", "from kiln.distributed.run import main; main()", *args]


def _run(*args: str, timeout: float = 30, module: bool = False, env: dict | None = None):
    return subprocess.run(
        _launch_cmd(*args, module=module),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def _start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        _launch_cmd(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **(env or {})),
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody reaped yet is gone too
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
    return False


def _wait_gone(pids, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return all(_gone(p) for p in pids)


def _records(d: Path, n: int) -> list[dict]:
    return [json.loads((d / f"rank{r}.json").read_text()) for r in range(n)]


# -- the command line ---------------------------------------------------------------------------------


def test_options_take_both_spellings_like_torchrun():
    a = parse_args(["--nproc-per-node", "2", "--max-restarts", "1", "--node-rank", "1", "--nnodes", "2", "t.py", "-x"])
    b = parse_args(["--nproc_per_node", "2", "--max_restarts", "1", "--node_rank", "1", "--nnodes", "2", "t.py", "-x"])
    assert vars(a) == vars(b)
    config, cmd = config_from_args(a)
    assert (config.nproc_per_node, config.nnodes, config.node_rank, config.max_restarts) == (2, 2, 1, 1)
    assert config.master_port == 29500 and config.master_addr == "127.0.0.1"
    assert cmd == [sys.executable, "-u", "t.py", "-x"]
    assert config.extra_env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS")) is not None


def test_option_forms():
    config, cmd = config_from_args(parse_args(["--rdzv-endpoint", "10.1.2.3:1234", "--nnodes", "3:3", "-m", "pkg.mod"]))
    assert (config.master_addr, config.master_port, config.nnodes) == ("10.1.2.3", 1234, 3)
    assert cmd == [sys.executable, "-u", "-m", "pkg.mod"]
    config, cmd = config_from_args(parse_args(["--standalone", "--nnodes", "4", "--no-python", "/bin/true", "a"]))
    assert (config.nnodes, config.node_rank, config.master_port) == (1, 0, 0)
    assert cmd == ["/bin/true", "a"]
    config, cmd = config_from_args(parse_args(["--run-path", "--rdzv_conf", "join_timeout=7", "s.py"]))
    assert config.rdzv_timeout == 7 and cmd[:3] == [sys.executable, "-u", "-c"] and cmd[-1] == "s.py"
    config, _ = config_from_args(parse_args(["--nnodes", "2", "--rdzv-backend", "c10d", "s.py"]))
    assert config.node_rank is None  # handed out at rendezvous
    config, _ = config_from_args(parse_args(["-t", "3", "-r", "2", "--local-ranks-filter", "0", "s.py"]))
    assert config.tee_stdout and config.tee_stderr and config.local_ranks_filter == {0}
    config, _ = config_from_args(parse_args(["-r", "3", "s.py"]))
    assert config.redirect_stdout and not config.tee_stderr and not config.tee_stdout
    for bad in (["--nnodes", "1:2", "s.py"], ["--no-python", "-m", "s"], ["--nproc-per-node", "x", "s.py"]):
        with pytest.raises(ValueError):
            config_from_args(parse_args(bad))
    r = _run("--nnodes", "1:4", "s.py", timeout=30)
    assert r.returncode == 2 and "elastic" in r.stderr


def test_pmi_wire_helpers():
    assert process_mapping([4]) == "(vector,(0,1,4))"
    assert process_mapping([2, 2, 2]) == "(vector,(0,3,2))"
    assert process_mapping([2, 3]) == "(vector,(0,1,2),(1,1,3))"
    assert _parse("cmd=put kvsname=k key=x value=a=b") == {"cmd": "put", "kvsname": "k", "key": "x", "value": "a=b"}
    assert _parse("cmd=abort exitcode=7 message=it went wrong")["message"] == "it went wrong"


def test_run_does_not_import_torch_or_mpi4py():
    code = "import sys, kiln.distributed.run; print('torch' in sys.modules, 'mpi4py' in sys.modules)"
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


# -- one node -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
def test_worker_environment(tmp_path, n):
    r = _run("--nproc-per-node", str(n), "--standalone", str(SCRIPTS / "env_worker.py"), str(tmp_path), "arg1",
             module=(n == 3))  # fmt: skip
    assert r.returncode == 0, r.stderr
    recs = _records(tmp_path, n)
    for rank, rec in enumerate(recs):
        assert rec["RANK"] == rec["ROLE_RANK"] == rec["LOCAL_RANK"] == rec["PMI_RANK"] == str(rank)
        assert rec["WORLD_SIZE"] == rec["LOCAL_WORLD_SIZE"] == rec["PMI_SIZE"] == str(n)
        assert rec["GROUP_RANK"] == "0" and rec["GROUP_WORLD_SIZE"] == "1" and rec["ROLE_NAME"] == "default"
        assert rec["MASTER_ADDR"] == "127.0.0.1" and int(rec["MASTER_PORT"]) > 0
        assert rec["KILN_USE_AGENT_STORE"] == "1" and rec["KILN_RESTART_COUNT"] == "0"
        assert rec["PMI_FD"] is not None and rec["argv"] == ["arg1"]
    assert len({rec["KILN_RUN_ID"] for rec in recs}) == 1 and recs[0]["KILN_RUN_ID"]
    assert len({rec["MASTER_PORT"] for rec in recs}) == 1
    for rank in range(n):  # stderr is teed to the launcher's, prefixed
        assert f"[rank{rank}]:env_worker rank {rank} done" in r.stderr


def test_failing_rank_stops_the_others_and_is_reported(tmp_path):
    t0 = time.monotonic()
    r = _run("--nproc-per-node", "3", "--standalone", str(SCRIPTS / "fail_worker.py"), str(tmp_path), "1", "exit")
    assert time.monotonic() - t0 < 20  # the others sleep 60 s: they were stopped
    assert r.returncode == 1
    err = r.stderr
    assert "fail_worker.py FAILED" in err
    assert "rank      : 1 (local_rank: 1)" in err
    assert "exitcode  : 3" in err
    assert "ValueError: the last words" in err.split("Root Cause")[1]  # the stderr tail is in the report
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(3)]
    assert _wait_gone(pids)


def test_rank_killed_by_a_signal_is_reported_by_signal(tmp_path):
    r = _run("--nproc-per-node", "2", "--standalone", str(SCRIPTS / "fail_worker.py"), str(tmp_path), "1", "kill")
    assert r.returncode == 1
    assert "SIGKILL" in r.stderr and "exitcode  : -9" in r.stderr
    assert "rank      : 1 (local_rank: 1)" in r.stderr


def test_max_restarts_restarts_then_succeeds(tmp_path):
    r = _run("--nproc-per-node", "2", "--standalone", "--max-restarts", "2", str(SCRIPTS / "flaky_worker.py"),
             str(tmp_path), "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "restarting the worker group" in r.stderr
    names = sorted(p.name for p in tmp_path.glob("attempt*"))
    assert names == ["attempt0_rank0", "attempt0_rank1", "attempt1_rank0", "attempt1_rank1"]


def test_max_restarts_gives_up(tmp_path):
    log_dir = tmp_path / "logs"
    r = _run("--nproc-per-node", "2", "--standalone", "--max-restarts", "1", "--log-dir", str(log_dir),
             str(SCRIPTS / "flaky_worker.py"), str(tmp_path), "0", "always")  # fmt: skip
    assert r.returncode == 1
    assert "exitcode  : 5" in r.stderr and "fails on purpose" in r.stderr
    assert len(list(tmp_path.glob("attempt*_rank0"))) == 2
    assert list(log_dir.glob("*/attempt_1/0/stderr.log"))  # logs of both attempts, per local rank


def test_sigterm_stops_workers_and_their_children(tmp_path):
    p = _start("--nproc-per-node", "2", "--standalone", "--term-timeout", "1", str(SCRIPTS / "sleep_worker.py"),
               str(tmp_path), "ignore-term")  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.05)
        pids = [int(x) for r in range(2) for x in (tmp_path / f"pid{r}").read_text().split()]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert _wait_gone(pids), pids  # rank 0 ignored SIGTERM: it got SIGKILL; the grandchildren went too


def test_launcher_killed_leaves_no_orphans(tmp_path):
    p = _start("--nproc-per-node", "2", "--standalone", str(SCRIPTS / "sleep_worker.py"), str(tmp_path))
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        pids = [int(x) for r in range(2) for x in (tmp_path / f"pid{r}").read_text().split()]
        p.kill()  # SIGKILL: no chance to stop anything; the parent-death signal and the watchdog do it
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert _wait_gone(pids)  # the workers and the processes they started


def test_no_python_and_run_path(tmp_path):
    r = _run("--nproc-per-node", "2", "--standalone", "--no-python", "sh", "-c", 'echo "r$RANK/$WORLD_SIZE"')
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["r0/2", "r1/2"], r.stderr
    r = _run("--standalone", "--run-path", str(SCRIPTS / "env_worker.py"), str(tmp_path), "x")
    assert r.returncode == 0, r.stderr
    assert _records(tmp_path, 1)[0]["argv"] == ["x"]
    r = _run("--standalone", "--no-python", str(tmp_path / "no-such-program"))
    assert r.returncode == 1 and "could not start" in r.stderr


# -- several nodes on this machine --------------------------------------------------------------------


def _two_nodes(extra0: list[str], extra1: list[str], script: list[str], timeout: float = 40):
    port = str(_free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-timeout", "20"]
    p0 = _start(*common, "--node-rank", "0", *extra0, *script)
    p1 = _start(*common, "--node-rank", "1", *extra1, *script)
    try:
        out0 = p0.communicate(timeout=timeout)
        out1 = p1.communicate(timeout=timeout)
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
                p.wait(5)
    return (p0.returncode, *out0), (p1.returncode, *out1)


def test_two_nodes(tmp_path):
    (rc0, _, err0), (rc1, _, err1) = _two_nodes(
        ["--nproc-per-node", "2"],
        ["--nproc-per-node", "2"],
        [str(SCRIPTS / "env_worker.py"), str(tmp_path), "--use-store"],
    )
    assert rc0 == 0 and rc1 == 0, err0 + err1
    recs = _records(tmp_path, 4)
    for rank, rec in enumerate(recs):
        assert rec["RANK"] == str(rank) and rec["WORLD_SIZE"] == "4" and rec["LOCAL_WORLD_SIZE"] == "2"
        assert rec["GROUP_RANK"] == str(rank // 2) and rec["LOCAL_RANK"] == str(rank % 2)
        assert rec["GROUP_WORLD_SIZE"] == "2"
        # every worker reached node 0's store and saw the others' keys
        assert rec["store_nodes"] == ["0", "0", "1", "1"]
    assert len({rec["KILN_RUN_ID"] for rec in recs}) == 1
    assert len({rec["MASTER_PORT"] for rec in recs}) == 1


def test_two_nodes_failure_stops_both(tmp_path):
    t0 = time.monotonic()
    (rc0, _, err0), (rc1, _, err1) = _two_nodes(
        ["--nproc-per-node", "2"],
        ["--nproc-per-node", "2"],
        [str(SCRIPTS / "fail_worker.py"), str(tmp_path), "3", "exit"],
    )
    assert time.monotonic() - t0 < 30
    assert rc0 == 1 and rc1 == 1
    assert "rank      : 3 (local_rank: 1)" in err1 and "the last words" in err1
    assert "rank 3 on node 1" in err0 or "rank      : 3" in err0  # node 0 names the failure too
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(4)]
    assert _wait_gone(pids)


def test_two_nodes_restart_together(tmp_path):
    (rc0, _, err0), (rc1, _, err1) = _two_nodes(
        ["--nproc-per-node", "1", "--max-restarts", "1"],
        ["--nproc-per-node", "1", "--max-restarts", "1"],
        [str(SCRIPTS / "flaky_worker.py"), str(tmp_path), "1"],
    )
    assert rc0 == 0 and rc1 == 0, err0 + err1
    names = sorted(p.name for p in tmp_path.glob("attempt*"))
    assert names == ["attempt0_rank0", "attempt0_rank1", "attempt1_rank0", "attempt1_rank1"]


def test_node_agent_killed_stops_the_job(tmp_path):
    port = str(_free_port())
    common = ["--nnodes", "2", "--master-port", port, "--rdzv-timeout", "10", "--term-timeout", "2"]
    script = [str(SCRIPTS / "sleep_worker.py"), str(tmp_path)]
    p0 = _start(*common, "--node-rank", "0", *script)
    p1 = _start(*common, "--node-rank", "1", *script)
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p0.poll() is None and p1.poll() is None
            time.sleep(0.05)
        pids = [int(x) for r in range(2) for x in (tmp_path / f"pid{r}").read_text().split()]
        p1.kill()  # node 1's launcher dies without a word; node 0 must notice and stop its worker
        p1.wait(10)
        _, err0 = p0.communicate(timeout=20)
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert p0.returncode == 1 and "lost the kiln-run agent(s) of node(s) [1]" in err0
    assert _wait_gone(pids)


def test_c10d_rendezvous_hands_out_node_ranks(tmp_path):
    port = str(_free_port())
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "20"]
    procs = [_start(*args, str(SCRIPTS / "env_worker.py"), str(tmp_path)) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=40) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(rec["GROUP_RANK"] for rec in _records(tmp_path, 2)) == ["0", "1"]


def test_missing_node_times_out():
    t0 = time.monotonic()
    r = _run("--nnodes", "2", "--node-rank", "0", "--master-port", str(_free_port()), "--rdzv-timeout", "2",
             str(SCRIPTS / "env_worker.py"), "/nonexistent")  # fmt: skip
    assert time.monotonic() - t0 < 20
    assert r.returncode == 1
    assert "rendezvous timed out" in r.stderr and "[1]" in r.stderr


def test_wrong_master_address_times_out():
    t0 = time.monotonic()
    r = _run("--nnodes", "2", "--node-rank", "1", "--master-port", str(_free_port()), "--rdzv-timeout", "2",
             str(SCRIPTS / "env_worker.py"), "/nonexistent")  # fmt: skip
    assert time.monotonic() - t0 < 20
    assert r.returncode == 1
    assert "could not reach the rendezvous store" in r.stderr


def test_node_rank_taken_twice_and_port_in_use(tmp_path):
    port = str(_free_port())
    common = ["--nnodes", "2", "--master-port", port, "--rdzv-timeout", "10", "--term-timeout", "2"]
    script = [str(SCRIPTS / "sleep_worker.py"), str(tmp_path)]
    p0 = _start(*common, "--node-rank", "0", *script)
    p1 = _start(*common, "--node-rank", "1", *script)
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and p0.poll() is None and p1.poll() is None
            time.sleep(0.05)
        r = _run(*common, "--node-rank", "1", "--no-python", "true")
        assert r.returncode == 1 and "node rank 1 was already taken" in r.stderr
        r = _run(*common, "--node-rank", "0", "--no-python", "true")
        assert r.returncode == 1 and "could not serve the rendezvous store" in r.stderr
        assert p0.poll() is None and p1.poll() is None  # the intruders did not disturb the job
        pids = [int(x) for r in range(2) for x in (tmp_path / f"pid{r}").read_text().split()]
        p1.send_signal(signal.SIGTERM)  # one node interrupted: both stop
        _, err0 = p0.communicate(timeout=20)
        p1.communicate(timeout=20)
    finally:
        for p in (p0, p1):
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert p1.returncode == 128 + signal.SIGTERM
    assert p0.returncode == 1 and "received SIGTERM" in err0
    assert _wait_gone(pids)


# -- MPI through the launcher's PMI server -------------------------------------------------------------


@pytest.mark.skipif(not HAS_MPI4PY, reason="mpi4py is not installed")
def test_mpi_allreduce_three_workers(tmp_path):
    r = _run("--nproc-per-node", "3", "--standalone", str(SCRIPTS / "mpi_worker.py"), str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        rec = json.loads((tmp_path / f"mpi{rank}.json").read_text())
        assert rec["rank"] == rank and rec["size"] == 3 and rec["env_rank"] == str(rank)
        assert rec["sum"] == [6.0, 30.0] and rec["obj"] == 3


@pytest.mark.skipif(not HAS_MPI4PY, reason="mpi4py is not installed")
def test_mpi_world_across_two_nodes(tmp_path):
    (rc0, _, err0), (rc1, _, err1) = _two_nodes(
        ["--nproc-per-node", "2"],
        ["--nproc-per-node", "1"],
        [str(SCRIPTS / "mpi_worker.py"), str(tmp_path)],
        timeout=60,
    )
    assert rc0 == 0 and rc1 == 0, err0 + err1
    for rank in range(3):
        rec = json.loads((tmp_path / f"mpi{rank}.json").read_text())
        assert rec["rank"] == rank and rec["size"] == 3
        assert rec["sum"] == [6.0, 30.0] and rec["obj"] == 3


@pytest.mark.skipif(not HAS_MPI4PY, reason="mpi4py is not installed")
def test_mpi_abort_is_reported(tmp_path):
    r = _run(
        "--nproc-per-node", "2", "--standalone", str(SCRIPTS / "mpi_worker.py"), str(tmp_path), "abort", timeout=60
    )
    assert r.returncode == 1
    assert "rank      : 1" in r.stderr and "MPI_Abort" in r.stderr
