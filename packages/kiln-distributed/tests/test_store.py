"""The stores: the same semantics for every kind, timeouts that name the keys, rank liveness, and a TCP
server that survives malformed clients."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time

import pytest

from kiln.distributed import DistNetworkError, DistStoreError, FileStore, HashStore, PrefixStore, TCPStore, rendezvous

SHORT = datetime.timedelta(seconds=0.3)


@pytest.fixture(params=["hash", "file", "tcp", "prefix"])
def stores(request, tmp_path):
    """Two handles on one store (as two processes would hold)."""
    if request.param == "hash":
        s = HashStore()
        yield s, s
    elif request.param == "file":
        yield FileStore(str(tmp_path / "f")), FileStore(str(tmp_path / "f"))
    elif request.param == "tcp":
        master = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        client = TCPStore("127.0.0.1", master.port, 2, is_master=False)
        yield master, client
        client.close()
        master.close()
    else:
        base = HashStore()
        yield PrefixStore("pg", base), PrefixStore("pg", base)


def test_semantics(stores):
    a, b = stores
    a.set("k", "v")
    assert b.get("k") == b"v"
    a.set("k", b"\x00\xff")
    assert b.get("k") == b"\x00\xff"
    assert a.add("n", 3) == 3 and b.add("n", -1) == 2
    assert a.compare_set("c", "", "first") == b"first"  # unset and expected empty: set
    assert b.compare_set("c", "wrong", "second") == b"first"  # mismatch: current value back
    assert b.compare_set("c", "first", "second") == b"second"
    assert a.check(["k", "n"]) and not a.check(["k", "missing"])
    assert b.delete_key("k") and not b.delete_key("k")
    assert not a.check(["k"])
    assert a.num_keys() >= 2
    with pytest.raises(DistStoreError, match="not an integer"):
        a.add("c", 1)


def test_get_waits_for_a_later_set(stores):
    a, b = stores
    threading.Timer(0.2, lambda: a.set("late", "x")).start()
    assert b.get("late") == b"x"


def test_timeouts_name_the_missing_keys(stores):
    a, b = stores
    a.set("here", "1")
    start = time.monotonic()
    with pytest.raises(DistStoreError, match=r"wait timeout after 300ms, keys: .*absent"):
        b.wait(["here", "absent"], SHORT)
    assert time.monotonic() - start < 5
    b.set_timeout(SHORT)
    with pytest.raises(DistStoreError, match="absent"):
        b.get("absent")


def test_prefix_stores_do_not_see_each_other():
    base = HashStore()
    PrefixStore("a", base).set("k", "1")
    assert not PrefixStore("b", base).check(["k"])
    assert base.get("a/k") == b"1"


def test_file_store_ignores_a_half_written_record(tmp_path):
    path = tmp_path / "f"
    s = FileStore(str(path))
    s.set("whole", "1")
    with open(path, "ab") as fh:  # a writer killed in the middle of a record
        fh.write(struct.pack(">I", 4) + b"half" + struct.pack(">q", 100) + b"abc")
    t = FileStore(str(path))
    assert t.get("whole") == b"1"
    assert not t.check(["half"])


def test_tcp_master_waits_for_workers_with_a_timeout():
    start = time.monotonic()
    with pytest.raises(DistStoreError, match=r"waiting for clients. 1/3 clients joined"):
        TCPStore("127.0.0.1", 0, 3, is_master=True, timeout=datetime.timedelta(seconds=0.5))
    assert time.monotonic() - start < 5


def test_tcp_client_gives_up_on_a_wrong_address_within_the_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket closes
    start = time.monotonic()
    with pytest.raises(DistNetworkError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, timeout=datetime.timedelta(seconds=1))
    assert time.monotonic() - start < 5


def test_tcp_port_in_use():
    master = TCPStore("127.0.0.1", 0, 1, is_master=True)
    try:
        with pytest.raises(DistNetworkError, match="address already in use"):
            TCPStore("127.0.0.1", master.port, 1, is_master=True, timeout=datetime.timedelta(seconds=1))
    finally:
        master.close()


def test_dead_ranks_are_those_that_left_without_a_goodbye():
    master = TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)
    try:
        clean = TCPStore("127.0.0.1", master.port)
        crash = TCPStore("127.0.0.1", master.port)
        clean.register_rank(1)
        crash.register_rank(2)
        clean.close()  # says goodbye
        crash._sock.close()  # as a killed process's socket
        deadline = time.monotonic() + 5
        while master.dead_ranks() != [2] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert master.dead_ranks() == [2]
    finally:
        master.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x05hello",  # not JSON
        b"\xff\xff\xff\xff",  # a header length over the limit
        struct.pack(">I", 2) + b"[]" + struct.pack(">Q", 0),  # JSON, not an object
        struct.pack(">I", 13) + b'{"op": "set"}' + struct.pack(">Q", 1 << 40),  # a value over the limit
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_tcp_server_drops_malformed_clients_and_keeps_serving(garbage):
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    try:
        with socket.create_connection(("127.0.0.1", master.port), timeout=5) as raw:
            raw.sendall(garbage)
            raw.settimeout(5)
            assert raw.recv(100) == b""  # the server hung up on it
        master.set("still", "ok")
        assert TCPStore("127.0.0.1", master.port).get("still") == b"ok"
    finally:
        master.close()


def test_tcp_server_answers_an_unknown_operation_with_an_error():
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    try:
        with pytest.raises(DistStoreError, match="unknown store operation 'explode'"):
            master._call({"op": "explode"})
        master.set("k", "v")  # the connection is still good
        assert master.get("k") == b"v"
    finally:
        master.close()


def test_rendezvous_errors(monkeypatch):
    with pytest.raises(RuntimeError, match="No rendezvous handler for carrier://"):
        next(rendezvous("carrier://x"))
    with pytest.raises(ValueError, match="node-specific arguments"):
        next(rendezvous("tcp://127.0.0.1:1?rank=0&world_size=1", rank=0, world_size=1))
    with pytest.raises(ValueError, match="rank parameter missing"):
        next(rendezvous("tcp://127.0.0.1:1?world_size=1"))
    with pytest.raises(ValueError, match="port number missing"):
        next(rendezvous("tcp://127.0.0.1", rank=0, world_size=1))
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="environment variable RANK expected, but not set"):
        next(rendezvous("env://"))
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval \[0, 1\]"):
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "1")
        next(rendezvous("env://", rank=3, world_size=2))


def test_a_stalled_server_breaks_the_connection_within_the_timeout():
    with socket.socket() as server:  # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        start = time.monotonic()
        store = TCPStore("127.0.0.1", server.getsockname()[1], timeout=datetime.timedelta(seconds=1))
        with pytest.raises(DistNetworkError, match="lost the connection"):
            store.set("k", "v")
        assert time.monotonic() - start < 10
        with pytest.raises(DistNetworkError, match="is broken"):  # a late reply must never be read as another's
            store.get("k")


def test_where_a_store_listens():
    from kiln.distributed.store import _is_local_address

    local = TCPStore("localhost", 0, 1, is_master=True)
    try:
        assert local._server.server_address[0] in ("127.0.0.1", "::1")  # a one-machine job exposes nothing
    finally:
        local.close()
    assert _is_local_address("127.0.0.1")
    assert not _is_local_address("192.0.2.1")  # TEST-NET-1: never an address of this machine
    assert not _is_local_address("no-such-host.invalid")
