"""The per-node agent of kiln-run: rendezvous, start the workers, watch them, restart or report.

Every node runs one agent (one ``kiln-run`` process). The agent of node 0 serves the job's
:class:`~kiln.distributed.store.TCPStore` at ``MASTER_ADDR:MASTER_PORT``; the others, and every worker
(``KILN_USE_AGENT_STORE=1``), connect to it as clients. The agents keep their own keys under
``/kiln-run/`` in it:

``/kiln-run/run_id``                 the job's id (``KILN_RUN_ID``), chosen by node 0 unless ``--rdzv-id``
``/kiln-run/node_counter``           node ranks handed out when nodes do not pass ``--node-rank``
``/kiln-run/restart_count``          how many times the worker group has been restarted
``/kiln-run/r<A>/node<K>``           node K joined attempt A (its host and worker count)
``/kiln-run/r<A>/failed``            the first failure of attempt A: every agent stops its workers
``/kiln-run/r<A>/done<K>``           node K's workers all exited with 0
``/kiln-run/r<A>/exit<K>``           node K's agent read the outcome (node 0 serves until all have)
``/kiln-run/r<A>/pmi/...``           the PMI servers' cross-node barriers (MPI jobs)

Attempt A is the A-th run of the worker group (``KILN_RESTART_COUNT``); a failure anywhere ends the
attempt on every node, and with ``--max-restarts`` the agents rendezvous again for attempt A+1.
Each agent's store connection is registered as rank ``-1 - node_rank``, so that node 0 notices an
agent that dies without saying goodbye (:meth:`TCPStore.dead_ranks`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from kiln.distributed.errors import DistError, DistNetworkError, DistStoreError
from kiln.distributed.launcher.pmi import PMIServer, process_mapping
from kiln.distributed.launcher.workers import ProcessFailure, WorkerGroup, signal_name, watchdog
from kiln.distributed.store import TCPStore, _is_local_address

__all__ = ["Agent", "ChildFailedError", "LaunchConfig", "RendezvousError"]

log = logging.getLogger("kiln.distributed.run")

_P = "/kiln-run"
_HANDLED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


class RendezvousError(RuntimeError):
    """The nodes could not meet: the store was unreachable, a node did not join in time, or two nodes
    claimed the same node rank."""


class ChildFailedError(RuntimeError):
    """A worker failed (after any restarts); ``failures`` holds it and any other worker that failed."""

    def __init__(self, name: str, failures: list[ProcessFailure], root: ProcessFailure) -> None:
        self.name = name
        self.failures = failures
        self.root = root
        super().__init__(self.format_msg())

    def format_msg(self, width: int = 60) -> str:
        """The report, in the layout of torchrun's ``ChildFailedError``."""
        others = [f for f in self.failures if f is not self.root]
        lines = ["=" * width, f"{self.name} FAILED", "-" * width, "Failures:"]
        if others:
            for i, f in enumerate(others, 1):
                lines += [f"[{i}]:", f.format()]
        else:
            lines.append("  <NO_OTHER_FAILURES>")
        lines += ["-" * width, "Root Cause (first observed failure):", "[0]:", self.root.format(), "=" * width]
        return "\n".join(lines)


class _Interrupted(BaseException):  # a control-flow signal, like KeyboardInterrupt
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class LaunchConfig:
    """What one agent needs to know (``kiln-run``'s options, resolved)."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int | None = 0  # None: handed out at rendezvous (--rdzv-backend c10d)
    master_addr: str = "127.0.0.1"
    master_port: int = 29500  # 0: any free port (a single node only)
    run_id: str | None = None
    role: str = "default"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    rdzv_timeout: float = 600.0
    term_timeout: float = 30.0
    log_dir: str | None = None
    tee_stdout: bool = False
    redirect_stdout: bool = False
    tee_stderr: bool = True
    prefix_output: bool = True
    pmi: bool = True
    local_addr: str | None = None
    local_ranks_filter: set[int] | None = None  # only these local ranks' output reaches the console
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class _World:
    attempt: int
    nprocs: list[int]
    hosts: list[str]
    token: str  # node 0's agent's token: unique to this run of the job

    @property
    def world_size(self) -> int:
        return sum(self.nprocs)

    def first_rank(self, node: int) -> int:
        return sum(self.nprocs[:node])


@dataclass
class _Outcome:
    # "ok"; "failed" (a local worker) or "remote" (another node's): restartable; "signal" (the launcher
    # was interrupted), "lost" (a node or the store is gone), "fatal" (the command cannot start): final.
    kind: str
    failure: ProcessFailure | None = None
    others: list[ProcessFailure] = field(default_factory=list)
    signum: int = 0
    message: str = ""


class Agent:
    """Runs ``cmd`` as ``config.nproc_per_node`` workers on this node, as part of a job of
    ``config.nnodes`` nodes; :meth:`run` returns the launcher's exit code (0: every worker of every node
    succeeded) and raises :class:`ChildFailedError` / :class:`RendezvousError` on failure."""

    def __init__(self, config: LaunchConfig, cmd: list[str], name: str | None = None) -> None:
        if config.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be at least 1, got {config.nproc_per_node}")
        if config.nnodes < 1:
            raise ValueError(f"nnodes must be at least 1, got {config.nnodes}")
        if config.node_rank is not None and not 0 <= config.node_rank < config.nnodes:
            raise ValueError(f"node_rank must be in [0, {config.nnodes}), got {config.node_rank}")
        self.config = config
        self.cmd = list(cmd)
        self.name = name or (os.path.basename(cmd[0]) if cmd else "kiln-run")
        self.host = socket.gethostname()
        self.node_rank: int = config.node_rank if config.node_rank is not None else -1
        self.run_id = config.run_id or ""
        self.store: TCPStore | None = None
        self._pmi_store: TCPStore | None = None
        self.master_port = config.master_port
        self._signal = 0
        self._raise_on_signal = True
        self._group: WorkerGroup | None = None
        self._token = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._log_root: str | None = None
        self._own_log_root = False

    # -- signals --------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        if self._signal and self._group is not None:
            # A second signal while the workers are being stopped: no more grace.
            self._group.signal_all(signal.SIGKILL)
        self._signal = self._signal or signum
        if self._raise_on_signal:
            raise _Interrupted(signum)

    def _install_signals(self) -> dict:
        previous = {}
        for name in _HANDLED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            with contextlib.suppress(ValueError, OSError):  # not the main thread: leave signals alone
                previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    # -- the whole job --------------------------------------------------------------------------------
    def run(self) -> int:
        """Rendezvous, run the worker group (restarting it up to ``max_restarts`` times), and return
        the exit code: 0 on success, ``128 + signum`` when the launcher was interrupted. Raises
        :class:`ChildFailedError` when the workers failed, :class:`RendezvousError` when the nodes could
        not meet."""
        previous = self._install_signals()
        ok = False
        try:
            self._connect()
            self._setup_logs()
            for attempt in range(self.config.max_restarts + 1):
                self._raise_on_signal = True
                world = self._rendezvous(attempt)
                outcome = self._run_attempt(world)
                self._raise_on_signal = True
                if outcome.kind == "ok":
                    self._exit_barrier(attempt)
                    ok = True
                    return 0
                restartable = outcome.kind in ("failed", "remote")
                if restartable and attempt < self.config.max_restarts:
                    log.warning(
                        "[kiln-run] attempt %d failed (%s); restarting the worker group (restart %d of %d)",
                        attempt,
                        self._summary(outcome),
                        attempt + 1,
                        self.config.max_restarts,
                    )
                    if self.node_rank == 0:
                        self.store.set(f"{_P}/restart_count", str(attempt + 1))
                    continue
                self._exit_barrier(attempt)
                return self._give_up(outcome)
            raise AssertionError("unreachable")
        except _Interrupted as e:
            log.warning("[kiln-run] received %s; exiting", signal_name(e.signum))
            return 128 + e.signum
        finally:
            self._raise_on_signal = False
            for sig, handler in previous.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(sig, handler)
            self._close(ok)

    def _summary(self, outcome: _Outcome) -> str:
        f = outcome.failure
        if f is None:
            return outcome.message or outcome.kind
        return f"rank {f.rank} on node {f.node_rank} ({f.host}) failed with {f.describe_exit()}"

    def _give_up(self, outcome: _Outcome) -> int:
        if outcome.kind == "signal":
            log.warning("[kiln-run] %s; the workers were stopped", outcome.message)
            return 128 + outcome.signum
        if outcome.kind == "lost":
            raise RendezvousError(outcome.message)
        root = outcome.failure
        if root is None:
            raise RendezvousError(outcome.message or "the job failed")
        failures = [root, *outcome.others]
        raise ChildFailedError(self.name, failures, root)

    # -- the store ------------------------------------------------------------------------------------
    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.config.rdzv_timeout)

    def _connect(self) -> None:
        c = self.config
        where = f"{c.master_addr}:{c.master_port}"
        if self.node_rank == 0 or (c.node_rank is None and c.nnodes == 1):
            try:
                self.store = TCPStore(
                    c.master_addr, c.master_port, is_master=True, wait_for_workers=False, timeout=self._timeout()
                )
            except DistNetworkError as e:
                raise RendezvousError(
                    f"node 0 could not serve the rendezvous store at {where}: {e}. Is --master-addr an address "
                    "of this machine, and is --master-port free?"
                ) from e
            self.node_rank = 0
        elif c.node_rank is None:
            # No --node-rank (--rdzv-backend c10d): the node whose address the endpoint names serves the
            # store and is node 0 (if its port is taken, another launcher here got there first).
            served = False
            if _is_local_address(c.master_addr):
                try:
                    self.store = TCPStore(
                        c.master_addr, c.master_port, is_master=True, wait_for_workers=False, timeout=self._timeout()
                    )
                    served = True
                except DistNetworkError:
                    pass
            if served:
                self.node_rank = 0
            else:
                self.store = self._client_store()
                n = self.store.add(f"{_P}/node_counter", 1)
                if n >= c.nnodes:
                    raise RendezvousError(
                        f"more nodes joined the rendezvous at {where} than --nnodes {c.nnodes}"
                    ) from None
                self.node_rank = n
        else:
            self.store = self._client_store()
        self.master_port = self.store.port
        if not self.run_id:
            if self.node_rank == 0:
                self.run_id = uuid.uuid4().hex[:12]
                self.store.set(f"{_P}/run_id", self.run_id)
            else:
                self.run_id = self._wait_get(f"{_P}/run_id", "the job's run id from node 0").decode()
        if c.nnodes > 1 and c.pmi:
            self._pmi_store = self._client_store()

    def _client_store(self) -> TCPStore:
        c = self.config
        try:
            return TCPStore(c.master_addr, c.master_port, is_master=False, timeout=self._timeout())
        except DistNetworkError as e:
            raise RendezvousError(
                f"node {self.node_rank if self.node_rank >= 0 else '?'} could not reach the rendezvous store "
                f"at {c.master_addr}:{c.master_port} within {c.rdzv_timeout:g} s: is node 0's kiln-run "
                "running, and are --master-addr/--master-port (or --rdzv-endpoint) right?"
            ) from e

    def _wait_get(self, key: str, what: str) -> bytes:
        deadline = time.monotonic() + self.config.rdzv_timeout
        while True:
            try:
                self.store.wait([key], min(1.0, max(0.01, deadline - time.monotonic())))
                return self.store.get(key)
            except DistStoreError:
                if time.monotonic() >= deadline:
                    raise RendezvousError(
                        f"timed out after {self.config.rdzv_timeout:g} s waiting for {what}"
                    ) from None

    def _close(self, ok: bool) -> None:
        watchdog.close()
        for s in (self._pmi_store, self.store):
            if s is not None:
                with contextlib.suppress(DistError, OSError):
                    s.close()
        self._pmi_store = self.store = None
        if ok and self._own_log_root and self._log_root:
            shutil.rmtree(self._log_root, ignore_errors=True)

    def _setup_logs(self) -> None:
        if self.config.log_dir:
            self._log_root = os.path.join(self.config.log_dir, self.run_id)
            os.makedirs(self._log_root, exist_ok=True)
        else:
            self._log_root = tempfile.mkdtemp(prefix=f"kiln-run-{self.run_id}-")
            self._own_log_root = True

    # -- rendezvous -----------------------------------------------------------------------------------
    def _rendezvous(self, attempt: int) -> _World:
        c = self.config
        base = f"{_P}/r{attempt}"
        me = json.dumps(
            {
                "host": self.host,
                "nproc": c.nproc_per_node,
                "token": self._token,
                "nnodes": c.nnodes,
                "max_restarts": c.max_restarts,
            }
        )
        got = self.store.compare_set(f"{base}/node{self.node_rank}", "", me).decode()
        if got != me:
            other = json.loads(got)
            raise RendezvousError(
                f"node rank {self.node_rank} was already taken by kiln-run on {other.get('host')} "
                f"({other.get('token')}): give every node its own --node-rank"
            )
        if attempt == 0:  # the node rank is ours: node 0 now notices if this agent dies
            self.store.register_rank(-1 - self.node_rank)
        keys = [f"{base}/node{n}" for n in range(c.nnodes)]
        deadline = time.monotonic() + c.rdzv_timeout
        while True:
            try:
                self.store.wait(keys, min(1.0, max(0.01, deadline - time.monotonic())))
                break
            except DistStoreError:
                if time.monotonic() < deadline:
                    continue
                missing = [n for n, k in enumerate(keys) if not self.store.check([k])]
                raise RendezvousError(
                    f"rendezvous timed out after {c.rdzv_timeout:g} s: {c.nnodes - len(missing)} of {c.nnodes} "
                    f"nodes joined; node rank(s) {missing} did not (is --nnodes right, did every node start "
                    f"kiln-run with its own --node-rank and the same master address {c.master_addr}:"
                    f"{self.master_port}?)"
                ) from None
            except DistNetworkError as e:
                raise RendezvousError(f"lost the rendezvous store during rendezvous: {e}") from e
        infos = [json.loads(self.store.get(k)) for k in keys]
        for what, mine in (("nnodes", c.nnodes), ("max_restarts", c.max_restarts)):
            theirs = {n: i.get(what) for n, i in enumerate(infos) if i.get(what) != mine}
            if theirs:
                flag = "--" + what.replace("_", "-")
                raise RendezvousError(
                    f"the nodes disagree on {flag}: this node (node rank {self.node_rank}) has {mine}, "
                    f"node rank(s) {theirs} have something else; give every node the same {flag}"
                )
        return _World(
            attempt, [int(i["nproc"]) for i in infos], [str(i["host"]) for i in infos], str(infos[0]["token"])
        )

    # -- one attempt ----------------------------------------------------------------------------------
    def _worker_env(self, world: _World, local_rank: int) -> dict[str, str]:
        c = self.config
        rank = world.first_rank(self.node_rank) + local_rank
        env = dict(os.environ)
        for k in ("PMI_FD", "PMI_PORT", "PMI_ID", "PMI_RANK", "PMI_SIZE", "PMI_SPAWNED"):
            env.pop(k, None)
        env.update(c.extra_env)
        env.update(
            LOCAL_RANK=str(local_rank),
            RANK=str(rank),
            GROUP_RANK=str(self.node_rank),
            ROLE_RANK=str(rank),
            ROLE_NAME=c.role,
            LOCAL_WORLD_SIZE=str(c.nproc_per_node),
            WORLD_SIZE=str(world.world_size),
            ROLE_WORLD_SIZE=str(world.world_size),
            GROUP_WORLD_SIZE=str(c.nnodes),
            MASTER_ADDR=c.master_addr,
            MASTER_PORT=str(self.master_port),
            KILN_USE_AGENT_STORE="1",
            KILN_RUN_ID=self.run_id,
            KILN_RESTART_COUNT=str(world.attempt),
            KILN_MAX_RESTARTS=str(c.max_restarts),
        )
        return env

    def _run_attempt(self, world: _World) -> _Outcome:
        c = self.config
        a = world.attempt
        base = f"{_P}/r{a}"
        pmi = None
        if c.pmi:
            pmi = PMIServer(
                world_size=world.world_size,
                # Unique per attempt and per run (MPICH names shared-memory segments after it).
                kvsname=re.sub(r"[^A-Za-z0-9_-]", "_", f"kiln_{self.run_id[:40]}_{a}_{world.token.rsplit(':', 1)[-1]}"),
                mapping=process_mapping(world.nprocs),
                node_rank=self.node_rank,
                nnodes=c.nnodes,
                store=self._pmi_store,
                prefix=f"{base}/pmi",
            )
        group = self._group = WorkerGroup()
        self._raise_on_signal = False
        if self._signal:  # a signal that came in during rendezvous
            return _Outcome("signal", signum=self._signal, message=f"received {signal_name(self._signal)}")
        try:
            first = world.first_rank(self.node_rank)
            for lr in range(c.nproc_per_node):
                env = self._worker_env(world, lr)
                shown = c.local_ranks_filter is None or lr in c.local_ranks_filter
                fds: tuple[int, ...] = ()
                if pmi is not None:
                    fd = pmi.add_worker(first + lr)
                    fds = (fd,)
                    env.update(
                        PMI_FD=str(fd),
                        PMI_RANK=str(first + lr),
                        PMI_SIZE=str(world.world_size),
                        PMI_HOSTNAME=self.host,
                        MPI_LOCALNRANKS=str(c.nproc_per_node),
                        MPI_LOCALRANKID=str(lr),
                    )
                group.start(
                    local_rank=lr,
                    rank=first + lr,
                    cmd=self.cmd,
                    env=env,
                    log_dir=os.path.join(self._log_root, f"attempt_{a}", str(lr)),
                    tee_stdout=c.tee_stdout and shown,
                    redirect_stdout=c.redirect_stdout or (c.tee_stdout and not shown),
                    tee_stderr=c.tee_stderr and shown,
                    pass_fds=fds,
                    prefix=c.prefix_output,
                )
            if pmi is not None:
                pmi.close_worker_ends()
                pmi.start()
            return self._monitor(world, group, pmi)
        except OSError as e:  # the command could not be started at all
            group.stop(signal.SIGTERM, c.term_timeout)
            failure = ProcessFailure(
                rank=world.first_rank(self.node_rank) + len(group.workers),
                local_rank=len(group.workers),
                pid=-1,
                exitcode=127,
                node_rank=self.node_rank,
                host=self.host,
                message=f"could not start {self.cmd[0]!r}: {e}",
            )
            self._publish(base, {"kind": "fatal", "message": f"node {self.node_rank}: {failure.message}"})
            return _Outcome("fatal", failure=failure, message=failure.message)
        finally:
            self._group = None
            group.release()
            if pmi is not None:
                pmi.stop()

    def _publish(self, base: str, payload: dict) -> dict:
        """Post this attempt's failure unless one is posted already; return the one that stands."""
        if self.config.nnodes == 1:
            return payload
        mine = json.dumps(payload)
        try:
            got = self.store.compare_set(f"{base}/failed", "", mine).decode()
            return json.loads(got)
        except (DistError, OSError, ValueError):
            return payload

    def _monitor(self, world: _World, group: WorkerGroup, pmi: PMIServer | None) -> _Outcome:
        c = self.config
        base = f"{_P}/r{world.attempt}"
        multi = c.nnodes > 1
        done_posted = False
        next_dead_check = 0.0
        done_keys = [f"{base}/done{n}" for n in range(c.nnodes)]
        while True:
            if self._signal:
                sig = self._signal
                msg = f"kiln-run on node {self.node_rank} ({self.host}) received {signal_name(sig)}"
                self._publish(base, {"kind": "signal", "node_rank": self.node_rank, "message": msg})
                group.stop(sig, c.term_timeout)
                return _Outcome("signal", signum=sig, message=msg)

            failed, all_ok = group.poll()
            if all_ok and pmi is not None:
                pmi.drain()  # an MPI_Abort sent just before a clean exit still counts
            aborts = list(pmi.aborts) if pmi is not None else []
            if failed or aborts:
                return self._local_failure(base, group, failed, aborts)
            if pmi is not None and pmi.error:
                group.stop(signal.SIGTERM, c.term_timeout)
                msg = f"node {self.node_rank}: {pmi.error}"
                self._publish(base, {"kind": "lost", "message": msg})
                return _Outcome("lost", message=msg)

            if all_ok and not multi:
                return _Outcome("ok")
            if multi:
                try:
                    if all_ok and not done_posted:
                        self.store.set(done_keys[self.node_rank], "1")
                        done_posted = True
                    if self.store.check([f"{base}/failed"]):
                        return self._remote_failure(base, group)
                    if done_posted and self.store.check(done_keys):
                        return _Outcome("ok")
                    if self.node_rank == 0 and time.monotonic() >= next_dead_check:
                        next_dead_check = time.monotonic() + 0.5
                        dead = sorted(-1 - r for r in (self.store.dead_ranks() or []) if r < 0)
                        if dead:
                            msg = (
                                f"lost the kiln-run agent(s) of node(s) {dead}: the launcher process exited "
                                "without a word (killed?)"
                            )
                            self._publish(base, {"kind": "lost", "message": msg})
                            group.stop(signal.SIGTERM, c.term_timeout)
                            return _Outcome("lost", message=msg)
                except DistNetworkError as e:
                    group.stop(signal.SIGTERM, c.term_timeout)
                    return _Outcome(
                        "lost",
                        message=f"node {self.node_rank} lost the rendezvous store (node 0's kiln-run is gone?): {e}",
                    )
            time.sleep(c.monitor_interval)

    def _local_failure(self, base, group: WorkerGroup, failed, aborts) -> _Outcome:
        c = self.config
        by_rank = {w.rank: w for w in group.workers}
        failures: dict[int, ProcessFailure] = {w.rank: w.failure(self.node_rank, self.host) for w in failed}
        for ab in aborts:
            f = failures.get(ab.rank)
            if f is None:  # MPI_Abort from a worker that has not exited (yet)
                f = failures[ab.rank] = by_rank[ab.rank].failure(self.node_rank, self.host)
                if f.exitcode <= 0:
                    f.exitcode = ab.exitcode
            f.message = f"MPI_Abort (PMI abort, exit code {ab.exitcode}): {ab.message}".rstrip(": ")
        root = failures[failed[0].rank if failed else aborts[0].rank]
        # Tell the other nodes first, then stop this node's workers (which may take --term-timeout).
        standing = self._publish(base, {"kind": "worker", "failure": root.to_dict()})
        group.stop(signal.SIGTERM, c.term_timeout)
        for f in failures.values():  # the stderr of an aborting worker may have grown until it exited
            if not f.stderr_tail or f.rank in {ab.rank for ab in aborts}:
                f.stderr_tail = by_rank[f.rank].failure(self.node_rank, self.host).stderr_tail
        others = [f for f in failures.values() if f is not root]
        if standing.get("kind") == "worker" and standing["failure"].get("node_rank") != self.node_rank:
            # Another node failed first: that is the root cause, ours came after (likely because of it).
            remote = ProcessFailure.from_dict(standing["failure"])
            return _Outcome("remote", failure=remote, others=list(failures.values()))
        return _Outcome("failed", failure=root, others=others)

    def _remote_failure(self, base: str, group: WorkerGroup) -> _Outcome:
        payload = json.loads(self.store.get(f"{base}/failed"))
        group.stop(signal.SIGTERM, self.config.term_timeout)
        kind = payload.get("kind")
        if kind == "worker":
            f = ProcessFailure.from_dict(payload["failure"])
            log.warning(
                "[kiln-run] rank %d on node %d (%s) failed with %s; stopped this node's workers",
                f.rank,
                f.node_rank,
                f.host,
                f.describe_exit(),
            )
            return _Outcome("remote", failure=f)
        msg = payload.get("message", "another node failed")
        # A node interrupted by a signal, or one that lost contact: the job cannot go on.
        return _Outcome("lost", message=msg)

    # -- the end --------------------------------------------------------------------------------------
    def _exit_barrier(self, attempt: int) -> None:
        """Tell node 0 this node read the outcome; node 0 keeps serving the store until every node has
        (or a timeout passes), so that no node loses the store before it knows how the job ended."""
        if self.config.nnodes == 1 or self.store is None:
            return
        base = f"{_P}/r{attempt}"
        try:
            self.store.set(f"{base}/exit{self.node_rank}", "1")
            if self.node_rank != 0:
                return
            keys = [f"{base}/exit{n}" for n in range(self.config.nnodes)]
            deadline = time.monotonic() + self.config.term_timeout + 15.0
            while time.monotonic() < deadline:
                try:
                    self.store.wait(keys, 0.25)
                    return
                except DistStoreError:
                    dead = {-1 - r for r in (self.store.dead_ranks() or []) if r < 0}
                    waiting = {n for n, k in enumerate(keys) if not self.store.check([k])}
                    if waiting <= dead:
                        return
        except (DistError, OSError):
            return


def print_failure(err: BaseException) -> None:
    """Print ``err`` (a failure report or a rendezvous error) to stderr."""
    text = err.format_msg() if isinstance(err, ChildFailedError) else f"kiln-run: error: {err}"
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
