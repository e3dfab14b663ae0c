"""The worker processes of one node: start them, copy their output, watch them, stop them.

Each worker runs in a session of its own (``start_new_session``), so that a terminal's Ctrl-C reaches
only the launcher (which forwards it) and so that stopping a worker stops whatever it started too (the
signal goes to its process group). On Linux a worker also gets ``SIGKILL`` if the launcher dies
without stopping it (``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the launcher leaves no orphans.

A worker's stderr always goes through a pipe to a log file and, line by line with a ``[rankN]:``
prefix, to the launcher's stderr; the failure report quotes the file's tail. Its stdout is inherited
unless ``--tee``/``--redirects`` ask for it to be captured too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["ProcessFailure", "Worker", "WorkerGroup", "signal_name", "tail_of"]

_LINE_LIMIT = 1 << 16  # an unterminated line longer than this is written out anyway
_console_lock = threading.Lock()


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"`` (``"signal 64"`` for a number without a name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def tail_of(path: str | None, lines: int = 20, max_bytes: int = 8192) -> str:
    """The last ``lines`` lines (at most ``max_bytes``) of the file at ``path``; "" when there is none."""
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if size > max_bytes:  # drop the partial first line
        text = text.partition("\n")[2]
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


@dataclass
class ProcessFailure:
    """One worker that failed: who, how, and what it said last on stderr."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int  # negative: killed by the signal -exitcode
    node_rank: int = 0
    host: str = ""
    stderr_file: str | None = None
    stderr_tail: str = ""
    message: str = ""  # MPI_Abort's message, or the worker's error file
    timestamp: float = field(default_factory=time.time)

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed the worker, or ``None`` if it exited."""
        return signal_name(-self.exitcode) if self.exitcode < 0 else None

    def describe_exit(self) -> str:
        """``"exit code 3"`` or ``"signal SIGKILL (9)"``."""
        if self.exitcode < 0:
            return f"signal {self.signal} ({-self.exitcode})"
        return f"exit code {self.exitcode}"

    def to_dict(self) -> dict:
        """A JSON-able form (what the agents exchange through the store)."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "node_rank": self.node_rank,
            "host": self.host,
            "stderr_file": self.stderr_file,
            "stderr_tail": self.stderr_tail[-4096:],
            "message": self.message[-2048:],
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ProcessFailure:
        """The inverse of :meth:`to_dict`."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def format(self) -> str:
        """The report block for this failure, in torchrun's layout."""
        when = datetime.datetime.fromtimestamp(self.timestamp).strftime("%Y-%m-%d_%H:%M:%S")
        out = [
            f"  time      : {when}",
            f"  host      : {self.host} (node_rank: {self.node_rank})",
            f"  rank      : {self.rank} (local_rank: {self.local_rank})",
        ]
        if self.exitcode < 0:
            out.append(f"  exitcode  : {self.exitcode} (pid: {self.pid})")
            out.append(f"  signal    : {self.signal} (signal {-self.exitcode}) received by PID {self.pid}")
        else:
            out.append(f"  exitcode  : {self.exitcode} (pid: {self.pid})")
        if self.message:
            out.append(f"  message   : {self.message}")
        out.append(f"  stderr    : {self.stderr_file or '<N/A>'}")
        if self.stderr_tail:
            out.append("  stderr tail:")
            out.extend("    " + line for line in self.stderr_tail.splitlines())
        return "\n".join(out)


def _pdeathsig() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGKILL the child when the launcher dies (``None`` elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return set_pdeathsig


_PREEXEC = _pdeathsig()

# The watchdog: a small process in a session of its own that holds the process groups of the running
# workers. It reads "+pgid" / "-pgid" lines; when its stdin reaches end-of-file without "exit" (the
# launcher died, even by SIGKILL), it SIGKILLs every group it holds -- the workers' own children too,
# which the parent-death signal does not reach.
_WATCHDOG = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line == "exit":
        sys.exit(0)
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""


class _Watchdog:
    """The launcher's end of the watchdog process (started at the first :meth:`hold`)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.held: set[int] = set()

    def _tell(self, line: str) -> None:
        with self.lock:
            if self.proc is None:
                if line == "exit":
                    return
                try:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-S", "-c", _WATCHDOG],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                except OSError:
                    return
            try:
                self.proc.stdin.write((line + "\n").encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                return
            if line == "exit":
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
                self.proc = None

    def hold(self, pgid: int) -> None:
        """Watch the process group ``pgid`` (a worker's)."""
        self.held.add(pgid)
        self._tell(f"+{pgid}")

    def release(self, pgid: int) -> None:
        """Stop watching ``pgid`` (its worker is done with)."""
        self.held.discard(pgid)
        self._tell(f"-{pgid}")

    def close(self) -> None:
        """Let the watchdog exit without killing anything (the launcher is ending cleanly)."""
        if not self.held:  # (another agent in this process may still hold groups)
            self._tell("exit")


#: The launcher's watchdog (one per process).
watchdog = _Watchdog()


class _Tee(threading.Thread):
    """Copies a worker's pipe to its log file and (optionally, prefixed per line) to a console stream."""

    def __init__(self, pipe: BinaryIO, path: str, console: BinaryIO | None, prefix: bytes) -> None:
        super().__init__(name=f"kiln-run-tee-{os.path.basename(path)}", daemon=True)
        self.pipe = pipe
        self.path = path
        self.console = console
        self.prefix = prefix

    def run(self) -> None:
        fd = self.pipe.fileno()
        pending = b""
        with open(self.path, "ab", buffering=0) as log:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                log.write(chunk)
                if self.console is not None:
                    pending += chunk
                    if b"\n" in pending or len(pending) > _LINE_LIMIT:
                        if len(pending) > _LINE_LIMIT:
                            whole, pending = pending, b""
                        else:
                            cut = pending.rindex(b"\n") + 1
                            whole, pending = pending[:cut], pending[cut:]
                        self._write(whole)
            if self.console is not None and pending:
                self._write(pending if pending.endswith(b"\n") else pending + b"\n")
        with contextlib.suppress(OSError):
            self.pipe.close()

    def _write(self, data: bytes) -> None:
        lines = data.splitlines(keepends=True)
        text = b"".join(self.prefix + line for line in lines) if self.prefix else data
        with _console_lock:
            try:
                self.console.write(text)
                self.console.flush()
            except (OSError, ValueError):  # the console went away: keep logging to the file
                self.console = None


@dataclass
class Worker:
    """One worker process and what the launcher knows of it."""

    local_rank: int
    rank: int
    proc: subprocess.Popen
    log_dir: str
    stderr_file: str
    stdout_file: str | None
    error_file: str
    tees: list[_Tee]
    exitcode: int | None = None

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs (negative: killed by that signal)."""
        if self.exitcode is None:
            self.exitcode = self.proc.poll()
        return self.exitcode

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (the worker and what it started)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if self.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)

    def finish_output(self, timeout: float = 2.0) -> None:
        """Wait (a little) for the copies of its output to drain after it exited."""
        deadline = time.monotonic() + timeout
        for t in self.tees:
            t.join(max(0.0, deadline - time.monotonic()))

    def failure(self, node_rank: int, host: str) -> ProcessFailure:
        """A :class:`ProcessFailure` for this (failed) worker."""
        if self.poll() is not None:
            self.finish_output()
        message = ""
        try:
            with open(self.error_file, encoding="utf-8", errors="replace") as fh:
                message = fh.read().strip()[-2048:]
        except OSError:
            pass
        return ProcessFailure(
            rank=self.rank,
            local_rank=self.local_rank,
            pid=self.pid,
            exitcode=self.exitcode if self.exitcode is not None else -1,
            node_rank=node_rank,
            host=host,
            stderr_file=self.stderr_file,
            stderr_tail=tail_of(self.stderr_file),
            message=message,
        )


class WorkerGroup:
    """The workers of this node for one attempt."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []

    def start(
        self,
        *,
        local_rank: int,
        rank: int,
        cmd: list[str],
        env: dict[str, str],
        log_dir: str,
        tee_stdout: bool,
        redirect_stdout: bool,
        tee_stderr: bool,
        pass_fds: tuple[int, ...] = (),
        prefix: bool = True,
    ) -> Worker:
        """Start one worker; its logs go under ``log_dir`` (created)."""
        os.makedirs(log_dir, exist_ok=True)
        stderr_file = os.path.join(log_dir, "stderr.log")
        stdout_file = os.path.join(log_dir, "stdout.log") if (tee_stdout or redirect_stdout) else None
        error_file = os.path.join(log_dir, "error.json")
        env = dict(env, KILN_ERROR_FILE=error_file)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_file else None,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,
            preexec_fn=_PREEXEC,  # only calls prctl: no locks, safe with threads
        )
        watchdog.hold(proc.pid)
        tag = f"[rank{rank}]:".encode() if prefix else b""
        tees = [_Tee(proc.stderr, stderr_file, _buffer(sys.stderr) if tee_stderr else None, tag)]
        if stdout_file:
            tees.append(_Tee(proc.stdout, stdout_file, _buffer(sys.stdout) if tee_stdout else None, tag))
        for t in tees:
            t.start()
        w = Worker(local_rank, rank, proc, log_dir, stderr_file, stdout_file, error_file, tees)
        self.workers.append(w)
        return w

    def poll(self) -> tuple[list[Worker], bool]:
        """(the workers that failed, in the order they are found; whether all have exited with 0)."""
        failed = [w for w in self.workers if (c := w.poll()) is not None and c != 0]
        return failed, all(w.poll() == 0 for w in self.workers)

    def alive(self) -> list[Worker]:
        """The workers still running."""
        return [w for w in self.workers if w.poll() is None]

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every running worker's process group."""
        for w in self.alive():
            w.signal_group(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Send ``sig`` to every running worker, wait up to ``timeout`` seconds, then SIGKILL whatever is
        left (and everything the workers started). Returns when all are reaped (bounded)."""
        self.signal_all(sig)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        for w in self.workers:  # SIGKILL the groups: survivors, and anything a worker left behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            w.poll()
        for w in self.workers:
            w.finish_output(0.5)

    def release(self) -> None:
        """The workers are done with (exited, or stopped): the watchdog forgets their process groups."""
        for w in self.workers:
            watchdog.release(w.pid)


def _buffer(stream) -> BinaryIO | None:
    return getattr(stream, "buffer", None)
