"""Rendezvous: from an ``init_method`` URL to a store, a rank and a world size (``torch.distributed``'s).

* ``env://`` (the default): ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` from the
  environment (arguments win over the environment);
* ``tcp://host:port`` (``?rank=..&world_size=..`` allowed): a :class:`TCPStore` served by rank 0;
* ``file:///path``: a :class:`FileStore` on a filesystem every process sees.

Under ``kiln-run`` (``KILN_USE_AGENT_STORE=1``) the launcher already serves the TCP store, so every rank,
rank 0 included, connects as a client. :func:`register_rendezvous_handler` adds a scheme.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse
from collections.abc import Callable, Iterator

from kiln.distributed.store import FileStore, PrefixStore, Store, TCPStore

__all__ = ["register_rendezvous_handler", "rendezvous"]

_handlers: dict[str, Callable[..., Iterator[tuple[Store, int, int]]]] = {}


def register_rendezvous_handler(scheme: str, handler: Callable[..., Iterator[tuple[Store, int, int]]]) -> None:
    """Register ``handler(url, rank=, world_size=, timeout=)`` for URLs of ``scheme``; it yields
    ``(store, rank, world_size)``."""
    if scheme in _handlers:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _handlers[scheme] = handler


def rendezvous(
    url: str, rank: int = -1, world_size: int = -1, timeout: datetime.timedelta | None = None
) -> Iterator[tuple[Store, int, int]]:
    """Yield ``(store, rank, world_size)`` for ``url`` (an iterator, as PyTorch's)."""
    if not isinstance(url, str):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {url}")
    if not isinstance(rank, int):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, int):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in _handlers:
        raise RuntimeError(f"No rendezvous handler for {parsed.scheme}://")
    query = dict(urllib.parse.parse_qsl(parsed.query))
    if rank != -1 or world_size != -1:
        if "rank" in query or "world_size" in query:
            raise ValueError(
                f"The url: {url} has node-specific arguments(rank, world_size) "
                "but rank or world_size are also given explicitly"
            )
        if rank != -1:
            query["rank"] = str(rank)
        if world_size != -1:
            query["world_size"] = str(world_size)
        url = urllib.parse.urlunparse(parsed._replace(query=urllib.parse.urlencode(query)))
    return _handlers[parsed.scheme](url, timeout=timeout or datetime.timedelta(minutes=30))


def _error(method: str, msg: str) -> ValueError:
    return ValueError(f"Error initializing kiln.distributed using {method} rendezvous: {msg}")


def _query_int(query: dict, key: str, method: str) -> int:
    if key not in query:
        raise _error(method, f"{key} parameter missing")
    try:
        return int(query[key])
    except ValueError:
        raise _error(method, f"{key} must be an integer, got {query[key]!r}") from None


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> Store:
    agent = os.environ.get("KILN_USE_AGENT_STORE", "").lower() in ("1", "true")
    if not agent and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true"):
        raise RuntimeError(
            "this process was started by PyTorch's torchrun, whose store at MASTER_ADDR:MASTER_PORT speaks "
            "PyTorch's protocol: start kiln programs with kiln-run, which takes the same options"
        )
    store = TCPStore(
        host, port, world_size, is_master=(rank == 0 and not agent), timeout=timeout, wait_for_workers=False
    )
    if agent:  # the launcher's store outlives restarts: each attempt of the workers gets keys of its own
        return PrefixStore(f"/worker/attempt_{os.environ.get('KILN_RESTART_COUNT', '0')}", store)
    return store


def _env_handler(url: str, timeout: datetime.timedelta) -> Iterator[tuple[Store, int, int]]:
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    method = "env://"

    def from_env(name: str) -> str:
        value = os.environ.get(name)
        if value is None:
            raise _error(method, f"environment variable {name} expected, but not set")
        return value

    rank = int(query["rank"]) if "rank" in query else int(from_env("RANK"))
    world_size = int(query["world_size"]) if "world_size" in query else int(from_env("WORLD_SIZE"))
    host = from_env("MASTER_ADDR")
    try:
        port = int(from_env("MASTER_PORT"))
    except ValueError:
        raise _error(method, f"MASTER_PORT must be an integer, got {os.environ['MASTER_PORT']!r}") from None
    _check(rank, world_size)
    yield _tcp_store(host, port, rank, world_size, timeout), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _tcp_handler(url: str, timeout: datetime.timedelta) -> Iterator[tuple[Store, int, int]]:
    parsed = urllib.parse.urlparse(url)
    if not parsed.port:
        raise ValueError(f"Error initializing kiln.distributed using tcp:// rendezvous: port number missing: {url}")
    query = dict(urllib.parse.parse_qsl(parsed.query))
    rank = _query_int(query, "rank", "tcp://")
    world_size = _query_int(query, "world_size", "tcp://")
    _check(rank, world_size)
    yield _tcp_store(parsed.hostname or "127.0.0.1", parsed.port, rank, world_size, timeout), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _file_handler(url: str, timeout: datetime.timedelta) -> Iterator[tuple[Store, int, int]]:
    parsed = urllib.parse.urlparse(url)
    path = urllib.parse.unquote(parsed.path or parsed.netloc)
    if not path:
        raise ValueError("Error initializing kiln.distributed using file:// rendezvous: path missing")
    query = dict(urllib.parse.parse_qsl(parsed.query))
    rank = _query_int(query, "rank", "file://")
    world_size = _query_int(query, "world_size", "file://")
    _check(rank, world_size)
    store = FileStore(path, world_size)
    store.set_timeout(timeout)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using file:// method")


def _check(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]")


register_rendezvous_handler("env", _env_handler)
register_rendezvous_handler("tcp", _tcp_handler)
register_rendezvous_handler("file", _file_handler)
