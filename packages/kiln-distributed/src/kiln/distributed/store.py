"""Key-value stores for rendezvous, as ``torch.distributed``'s: :class:`TCPStore`, :class:`FileStore`,
:class:`HashStore` and :class:`PrefixStore`.

A store carries only the small things processes exchange to find each other (addresses, counters,
the engines' own bootstrap records, the launcher's bookkeeping); tensors never travel through it, they
go through the collective engines (Gloo, MPI, NCCL). Every blocking call has a timeout.

The TCP store speaks a small framed protocol of its own (a JSON header and a raw value per message) and
never unpickles anything from the wire. Its server also notices when a rank's connection closes without
saying goodbye: :meth:`TCPStore.dead_ranks` is how a collective that failed names the rank that died.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterable

from kiln.distributed.errors import DistNetworkError, DistStoreError

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore", "default_timeout"]

#: PyTorch's default for stores and process groups: 30 minutes.
default_timeout = datetime.timedelta(minutes=30)


def _seconds(timeout: datetime.timedelta | float | None, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _as_bytes(value: str | bytes | bytearray | memoryview | Iterable[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class Store:
    """The interface every store has (``torch.distributed.Store``): string keys, byte values.

    Subclasses implement ``_set``, ``_get_nowait``, ``_add``, ``_compare_set``, ``_delete`` and
    ``_num_keys``, and may override :meth:`wait` with something better than polling.
    """

    def __init__(self, timeout: datetime.timedelta | float | None = None) -> None:
        self._timeout = _seconds(timeout, default_timeout.total_seconds())

    # -- the public interface --------------------------------------------------------------------
    @property
    def timeout(self) -> datetime.timedelta:
        """How long :meth:`get` and :meth:`wait` wait for a key before raising."""
        return datetime.timedelta(seconds=self._timeout)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Change the timeout of later blocking calls."""
        self._timeout = _seconds(timeout, self._timeout)

    def set(self, key: str, value: str | bytes) -> None:
        """Set ``key`` to ``value`` (overwriting)."""
        self._set(key, _as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store's timeout for it to be set."""
        self.wait([key])
        value = self._get_nowait(key)
        if value is None:  # deleted between the wait and the read
            raise DistStoreError(f"key {key!r} was deleted while it was read")
        return value

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if unset) and return the new value, atomically."""
        return self._add(key, int(amount))

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        """Set ``key`` to ``desired_value`` if it currently holds ``expected_value`` (or is unset and
        ``expected_value`` is empty); return the value the key holds afterwards."""
        return self._compare_set(key, _as_bytes(expected_value), _as_bytes(desired_value))

    def check(self, keys: list[str]) -> bool:
        """Whether every key in ``keys`` is set, without waiting."""
        return all(self._get_nowait(k) is not None for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | float | None = None) -> None:
        """Wait until every key in ``keys`` is set; ``DistStoreError`` after ``timeout`` (the store's)."""
        limit = _seconds(timeout, self._timeout)
        deadline = time.monotonic() + limit
        delay = 0.0005
        while not self.check(keys):
            if time.monotonic() >= deadline:
                missing = [k for k in keys if self._get_nowait(k) is None]
                raise DistStoreError(f"wait timeout after {int(limit * 1000)}ms, keys: {', '.join(missing)}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return self._delete(key)

    def num_keys(self) -> int:
        """How many keys the store holds."""
        return self._num_keys()

    def dead_ranks(self) -> list[int] | None:
        """Ranks whose connection to this store closed without a goodbye (``None``: this store cannot tell)."""
        return None

    def register_rank(self, rank: int) -> None:
        """Tell the store this connection belongs to ``rank`` (so that :meth:`dead_ranks` can name it)."""

    # -- what subclasses implement ---------------------------------------------------------------
    def _set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _get_nowait(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        raise NotImplementedError

    def _delete(self, key: str) -> bool:
        raise NotImplementedError

    def _num_keys(self) -> int:
        raise NotImplementedError


class _Table:
    """A thread-safe key-value table with waiting: the state of a :class:`HashStore` and of the TCP
    store's server."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.changed:
            self.data[key] = value
            self.changed.notify_all()

    def get(self, key: str) -> bytes | None:
        with self.changed:
            return self.data.get(key)

    def add(self, key: str, amount: int) -> int:
        with self.changed:
            try:
                value = int(self.data.get(key, b"0")) + amount
            except ValueError:
                raise DistStoreError(f"add on key {key!r}, whose value is not an integer") from None
            self.data[key] = str(value).encode()
            self.changed.notify_all()
            return value

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.changed:
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = desired
                self.changed.notify_all()
                return desired
            return expected if current is None else current

    def delete(self, key: str) -> bool:
        with self.changed:
            return self.data.pop(key, None) is not None

    def wait(self, keys: list[str], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout)


class HashStore(Store):
    """A store inside one process (``torch.distributed.HashStore``): threads rendezvous through it."""

    def __init__(self) -> None:
        super().__init__()
        self._table = _Table()

    def _set(self, key, value):
        self._table.set(key, value)

    def _get_nowait(self, key):
        return self._table.get(key)

    def _add(self, key, amount):
        return self._table.add(key, amount)

    def _compare_set(self, key, expected, desired):
        return self._table.compare_set(key, expected, desired)

    def _delete(self, key):
        return self._table.delete(key)

    def _num_keys(self):
        return len(self._table.data)

    def wait(self, keys, timeout=None):
        limit = _seconds(timeout, self._timeout)
        if not self._table.wait(list(keys), limit):
            missing = [k for k in keys if self._table.get(k) is None]
            raise DistStoreError(f"wait timeout after {int(limit * 1000)}ms, keys: {', '.join(missing)}")


class PrefixStore(Store):
    """Every key of ``store`` under ``prefix + "/"`` (``torch.distributed.PrefixStore``): one store, many
    process groups."""

    def __init__(self, prefix: str, store: Store) -> None:
        super().__init__(store.timeout)
        self.underlying_store = store
        self._prefix = prefix + "/"

    def _set(self, key, value):
        self.underlying_store._set(self._prefix + key, value)

    def _get_nowait(self, key):
        return self.underlying_store._get_nowait(self._prefix + key)

    def _add(self, key, amount):
        return self.underlying_store._add(self._prefix + key, amount)

    def _compare_set(self, key, expected, desired):
        return self.underlying_store._compare_set(self._prefix + key, expected, desired)

    def _delete(self, key):
        return self.underlying_store._delete(self._prefix + key)

    def _num_keys(self):
        return self.underlying_store._num_keys()

    def check(self, keys):
        return self.underlying_store.check([self._prefix + k for k in keys])

    def wait(self, keys, timeout=None):
        self.underlying_store.wait([self._prefix + k for k in keys], self._timeout if timeout is None else timeout)

    def dead_ranks(self):
        return self.underlying_store.dead_ranks()

    def register_rank(self, rank):
        self.underlying_store.register_rank(rank)

    def close(self) -> None:
        """Close the underlying store (a TCP store's connection says goodbye)."""
        close = getattr(self.underlying_store, "close", None)
        if close is not None:
            close()


# ------------------------------------------------------------------------------------------------
# TCPStore: a server thread (in rank 0, or in the launcher) and one connection per client.
# A message is: 4-byte big-endian header length, the header (JSON), 8-byte value length, the value.

_MAX_HEADER = 1 << 16
_MAX_VALUE = 1 << 31


def _send(sock: socket.socket, header: dict, value: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(struct.pack(">I", len(head)) + head + struct.pack(">Q", len(value)) + value)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket, request: bool = False) -> tuple[dict, bytes]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > _MAX_HEADER:
        raise ConnectionError(f"store message header of {n} bytes (at most {_MAX_HEADER})")
    header = json.loads(_recv_exact(sock, n))
    if not isinstance(header, dict) or (request and not isinstance(header.get("op"), str)):
        raise ConnectionError("malformed store message")
    (m,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if m > _MAX_VALUE:
        raise ConnectionError(f"store value of {m} bytes (at most {_MAX_VALUE})")
    return header, _recv_exact(sock, m)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int]) -> None:
        self.table = _Table()
        self.clients = 0
        self.sockets: set[socket.socket] = set()
        self.ranks: dict[int, str] = {}  # rank -> "alive" | "gone" | "dead"
        self.lock = threading.Lock()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rank = None
        with server.lock:
            server.clients += 1
            server.sockets.add(sock)
        try:
            while True:
                try:
                    header, value = _recv(sock, request=True)
                except (ConnectionError, OSError, ValueError, struct.error):
                    return
                op, key = header["op"], str(header.get("key", ""))
                reply: dict = {"ok": True}
                out = b""
                try:
                    if op == "set":
                        server.table.set(key, value)
                    elif op == "get":
                        got = server.table.get(key)
                        reply["found"] = got is not None
                        out = got or b""
                    elif op == "add":
                        reply["value"] = server.table.add(key, int(header["amount"]))
                    elif op == "compare_set":
                        n = int(header["expected_len"])
                        out = server.table.compare_set(key, value[:n], value[n:])
                    elif op == "wait":
                        keys = [str(k) for k in header["keys"]]
                        reply["ok"] = server.table.wait(keys, float(header["timeout"]))
                    elif op == "check":
                        reply["value"] = all(server.table.get(str(k)) is not None for k in header["keys"])
                    elif op == "delete":
                        reply["value"] = server.table.delete(key)
                    elif op == "num_keys":
                        reply["value"] = len(server.table.data)
                    elif op == "hello":
                        rank = int(header["rank"])
                        with server.lock:
                            server.ranks[rank] = "alive"
                    elif op == "bye":
                        if rank is not None:
                            with server.lock:
                                server.ranks[rank] = "gone"
                            rank = None
                    elif op == "dead":
                        with server.lock:
                            reply["value"] = sorted(r for r, s in server.ranks.items() if s == "dead")
                    elif op == "clients":
                        with server.lock:
                            reply["value"] = server.clients
                    else:
                        reply = {"ok": False, "error": f"unknown store operation {op!r}"}
                except (KeyError, TypeError, ValueError, DistStoreError) as e:
                    reply = {"ok": False, "error": str(e)}
                try:
                    _send(sock, reply, out)
                except OSError:
                    return
        finally:
            with server.lock:
                server.clients -= 1
                server.sockets.discard(sock)
                if rank is not None and server.ranks.get(rank) == "alive":
                    server.ranks[rank] = "dead"


_REPLY_TIMEOUT = 30.0


def _listen_address(host: str) -> str:
    """Where a store served for ``host`` listens: on loopback only when ``host`` is a loopback name
    (a job on one machine exposes nothing), else on every interface (as PyTorch's store: ``host`` may be
    a name or address that routes here without being an interface's own, behind NAT or a service IP)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return ""
    if infos and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos):
        return "::1" if infos[0][0] == socket.AF_INET6 else "127.0.0.1"
    return ""


def _is_local_address(host: str) -> bool:
    """Whether ``host`` names an address of this machine (one a socket can bind): how a launcher without
    a node rank knows it is the one to serve the store at ``host``."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((address[0], 0))
            except OSError:
                continue
            return True
    return False


class TCPStore(Store):
    """A store served over TCP (``torch.distributed.TCPStore``).

    The process with ``is_master=True`` serves it on ``host_name:port`` (``port=0`` picks a free port;
    read it back from :attr:`port`); every process, the master included, talks to it as a client. With
    ``wait_for_workers`` the master's constructor waits until ``world_size`` clients have connected.
    Connecting retries until ``timeout``, then raises ``DistNetworkError`` naming the address.
    """

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: datetime.timedelta = datetime.timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
    ) -> None:
        super().__init__(timeout)
        self.host = host_name
        self._server: _Server | None = None
        if is_master:
            try:
                self._server = _Server((_listen_address(host_name), port))
            except OSError as e:
                raise DistNetworkError(
                    f"The server socket has failed to listen on any local network address. port: {port}, "
                    f"useIpv6: 0, code: {e.errno}, name: {e.strerror}, message: address already in use"
                    if e.errno == 98
                    else f"The server socket has failed to listen on {host_name}:{port}: {e}"
                ) from e
            port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, name="kiln-tcpstore", daemon=True).start()
        self.port = port
        self._lock = threading.Lock()
        self._broken: str | None = None
        try:
            self._sock = self._connect()
            if is_master and wait_for_workers and world_size:
                self._wait_for_clients(world_size)
        except BaseException:
            self._stop_server()  # a master that failed must not keep serving the port
            raise

    @property
    def libuvBackend(self) -> bool:
        """``False``: this store's server is Python threads, not libuv."""
        return False

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self._timeout
        delay = 0.01
        last: Exception | None = None
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(5.0, self._timeout))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(None)
                return sock
            except OSError as e:
                last = e
            if time.monotonic() >= deadline:
                raise DistNetworkError(
                    f"failed to connect to the store at {self.host}:{self.port} within "
                    f"{self._timeout:g} s ({last}); is MASTER_ADDR/MASTER_PORT right, and is rank 0 running?"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _call(self, header: dict, value: bytes = b"", wait: float | None = None) -> tuple[dict, bytes]:
        with self._lock:
            if self._broken is not None:
                raise DistNetworkError(
                    f"the connection to the store at {self.host}:{self.port} is broken: {self._broken}"
                )
            try:
                # a store answers in milliseconds; a server that does not within this is stalled or gone
                self._sock.settimeout(min(self._timeout, _REPLY_TIMEOUT) if wait is None else wait + _REPLY_TIMEOUT)
                _send(self._sock, header, value)
                reply, out = _recv(self._sock)
            except BaseException as e:
                # the reply to this call may still arrive: the connection can never be trusted again
                self._broken = f"{type(e).__name__}: {e}"
                with contextlib.suppress(OSError):
                    self._sock.close()
                if isinstance(e, (OSError, ConnectionError, ValueError)):
                    raise DistNetworkError(
                        f"lost the connection to the store at {self.host}:{self.port} ({e}): the process serving "
                        "it (rank 0, or the launcher) has likely exited"
                    ) from e
                raise
        if not reply.get("ok", False) and "error" in reply:
            raise DistStoreError(reply["error"])
        return reply, out

    def _wait_for_clients(self, world_size: int) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            n = self._call({"op": "clients"})[0]["value"]
            if n >= world_size:
                return
            if time.monotonic() >= deadline:
                raise DistStoreError(
                    f"Timed out after {int(self._timeout)} seconds waiting for clients. {n}/{world_size} clients joined."
                )
            time.sleep(0.01)

    def _set(self, key, value):
        self._call({"op": "set", "key": key}, value)

    def _get_nowait(self, key):
        reply, out = self._call({"op": "get", "key": key})
        return out if reply["found"] else None

    def _add(self, key, amount):
        return self._call({"op": "add", "key": key, "amount": amount})[0]["value"]

    def _compare_set(self, key, expected, desired):
        return self._call({"op": "compare_set", "key": key, "expected_len": len(expected)}, expected + desired)[1]

    def _delete(self, key):
        return self._call({"op": "delete", "key": key})[0]["value"]

    def _num_keys(self):
        return self._call({"op": "num_keys"})[0]["value"]

    def check(self, keys):
        return self._call({"op": "check", "keys": list(keys)})[0]["value"]

    def wait(self, keys, timeout=None):
        limit = _seconds(timeout, self._timeout)
        reply, _ = self._call({"op": "wait", "keys": list(keys), "timeout": limit}, wait=limit)
        if not reply["ok"]:
            missing = [k for k in keys if self._get_nowait(k) is None]
            raise DistStoreError(f"wait timeout after {int(limit * 1000)}ms, keys: {', '.join(missing)}")

    def register_rank(self, rank):
        self._call({"op": "hello", "rank": int(rank)})

    def dead_ranks(self):
        return self._call({"op": "dead"})[0]["value"]

    def close(self) -> None:
        """Say goodbye (this rank exits cleanly) and close the connection; the master also stops serving."""
        with contextlib.suppress(OSError, DistNetworkError, DistStoreError):
            self._call({"op": "bye"})
        with contextlib.suppress(OSError):
            self._sock.close()
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            with self._server.lock:  # clients still connected must not go on using a table that is gone
                for sock in list(self._server.sockets):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
            self._server = None


_FILE_CLEANUP_KEY = "kiln/filestore-finished"


class FileStore(Store):
    """A store in a file that every process can open (``torch.distributed.FileStore``): a shared
    filesystem instead of a network address.

    The file is an append-only log of records, locked with ``flock`` while written; each process replays
    what others appended. Records are ``[u32 key length][key][i64 value length][value]``; a length of -1
    is a deletion.
    """

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        super().__init__()
        self.path = os.fspath(file_name)
        self.world_size = world_size
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._lock = threading.Lock()
        self._closed = False
        with open(self.path, "ab"):
            pass

    def close(self) -> None:
        """This process is done with the store; the last of ``world_size`` processes to close it removes
        the file, so that the next job on the same path starts from nothing (PyTorch's cleanup). A job
        that crashed leaves the file: remove it before reusing the path."""
        if self._closed:
            return
        self._closed = True
        finished = self.add(_FILE_CLEANUP_KEY, 1)
        if self.world_size > 0 and finished >= self.world_size:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)

    @contextlib.contextmanager
    def _locked(self, exclusive: bool):
        with self._lock, open(self.path, "r+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._replay(fh)
                yield fh
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _replay(self, fh) -> None:
        fh.seek(self._offset)
        blob = fh.read()
        pos = 0
        while pos + 4 <= len(blob):
            (klen,) = struct.unpack_from(">I", blob, pos)
            if pos + 4 + klen + 8 > len(blob):
                break
            key = blob[pos + 4 : pos + 4 + klen].decode()
            (vlen,) = struct.unpack_from(">q", blob, pos + 4 + klen)
            start = pos + 12 + klen
            if vlen < 0:
                self._data.pop(key, None)
                pos = start
                continue
            if start + vlen > len(blob):
                break
            self._data[key] = blob[start : start + vlen]
            pos = start + vlen
        self._offset += pos

    def _append(self, fh, key: str, value: bytes | None) -> None:
        k = key.encode()
        record = struct.pack(">I", len(k)) + k
        record += struct.pack(">q", -1) if value is None else struct.pack(">q", len(value)) + value
        fh.seek(0, os.SEEK_END)
        fh.write(record)
        fh.flush()
        self._offset = fh.tell()
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = value

    def _set(self, key, value):
        with self._locked(True) as fh:
            self._append(fh, key, value)

    def _get_nowait(self, key):
        with self._locked(False):
            return self._data.get(key)

    def _add(self, key, amount):
        with self._locked(True) as fh:
            try:
                value = int(self._data.get(key, b"0")) + amount
            except ValueError:
                raise DistStoreError(f"add on key {key!r}, whose value is not an integer") from None
            self._append(fh, key, str(value).encode())
            return value

    def _compare_set(self, key, expected, desired):
        with self._locked(True) as fh:
            current = self._data.get(key)
            if (current is None and expected == b"") or current == expected:
                self._append(fh, key, desired)
                return desired
            return expected if current is None else current

    def _delete(self, key):
        with self._locked(True) as fh:
            existed = key in self._data
            if existed:
                self._append(fh, key, None)
            return existed

    def _num_keys(self):
        with self._locked(False):
            return len(self._data)

    def check(self, keys):
        with self._locked(False):
            return all(k in self._data for k in keys)
