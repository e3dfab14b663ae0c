"""One rank of the MPI engine tests, run under ``mpiexec -n N python engine_worker.py MODE``.

Modes: ``ops`` (every operation against NumPy), ``timeout`` (a peer that never joins), ``mismatch``
(ranks that disagree with MPI's), ``frontend`` (``kiln.distributed.init_process_group("mpi")``).
Each rank prints ``OK <mode> rank <r>`` when its checks pass; a failed check raises, which ends the rank
with an error (MPI aborts the job) and the test sees the traceback.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

import ml_dtypes
import numpy as np
from kiln_distributed.mpi import MPIEngine, world_rank_and_size

import kiln
from kiln.distributed.engine import ReduceOp
from kiln.distributed.errors import DistBackendError

TIMEOUT = datetime.timedelta(seconds=30)
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "int64": np.int64,
    "int32": np.int32,
    "uint8": np.uint8,
    "float16": np.float16,
    "bfloat16": BF16,
    "bool": np.bool_,
}


def tensor(a: np.ndarray):
    return kiln.from_numpy(np.array(a, copy=True, order="C"))


def data(r: int, dtype, n: int = 5, salt: int = 0) -> np.ndarray:
    """Rank ``r``'s input: small exact values (so every dtype's sums and products are exact)."""
    rng = np.random.default_rng(1000 * salt + r)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if np.dtype(dtype).kind == "u":
        return rng.integers(0, 4, n).astype(dtype)
    vals = rng.integers(-3, 4, n).astype(np.float64)
    if np.dtype(dtype).kind == "f" or np.dtype(dtype) == BF16:
        vals = vals / 2
    return vals.astype(dtype)


def expected(arrays: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    stack = np.stack(arrays)
    dt = stack.dtype
    if dt == np.bool_:
        u = stack.astype(np.uint8)
        out = {
            ReduceOp.SUM: u.max(0),
            ReduceOp.MAX: u.max(0),
            ReduceOp.BOR: u.max(0),
            ReduceOp.PRODUCT: u.min(0),
            ReduceOp.MIN: u.min(0),
            ReduceOp.BAND: u.min(0),
            ReduceOp.BXOR: np.bitwise_xor.reduce(u, 0),
        }[op]
        return out.astype(np.bool_)
    wide = stack.astype(np.float64) if dt.kind == "f" or dt == BF16 else stack
    out = {
        ReduceOp.SUM: lambda: wide.sum(0),
        ReduceOp.PRODUCT: lambda: wide.prod(0),
        ReduceOp.MIN: lambda: wide.min(0),
        ReduceOp.MAX: lambda: wide.max(0),
        ReduceOp.BAND: lambda: np.bitwise_and.reduce(wide, 0),
        ReduceOp.BOR: lambda: np.bitwise_or.reduce(wide, 0),
        ReduceOp.BXOR: lambda: np.bitwise_xor.reduce(wide, 0),
    }[op]()
    return np.asarray(out).astype(dt)


def same(got, want, what: str) -> None:
    g = got.numpy() if hasattr(got, "numpy") else got
    if g.dtype == BF16:
        g, want = g.astype(np.float32), np.asarray(want).astype(np.float32)
    if not np.array_equal(g, want):
        raise AssertionError(f"{what}: got {g!r}, want {want!r}")


def ops_for(dtype) -> list[ReduceOp]:
    base = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if np.dtype(dtype).kind in "iub":
        base += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    return base


def check_engine(eng: MPIEngine, members: list[int], label: str) -> None:
    """Every operation of ``eng`` (group ranks 0..n-1 = ``members``) against NumPy."""
    r, n = eng.rank, eng.world_size
    everyone = range(n)
    # allreduce: every dtype, every op; all in flight at once, then waited in reverse order
    pending = []
    for name, dt in DTYPES.items():
        for op in ops_for(dt):
            salt = list(ReduceOp).index(op)
            t = tensor(data(r, dt, salt=salt))
            want = expected([data(i, dt, salt=salt) for i in everyone], op)
            pending.append((eng.allreduce(t, op), t, want, f"{label} allreduce {name} {op.name}"))
    for w, t, want, what in reversed(pending):
        assert w.wait() is True
        assert w.is_completed()
        same(t, want, what)
    # 0-d and empty tensors
    t = tensor(np.array(float(r + 1), np.float32))
    eng.allreduce(t, ReduceOp.SUM).wait()
    same(t, np.array(n * (n + 1) / 2, np.float32), f"{label} allreduce 0-d")
    t = tensor(np.zeros(0, np.float16))
    eng.allreduce(t, ReduceOp.SUM).wait()
    # bitwise op on a float tensor is refused, as PyTorch does
    try:
        eng.allreduce(tensor(np.ones(2, np.float32)), ReduceOp.BAND)
    except RuntimeError as e:
        assert "non-integral" in str(e), e
    else:
        raise AssertionError("BAND on float32 accepted")
    # a wait from another thread
    t = tensor(data(r, np.float32))
    w = eng.allreduce(t, ReduceOp.MAX)
    box = []
    th = threading.Thread(target=lambda: box.append(w.wait()))
    th.start()
    th.join(20)
    assert box == [True], box
    same(t, expected([data(i, np.float32) for i in everyone], ReduceOp.MAX), f"{label} allreduce from a thread")
    # broadcast from every root
    for src in everyone:
        for dt in (np.float32, BF16, np.int64, np.bool_):
            t = tensor(data(r, dt, salt=src))
            eng.broadcast(t, src).wait()
            same(t, data(src, dt, salt=src), f"{label} broadcast from {src}")
    # reduce to every root (others' tensors are left alone)
    for dst in everyone:
        for dt in (np.float32, np.float16, BF16, np.int64, np.bool_):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                t = tensor(data(r, dt, salt=dst))
                eng.reduce(t, dst, op).wait()
                want = expected([data(i, dt, salt=dst) for i in everyone], op) if r == dst else data(r, dt, salt=dst)
                same(t, want, f"{label} reduce {op.name} to {dst} {np.dtype(dt).name}")
    # allgather: separate tensors (through one buffer), chunks of one tensor (straight), in place
    for dt in (np.float32, BF16, np.int64, np.bool_):
        mine = data(r, dt, n=3)
        want = np.stack([data(i, dt, n=3) for i in everyone])
        outs = [tensor(np.zeros(3, dt)) for _ in everyone]
        eng.allgather(outs, tensor(mine)).wait()
        for i in everyone:
            same(outs[i], want[i], f"{label} allgather separate {i}")
        big = tensor(np.zeros((n, 3), dt))
        assert eng._joined([big[i].numpy() for i in everyone]) is not None  # received in place, no copy
        eng.allgather([big[i] for i in everyone], tensor(mine)).wait()
        same(big, want, f"{label} allgather into one tensor")
        big = tensor(np.zeros((n, 3), dt))
        big[r].numpy()[:] = mine
        eng.allgather([big[i] for i in everyone], big[r]).wait()
        same(big, want, f"{label} allgather in place")
    # gather to every root, both output layouts
    for dst in everyone:
        mine = data(r, np.float64, n=2, salt=dst)
        want = np.stack([data(i, np.float64, n=2, salt=dst) for i in everyone])
        outs = [tensor(np.zeros(2)) for _ in everyone] if r == dst else None
        eng.gather(outs, tensor(mine), dst).wait()
        if r == dst:
            for i in everyone:
                same(outs[i], want[i], f"{label} gather to {dst}")
        big = tensor(np.zeros((n, 2)))
        eng.gather([big[i] for i in everyone] if r == dst else None, tensor(mine), dst).wait()
        if r == dst:
            same(big, want, f"{label} gather into one tensor")
        big = tensor(np.zeros((n, 2)))
        big[r].numpy()[:] = mine
        eng.gather([big[i] for i in everyone] if r == dst else None, big[r], dst).wait()
        if r == dst:
            same(big, want, f"{label} gather in place")
    # scatter from every root, both input layouts
    for src in everyone:
        chunks = [data(100 + i, np.int64, n=4, salt=src) for i in everyone]
        out = tensor(np.zeros(4, np.int64))
        ins = [tensor(c) for c in chunks] if r == src else None
        eng.scatter(out, ins, src).wait()
        same(out, chunks[r], f"{label} scatter from {src}")
        big = tensor(np.stack(chunks))
        out = tensor(np.zeros(4, np.int64))
        eng.scatter(out, [big[i] for i in everyone] if r == src else None, src).wait()
        same(out, chunks[r], f"{label} scatter from one tensor")
        if r == src:  # the source's output is its own chunk of the input (MPI_IN_PLACE)
            big = tensor(np.stack(chunks))
            eng.scatter(big[r], [big[i] for i in everyone], src).wait()
            same(big, np.stack(chunks), f"{label} scatter in place")
        else:
            out = tensor(np.zeros(4, np.int64))
            eng.scatter(out, None, src).wait()
            same(out, chunks[r], f"{label} scatter to others")
    # reduce_scatter: equal chunks (block) in several dtypes, then chunks of different sizes
    for dt in (np.float32, np.float16, BF16, np.int64, np.bool_):
        ins_of = {i: [data(10 * i + j, dt, n=3) for j in everyone] for i in everyone}
        out = tensor(np.zeros(3, dt))
        eng.reduce_scatter(out, [tensor(c) for c in ins_of[r]], ReduceOp.SUM).wait()
        same(
            out, expected([ins_of[i][r] for i in everyone], ReduceOp.SUM), f"{label} reduce_scatter {np.dtype(dt).name}"
        )
    ins_of = {i: [data(10 * i + j, np.float64, n=j + 1) for j in everyone] for i in everyone}
    out = tensor(np.zeros(r + 1))
    eng.reduce_scatter(out, [tensor(c) for c in ins_of[r]], ReduceOp.MIN).wait()
    same(out, expected([ins_of[i][r] for i in everyone], ReduceOp.MIN), f"{label} reduce_scatter uneven")
    # alltoall: equal sizes (one tensor each side), and sizes that differ per pair
    src_of = {i: np.stack([data(20 * i + j, np.float32, n=2) for j in everyone]) for i in everyone}
    inp = tensor(src_of[r])
    out = tensor(np.zeros((n, 2), np.float32))
    eng.alltoall([out[j] for j in everyone], [inp[j] for j in everyone]).wait()
    same(out, np.stack([src_of[j][r] for j in everyone]), f"{label} alltoall")

    def size(i: int, j: int) -> int:  # rank i sends size(i, j) elements to rank j
        return 1 + i + 2 * j

    ins = [tensor(data(30 * r + j, BF16, n=size(r, j))) for j in everyone]
    outs = [tensor(np.zeros(size(j, r), BF16)) for j in everyone]
    eng.alltoall(outs, ins).wait()
    for j in everyone:
        same(outs[j], data(30 * j + r, BF16, n=size(j, r)), f"{label} alltoall uneven from {j}")
    # send / recv around a ring, negative tags, recv from any source
    nxt, prv = (r + 1) % n, (r - 1) % n
    for tag in (0, 7, -3):
        s = eng.send(tensor(data(r, np.int64, salt=tag + 50)), nxt, tag)
        t = tensor(np.zeros(5, np.int64))
        eng.recv(t, prv, tag).wait()
        s.wait()
        same(t, data(prv, np.int64, salt=tag + 50), f"{label} send/recv tag {tag}")
    # tags keep messages apart: 1 and -1 sent in one order, received in the other
    if n > 1:
        a, b = tensor(np.array([1.0])), tensor(np.array([-1.0]))
        sends = [eng.send(a, nxt, 1), eng.send(b, nxt, -1)]
        ga, gb = tensor(np.zeros(1)), tensor(np.zeros(1))
        eng.recv(gb, prv, -1).wait()
        eng.recv(ga, prv, 1).wait()
        for w in sends:
            w.wait()
        same(ga, np.array([1.0]), f"{label} tag 1")
        same(gb, np.array([-1.0]), f"{label} tag -1")
    if r == 0:
        got = {}
        for _ in range(n - 1):
            t = tensor(np.zeros(4, np.float64))
            w = eng.recv(t, None, 11)
            w.wait()
            src = w.source_rank()
            same(t, data(src, np.float64, n=4, salt=11), f"{label} recv any source")
            got[src] = True
        assert sorted(got) == list(range(1, n)), got
    else:
        time.sleep(0.05 * r)
        eng.send(tensor(data(r, np.float64, n=4, salt=11)), 0, 11).wait()
    # barrier
    eng.barrier().wait()
    assert eng.reduce_ops >= {ReduceOp.SUM, ReduceOp.BXOR} and ReduceOp.AVG not in eng.reduce_ops
    del members


def mode_ops() -> None:
    rank, size = world_rank_and_size()
    eng = MPIEngine(None, rank, size, TIMEOUT)
    check_engine(eng, list(range(size)), "world")
    if size == 3:
        for members in ([0, 2], [2, 0]):
            if rank in members:
                sub = MPIEngine(None, members.index(rank), 2, TIMEOUT, group_ranks=members)
                check_engine(sub, members, f"group {members}")
                # the group's traffic does not disturb the world's: a world op in between still works
                sub.shutdown()
            t = tensor(np.array([rank], np.int64))
            eng.allreduce(t, ReduceOp.SUM).wait()
            same(t, np.array([3]), "world after group")
    eng.shutdown()
    eng.shutdown()
    try:
        eng.barrier()
    except DistBackendError:
        pass
    else:
        raise AssertionError("an engine that was shut down accepted an operation")
    print(f"OK ops rank {rank}", flush=True)


def mode_timeout() -> None:
    from mpi4py import MPI

    rank, size = world_rank_and_size()
    ctrl = MPI.COMM_WORLD.Dup()  # to meet at the end, whatever is left pending elsewhere
    eng = MPIEngine(None, rank, size, TIMEOUT)
    if rank == 0:
        w = eng.allreduce(tensor(np.ones(4, np.float32)), ReduceOp.SUM)
        start = time.monotonic()
        try:
            w.wait(timeout=datetime.timedelta(seconds=1))
        except DistBackendError as e:
            took = time.monotonic() - start
            assert "allreduce" in str(e) and "1 s" in str(e), e
            assert 0.9 <= took < 3, took
            assert w.is_completed()
            try:
                w.wait()
            except DistBackendError:
                pass
            else:
                raise AssertionError("a timed-out work waited successfully later") from None
            print(f"OK timeout rank 0 took {took:.2f}", flush=True)
        else:
            raise AssertionError("wait returned although rank 1 never joined")
        # making a group, or a whole-world group, that rank 1 never joins times out too
        for group in ([0, 1], None):
            start = time.monotonic()
            try:
                MPIEngine(None, 0, size, datetime.timedelta(seconds=0.5), group_ranks=group)
            except DistBackendError as e:
                took = time.monotonic() - start
                assert "timed out after 0.5 s" in str(e) and took < 2.5, (e, took)
            else:
                raise AssertionError("a group was made without rank 1")
        print("OK timeout rank 0 group setup", flush=True)
    else:
        print(f"OK timeout rank {rank}", flush=True)
    # rank 0 has operations pending forever: meet on another communicator, then leave without
    # MPI_Finalize (which would wait for them)
    ctrl.Barrier()
    sys.stdout.flush()
    os._exit(0)


def mode_mismatch() -> None:
    rank, size = world_rank_and_size()
    # every rank is told its neighbour's rank: every rank raises, none hangs
    for bad_rank, bad_size in (((rank + 1) % size, size), (rank, size + 1)):
        try:
            MPIEngine(None, bad_rank, bad_size, TIMEOUT)
        except DistBackendError as e:
            assert "disagree with MPI" in str(e), e
        else:
            raise AssertionError("an engine accepted ranks that disagree with MPI")
    # a group whose members are told the wrong group ranks
    if rank in (0, 1):
        try:
            MPIEngine(None, 1 - rank, 2, TIMEOUT, group_ranks=[0, 1])
        except DistBackendError as e:
            assert "disagree" in str(e), e
        else:
            raise AssertionError("a group accepted ranks out of MPI's order")
    # a good engine still works afterwards
    eng = MPIEngine(None, rank, size, TIMEOUT)
    t = tensor(np.array([1.0], np.float32))
    eng.allreduce(t, ReduceOp.SUM).wait()
    same(t, np.array([size], np.float32), "after mismatch")
    eng.shutdown()
    print(f"OK mismatch rank {rank}", flush=True)


def mode_frontend() -> None:
    import kiln.distributed as dist

    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        os.environ.pop(var, None)
    dist.init_process_group(backend="mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert (rank, size) == world_rank_and_size()
    assert dist.get_backend() == "mpi"
    t = kiln.tensor([float(rank + 1), 2.0])
    dist.all_reduce(t)
    same(t, np.array([size * (size + 1) / 2, 2.0 * size], np.float32), "frontend all_reduce")
    t = kiln.tensor([float(rank)])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same(t, np.array([(size - 1) / 2], np.float32), "frontend AVG")
    outs = [kiln.zeros(2) for _ in range(size)]
    dist.all_gather(outs, kiln.full((2,), float(rank)))
    for i in range(size):
        same(outs[i], np.full(2, float(i), np.float32), "frontend all_gather")
    out = kiln.zeros(2 * size)
    dist.all_gather_into_tensor(out, kiln.full((2,), float(rank)))
    same(out, np.repeat(np.arange(size, dtype=np.float32), 2), "frontend all_gather_into_tensor")
    out = kiln.zeros(1, dtype=kiln.bfloat16)
    dist.reduce_scatter_tensor(out, kiln.arange(size, dtype=kiln.bfloat16) + rank)
    same(out, np.array([size * rank + size * (size - 1) / 2], BF16), "frontend reduce_scatter_tensor")
    if rank == 0:
        srcs = set()
        for _ in range(size - 1):
            t = kiln.zeros(1)
            src = dist.recv(t)
            same(t, np.array([10.0 * src], np.float32), "frontend recv from any source")
            srcs.add(src)
        assert srcs == set(range(1, size)), srcs
    else:
        dist.send(kiln.tensor([10.0 * rank]), 0)
    if size == 3:
        group = dist.new_group([0, 2])
        if rank in (0, 2):
            t = kiln.tensor([float(rank)], dtype=kiln.int64)
            work = dist.all_reduce(t, group=group, async_op=True)
            work.wait()
            same(t, np.array([2]), "frontend group all_reduce")
            assert dist.get_rank(group) == [0, 2].index(rank)
    dist.barrier()
    dist.destroy_process_group()
    print(f"OK frontend rank {rank}", flush=True)


def abort_on_error(kind, value, tb) -> None:
    """A failed check ends the whole job at once (MPI_Finalize could wait for peers that never come)."""
    import traceback

    from mpi4py import MPI

    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


if __name__ == "__main__":
    sys.excepthook = abort_on_error
    {"ops": mode_ops, "timeout": mode_timeout, "mismatch": mode_mismatch, "frontend": mode_frontend}[sys.argv[1]]()
