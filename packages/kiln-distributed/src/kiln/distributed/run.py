"""``kiln-run`` (``python -m kiln.distributed.run``): start a distributed kiln job, as ``torchrun`` does.

::

    kiln-run --nproc-per-node 4 train.py --epochs 3                   # one node, four workers
    kiln-run --standalone --nproc-per-node auto train.py              # one node, a free port
    kiln-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 train.py
    kiln-run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --nproc-per-node 8 train.py

The options are torchrun's, under both spellings (``--nproc-per-node`` and ``--nproc_per_node``), plus
``--rdzv-timeout`` (how long nodes wait for each other; env ``KILN_RDZV_TIMEOUT``), ``--term-timeout``
(how long workers get between SIGTERM and SIGKILL; env ``KILN_TERM_TIMEOUT``) and ``--no-pmi``.

Every worker gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (its node's
rank), ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``KILN_USE_AGENT_STORE=1`` (node 0's launcher serves the job's
:class:`~kiln.distributed.store.TCPStore` at ``MASTER_ADDR:MASTER_PORT``; workers connect as clients),
``KILN_RUN_ID``, ``KILN_RESTART_COUNT`` and ``KILN_MAX_RESTARTS``; ``OMP_NUM_THREADS=1`` when several
workers share a node and it is not set. Ranks are laid out node by node: ``RANK = node_rank *
nproc_per_node + local_rank``.

Each launcher is also a PMI-1 server for its workers (``PMI_FD``, ``PMI_RANK``, ``PMI_SIZE``), so MPICH
programs it starts (mpi4py, kiln's ``mpi`` backend) form one ``MPI_COMM_WORLD`` across all nodes, as under
``mpiexec``.

When a worker fails, the others (on every node) are stopped, and the launcher reports the failed rank,
its exit code or signal, and the tail of its stderr (every worker's stderr is copied to a log file under
``--log-dir``, or a temporary directory kept when the job fails); with ``--max-restarts K`` the whole
worker group is restarted up to K times first. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to the workers
(SIGKILL after ``--term-timeout``), and the launcher exits with 128 + the signal number; a failed job
exits with 1.

This module imports neither torch nor mpi4py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from argparse import REMAINDER, ArgumentParser

from kiln.distributed.launcher import (
    Agent,
    ChildFailedError,
    LaunchConfig,
    RendezvousError,
    print_failure,
)

__all__ = ["config_from_args", "get_args_parser", "main", "parse_args", "run"]

log = logging.getLogger("kiln.distributed.run")

_DEFAULT_MASTER_PORT = 29500
_DEFAULT_C10D_PORT = 29400


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"kiln-run: error: {name}={value!r} is not a number of seconds") from None


def get_args_parser() -> ArgumentParser:
    """The argument parser of ``kiln-run`` (torchrun's options)."""
    p = ArgumentParser(
        prog="kiln-run",
        description="Start a distributed kiln job: one launcher per node starts its workers and watches them.",
    )
    p.add_argument("--nnodes", type=str, default="1", help="Number of nodes, or MIN:MAX (MIN must equal MAX).")
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=str,
        default="1",
        help="Workers per node: a number, 'auto' (the accelerator's device count, else the CPU count), "
        "'cpu' (the CPU count) or 'gpu' (the accelerator's device count).",
    )
    p.add_argument(
        "--rdzv-backend",
        "--rdzv_backend",
        type=str,
        default="static",
        help="'static' (every node passes --node-rank) or 'c10d' (node ranks handed out as nodes join).",
    )
    p.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        type=str,
        default="",
        help="HOST:PORT of the rendezvous store (node 0 serves it); an alternative to --master-addr/--master-port.",
    )
    p.add_argument("--rdzv-id", "--rdzv_id", type=str, default="none", help="The job's id (KILN_RUN_ID).")
    p.add_argument(
        "--rdzv-conf",
        "--rdzv_conf",
        type=str,
        default="",
        help="KEY=VALUE,... : join_timeout (or timeout) sets --rdzv-timeout; other keys are ignored.",
    )
    p.add_argument(
        "--rdzv-timeout",
        "--rdzv_timeout",
        type=float,
        default=None,
        help="Seconds the nodes wait to reach the store and for each other (default 600, env KILN_RDZV_TIMEOUT).",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="A single-node job on a free local port (overrides --nnodes, --master-*, --rdzv-*).",
    )
    p.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="How many times to restart the whole worker group after a failure before giving up.",
    )
    p.add_argument(
        "--monitor-interval",
        "--monitor_interval",
        type=float,
        default=0.1,
        help="Seconds between checks of the workers' state.",
    )
    p.add_argument(
        "--term-timeout",
        "--term_timeout",
        type=float,
        default=None,
        help="Seconds workers get to exit after SIGTERM before SIGKILL (default 30, env KILN_TERM_TIMEOUT).",
    )
    p.add_argument(
        "--start-method",
        "--start_method",
        type=str,
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="Accepted for torchrun's command lines; workers are always new processes.",
    )
    p.add_argument("--role", type=str, default="default", help="The workers' role name (ROLE_NAME).")
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="Run training_script as a module (python -m).",
    )
    p.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="Run training_script as an executable, not with the Python interpreter.",
    )
    p.add_argument(
        "--run-path",
        "--run_path",
        action="store_true",
        help="Run training_script with runpy.run_path in a Python worker.",
    )
    p.add_argument(
        "--log-dir",
        "--log_dir",
        type=str,
        default=None,
        help="Where the workers' logs go (<log-dir>/<run-id>/attempt_<n>/<local-rank>/); default: a "
        "temporary directory, removed when the job succeeds.",
    )
    p.add_argument(
        "-r",
        "--redirects",
        type=str,
        default="0",
        help="Send workers' streams to their log files only: 0 none, 1 stdout, 2 stderr, 3 both.",
    )
    p.add_argument(
        "-t",
        "--tee",
        type=str,
        default="0",
        help="Copy workers' streams to their log files and the console: 0 none, 1 stdout, 2 stderr, 3 both "
        "(stderr is always copied to its log file).",
    )
    p.add_argument(
        "--local-ranks-filter",
        "--local_ranks_filter",
        type=str,
        default="",
        help="Show only these local ranks' output on the console (comma-separated).",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=None,
        help="This node's rank in [0, nnodes) (default 0; handed out at rendezvous with --rdzv-backend c10d).",
    )
    p.add_argument(
        "--master-addr",
        "--master_addr",
        type=str,
        default="127.0.0.1",
        help="Address of node 0, which serves the job's store (MASTER_ADDR).",
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        help=f"Port of the job's store on node 0 (MASTER_PORT; default {_DEFAULT_MASTER_PORT}, a free port on a "
        "single node).",
    )
    p.add_argument("--local-addr", "--local_addr", type=str, default=None, help="This node's address (informational).")
    p.add_argument(
        "--no-pmi",
        "--no_pmi",
        action="store_true",
        help="Do not serve PMI to the workers (MPI programs then each start as a world of one).",
    )
    p.add_argument("training_script", type=str, help="The script (or module, or executable) each worker runs.")
    p.add_argument("training_script_args", nargs=REMAINDER)
    return p


def parse_args(args: list[str] | None) -> argparse.Namespace:
    """Parse ``kiln-run``'s command line."""
    return get_args_parser().parse_args(args)


def _nproc(value: str) -> int:
    if value in ("auto", "gpu"):
        from kiln import accelerator  # only here: it loads kiln's device plugins

        n = accelerator.device_count() if accelerator.is_available() else 0
        if n:
            return n
        if value == "gpu":
            raise ValueError("--nproc-per-node gpu, but kiln finds no accelerator")
        value = "cpu"
    if value == "cpu":
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--nproc-per-node must be a number, 'auto', 'cpu' or 'gpu', got {value!r}") from None
    if n < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {n}")
    return n


def _nnodes(value: str) -> int:
    lo, sep, hi = value.partition(":")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise ValueError(f"--nnodes must be N or MIN:MAX, got {value!r}") from None
    if a != b:
        raise ValueError(f"--nnodes {value}: elastic node counts are not supported; give MIN equal to MAX")
    if a < 1:
        raise ValueError(f"--nnodes must be at least 1, got {a}")
    return a


def _std(value: str, flag: str) -> int:
    if value not in ("0", "1", "2", "3"):
        raise ValueError(f"{flag} takes 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got {value!r}")
    return int(value)


def _endpoint(value: str, default_port: int) -> tuple[str, int | None]:
    value = value.strip()
    if value.startswith("["):  # [v6]:port
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    try:
        return host or "127.0.0.1", int(port) if port else default_port
    except ValueError:
        raise ValueError(f"--rdzv-endpoint must be HOST[:PORT], got {value!r}") from None


def config_from_args(args: argparse.Namespace) -> tuple[LaunchConfig, list[str]]:
    """Turn parsed options into a :class:`LaunchConfig` and the workers' command line."""
    nproc = _nproc(args.nproc_per_node)
    nnodes = _nnodes(args.nnodes)
    backend = args.rdzv_backend
    if backend not in ("static", "c10d"):
        raise ValueError(f"--rdzv-backend must be 'static' or 'c10d', got {backend!r}")
    rdzv_timeout = args.rdzv_timeout
    for item in filter(None, (s.strip() for s in args.rdzv_conf.split(","))):
        key, _, value = item.partition("=")
        if key in ("join_timeout", "timeout") and rdzv_timeout is None:
            rdzv_timeout = float(value)
    if rdzv_timeout is None:
        rdzv_timeout = _env_float("KILN_RDZV_TIMEOUT", 600.0)
    term_timeout = args.term_timeout if args.term_timeout is not None else _env_float("KILN_TERM_TIMEOUT", 30.0)

    master_addr, master_port = args.master_addr, args.master_port
    node_rank = args.node_rank
    if args.standalone:
        nnodes, node_rank, master_addr, master_port, backend = 1, 0, "127.0.0.1", 0, "static"
    elif args.rdzv_endpoint:
        master_addr, master_port = _endpoint(args.rdzv_endpoint, _DEFAULT_C10D_PORT)
    if master_port is None:
        master_port = 0 if nnodes == 1 else _DEFAULT_MASTER_PORT
    if node_rank is None:
        node_rank = None if (backend == "c10d" and nnodes > 1) else 0
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank must be in [0, {nnodes}), got {node_rank}")
    if rdzv_timeout <= 0 or term_timeout < 0 or args.monitor_interval <= 0:
        raise ValueError("--rdzv-timeout and --monitor-interval must be positive, --term-timeout not negative")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts must not be negative, got {args.max_restarts}")

    redirects, tee = _std(args.redirects, "--redirects"), _std(args.tee, "--tee")
    filt = None
    if args.local_ranks_filter:
        try:
            filt = {int(x) for x in args.local_ranks_filter.split(",") if x.strip()}
        except ValueError:
            raise ValueError(
                f"--local-ranks-filter takes comma-separated ranks, got {args.local_ranks_filter!r}"
            ) from None

    extra_env: dict[str, str] = {}
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        extra_env["OMP_NUM_THREADS"] = "1"
        log.info(
            "Setting OMP_NUM_THREADS=1 for each worker (several workers share this node); set it yourself to tune."
        )

    config = LaunchConfig(
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        run_id=None if args.rdzv_id in ("", "none") else args.rdzv_id,
        role=args.role,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        rdzv_timeout=rdzv_timeout,
        term_timeout=term_timeout,
        log_dir=args.log_dir,
        tee_stdout=bool(tee & 1),
        redirect_stdout=bool(redirects & 1),
        tee_stderr=not (redirects & 2) or bool(tee & 2),
        local_ranks_filter=filt,
        pmi=not args.no_pmi,
        local_addr=args.local_addr,
        extra_env=extra_env,
    )

    script, script_args = args.training_script, list(args.training_script_args)
    if args.no_python and args.module:
        raise ValueError("--no-python and -m/--module cannot be used together")
    if args.no_python:
        cmd = [script, *script_args]
    else:
        python = os.environ.get("PYTHON_EXEC", sys.executable)
        if args.run_path:
            bootstrap = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
            cmd = [python, "-u", "-c", bootstrap, script, *script_args]
        elif args.module:
            cmd = [python, "-u", "-m", script, *script_args]
        else:
            cmd = [python, "-u", script, *script_args]
    return config, cmd


def run(args: argparse.Namespace) -> int:
    """Launch the job described by parsed options; the exit code (raises :class:`ChildFailedError` or
    :class:`RendezvousError` on failure)."""
    config, cmd = config_from_args(args)
    return Agent(config, cmd, name=args.training_script).run()


def _setup_logging() -> None:
    level = os.environ.get("LOGLEVEL", "WARNING").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("kiln.distributed.run", "kiln.distributed.launcher"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(getattr(logging, level, logging.WARNING))
        lg.propagate = False


def main(args: list[str] | None = None) -> int:
    """The ``kiln-run`` command: parse ``args`` (``sys.argv[1:]``), launch, and exit with the job's code."""
    _setup_logging()
    parser = get_args_parser()
    parsed = parser.parse_args(args)
    try:
        config, cmd = config_from_args(parsed)
    except ValueError as e:
        parser.error(str(e))
    try:
        code = Agent(config, cmd, name=parsed.training_script).run()
    except (ChildFailedError, RendezvousError) as e:
        print_failure(e)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
