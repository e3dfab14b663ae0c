"""A PMI-1 server inside kiln-run, so that MPI processes it starts form one MPI world.

MPICH's processes find each other through the Process Management Interface: the process manager
(``mpiexec``) hands every process an inherited socket (env ``PMI_FD``) with its rank and the world size
(``PMI_RANK``, ``PMI_SIZE``); over that socket a process asks for the job's key-value space, publishes
its network address with ``put``, waits in ``barrier_in`` until every process has, and reads the others'
with ``get``. This module speaks the text form of that protocol ("PMI-1", one ``cmd=... key=value ...``
line per message), written from the protocol's public description; nothing of MPICH is used.

One :class:`PMIServer` serves the workers of one node (one launcher) for one attempt. On one node its
key-value space is a dict. With several nodes the barrier goes through the job's rendezvous store: at
every barrier a node posts the keys its processes put since the last one, waits until every node has
posted, and merges the others' keys, so a ``get`` after a barrier sees every process's ``put`` -- the
guarantee PMI gives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass

from kiln.distributed.errors import DistStoreError
from kiln.distributed.store import Store

__all__ = ["PMIAbort", "PMIServer", "process_mapping"]

log = logging.getLogger(__name__)

# The limits the server announces (cmd=get_maxes); the client keeps a put line under its 1024-byte buffer.
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024
_MAX_LINE = 1 << 16  # a longer line than this is a broken client, not a message


def process_mapping(nprocs: list[int]) -> str:
    """The ``PMI_process_mapping`` value MPICH reads to learn which ranks share a node: a "vector" of
    ``(first_node, node_count, ranks_per_node)`` blocks, ranks laid out node by node."""
    blocks: list[tuple[int, int, int]] = []
    for node, n in enumerate(nprocs):
        if blocks and blocks[-1][2] == n:
            first, count, _ = blocks[-1]
            blocks[-1] = (first, count + 1, n)
        else:
            blocks.append((node, 1, n))
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"


@dataclass
class PMIAbort:
    """A worker called ``PMI_Abort`` (``MPI_Abort``): its rank, exit code and message."""

    rank: int
    exitcode: int
    message: str


def _escape(value: str) -> str:
    # The client unescapes a backslash followed by any character, and a value ends at a space.
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _parse(line: str) -> dict[str, str]:
    """``cmd=put kvsname=k key=x value=...`` -> a dict. The client writes values unescaped; a value
    never holds a space in practice, except an abort's message, which runs to the end of the line."""
    out: dict[str, str] = {}
    rest = line.strip()
    while rest:
        token, _, tail = rest.partition(" ")
        key, eq, value = token.partition("=")
        if key in ("message", "msg") and eq:
            out[key] = (value + (" " + tail if tail else "")).strip()
            break
        out[key] = value if eq else ""
        rest = tail.lstrip(" ")
    return out


class _Client:
    def __init__(self, sock: socket.socket, rank: int) -> None:
        self.sock = sock
        self.rank = rank
        self.buf = b""
        self.mcmd: list[str] | None = None  # lines of a multi-line (mcmd=) command being read
        self.in_barrier = False
        self.closed = False


class PMIServer:
    """Serves PMI-1 to this node's workers (a thread), backed by a dict and, across nodes, by ``store``.

    Create it, call :meth:`add_worker` for each local worker before starting it (the returned fd goes to
    the worker as ``PMI_FD``, through ``pass_fds``), then :meth:`start`; :meth:`stop` when the workers
    are gone. ``store`` must be a store client of its own (the server blocks on it in barriers);
    ``prefix`` names this attempt's keys in it.
    """

    def __init__(
        self,
        *,
        world_size: int,
        kvsname: str,
        mapping: str,
        node_rank: int = 0,
        nnodes: int = 1,
        store: Store | None = None,
        prefix: str = "",
    ) -> None:
        if nnodes > 1 and store is None:
            raise ValueError("a PMI server for several nodes needs the job's store")
        self.world_size = world_size
        self.kvsname = kvsname
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.store = store
        self.prefix = prefix
        self.kvs: dict[str, str] = {"PMI_process_mapping": mapping}
        self._new: dict[str, str] = {}  # keys put here since the last barrier (what the other nodes lack)
        self._published: dict[str, str] = {}
        self._clients: list[_Client] = []
        self._epoch = 0
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._theirs: list[socket.socket] = []
        self.aborts: list[PMIAbort] = []
        self.error: str | None = None  # set when the server itself failed (the store went away)
        self._lock = threading.Lock()

    # -- set-up ---------------------------------------------------------------------------------------
    def add_worker(self, rank: int) -> int:
        """Make the socket pair for the worker of global rank ``rank``; return the worker's end (an fd,
        to pass as ``PMI_FD``). Close it in the launcher once the worker has started
        (:meth:`close_worker_ends`)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.setblocking(False)
        client = _Client(mine, rank)
        self._clients.append(client)
        self._theirs.append(theirs)
        return theirs.fileno()

    def close_worker_ends(self) -> None:
        """Close the launcher's copies of the workers' ends (after they started), so that a worker's exit
        shows as end-of-file here."""
        for s in self._theirs:
            s.close()
        self._theirs = []

    def start(self) -> None:
        """Start serving (a daemon thread)."""
        for c in self._clients:
            self._sel.register(c.sock, selectors.EVENT_READ, c)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="kiln-run-pmi", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close every socket."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        self.close_worker_ends()
        for c in self._clients:
            with contextlib.suppress(OSError):
                c.sock.close()
        for s in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            self._sel.close()

    def drain(self, timeout: float = 1.0) -> None:
        """Wait (up to ``timeout``) until every worker's socket reached end-of-file and all it sent was
        read: after the workers exited, so that a ``PMI_Abort`` sent just before a clean exit is seen."""
        deadline = time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            if all(c.closed for c in self._clients):
                return
            time.sleep(0.01)

    # -- the loop -------------------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=0.5):
                    client = key.data
                    if client is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                        continue
                    self._read(client)
                    if self._stop.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - the launcher reports it; a dead server thread must say why
            self.error = f"the PMI server failed: {type(e).__name__}: {e}"
            log.error("%s", self.error)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.buf += data
        while b"\n" in client.buf:
            line, client.buf = client.buf.split(b"\n", 1)
            self._line(client, line.decode("utf-8", "replace"))
        if len(client.buf) > _MAX_LINE:
            log.error("rank %d sent a PMI line over %d bytes; ignoring it", client.rank, _MAX_LINE)
            client.buf = b""

    def _drop(self, client: _Client) -> None:
        client.closed = True
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(client.sock)

    def _send(self, client: _Client, cmd: str, **attrs) -> None:
        parts = [f"cmd={cmd}"] + [f"{k}={_escape(str(v))}" for k, v in attrs.items()]
        data = (" ".join(parts) + "\n").encode()
        # The client reads a reply right after writing its query, so a short blocking send never stalls.
        client.sock.setblocking(True)
        try:
            client.sock.sendall(data)
        except OSError:
            self._drop(client)
        finally:
            with contextlib.suppress(OSError):
                client.sock.setblocking(False)

    def _line(self, client: _Client, line: str) -> None:
        if client.mcmd is not None:  # inside a multi-line command (spawn)
            client.mcmd.append(line)
            if line.strip() == "endcmd":
                client.mcmd = None
                self._send(client, "spawn_result", rc=1, msg="kiln-run does not support MPI_Comm_spawn")
            return
        if line.startswith("mcmd="):
            client.mcmd = [line]
            return
        if not line.startswith("cmd="):
            if line.strip():
                log.error("rank %d spoke an unknown PMI wire protocol: %r", client.rank, line[:80])
            return
        msg = _parse(line)
        self._command(client, msg.pop("cmd"), msg)

    def _command(self, client: _Client, cmd: str, a: dict[str, str]) -> None:
        if cmd == "init":
            ok = a.get("pmi_version") == "1"
            self._send(client, "response_to_init", rc=0 if ok else -1, pmi_version=1, pmi_subversion=1)
        elif cmd == "get_maxes":
            self._send(client, "maxes", rc=0, kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX)
        elif cmd == "get_appnum":
            self._send(client, "appnum", rc=0, appnum=0)
        elif cmd == "get_universe_size":
            self._send(client, "universe_size", rc=0, size=self.world_size)
        elif cmd == "get_my_kvsname":
            self._send(client, "my_kvsname", rc=0, kvsname=self.kvsname)
        elif cmd == "put":
            key, value = a.get("key", ""), a.get("value", "")
            self.kvs[key] = value
            self._new[key] = value
            self._send(client, "put_result", rc=0)
        elif cmd == "get":
            value = self.kvs.get(a.get("key", ""))
            if value is None:
                self._send(client, "get_result", rc=1, msg=f"key_{a.get('key', '')}_not_found")
            else:
                self._send(client, "get_result", rc=0, value=value)
        elif cmd == "barrier_in":
            client.in_barrier = True
            if all(c.in_barrier for c in self._clients):
                self._barrier()
        elif cmd == "finalize":
            self._send(client, "finalize_ack", rc=0)
        elif cmd == "abort":
            try:
                code = int(a.get("exitcode", "1"))
            except ValueError:
                code = 1
            with self._lock:
                self.aborts.append(PMIAbort(client.rank, code, a.get("message", "")))
        elif cmd == "publish_name":
            self._published[a.get("service", "")] = a.get("port", "")
            if self.store is not None:
                self.store.set(f"{self.prefix}/name/{a.get('service', '')}", a.get("port", ""))
            self._send(client, "publish_result", rc=0)
        elif cmd == "unpublish_name":
            self._published.pop(a.get("service", ""), None)
            if self.store is not None:
                self.store.delete_key(f"{self.prefix}/name/{a.get('service', '')}")
            self._send(client, "unpublish_result", rc=0)
        elif cmd == "lookup_name":
            service = a.get("service", "")
            port = self._published.get(service)
            if port is None and self.store is not None and self.store.check([f"{self.prefix}/name/{service}"]):
                port = self.store.get(f"{self.prefix}/name/{service}").decode()
            if port is None:
                self._send(client, "lookup_result", rc=1, msg="service_not_found")
            else:
                self._send(client, "lookup_result", rc=0, port=port)
        else:
            log.warning("rank %d sent an unsupported PMI command %r", client.rank, cmd)
            self._send(client, f"{cmd}_result", rc=1, msg=f"unsupported_command_{cmd}")

    def _barrier(self) -> None:
        """Every local process is in the barrier: meet the other nodes (through the store), then let
        them all out."""
        if self.nnodes > 1:
            epoch = self._epoch
            keys = [f"{self.prefix}/barrier{epoch}/node{n}" for n in range(self.nnodes)]
            self.store.set(keys[self.node_rank], json.dumps(self._new))
            # No deadline: a barrier (MPI_Finalize's) may wait for a long computation on another node.
            # The launcher's monitor loop stops the workers, and then this server, when something fails.
            while not self._stop.is_set():
                try:
                    self.store.wait(keys, 1.0)
                    break
                except DistStoreError:  # not yet; a lost store (DistNetworkError) ends the server
                    continue
            if self._stop.is_set():
                return
            for n, key in enumerate(keys):
                if n != self.node_rank:
                    self.kvs.update(json.loads(self.store.get(key)))
        self._new = {}
        self._epoch += 1
        for c in self._clients:
            if c.in_barrier:
                c.in_barrier = False
                self._send(c, "barrier_out", rc=0)
