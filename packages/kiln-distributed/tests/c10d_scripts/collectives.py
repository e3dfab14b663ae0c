"""Worker: every collective of kiln.distributed on the backend named in argv[1], checked against values
computed locally. Run by test_collectives.py with RANK/WORLD_SIZE/MASTER_* (or an init_method in argv[2])."""

import datetime
import os
import sys

import numpy as np

import kiln
import kiln.distributed as dist

backend = sys.argv[1]
init = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
timeout = datetime.timedelta(seconds=30)
if init and init.startswith(("tcp://", "file://")):
    dist.init_process_group(
        backend,
        init_method=init,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
else:
    dist.init_process_group(backend, timeout=timeout)
r, w = dist.get_rank(), dist.get_world_size()
assert dist.is_initialized() and dist.get_backend() == backend
if os.environ.get("KILN_TEST_FAIL_FIRST") and os.environ.get("KILN_RESTART_COUNT") == "0" and r == 1:
    os._exit(3)  # the first attempt dies after the rendezvous; kiln-run restarts the group


def eq(t, expected):
    got = np.asarray(t.float().tolist() if t.dtype == kiln.bfloat16 else t.tolist())
    assert np.allclose(got, expected), (got, expected)


# all_reduce: every op, several dtypes, a 0-d tensor, a multi-dimensional one
for dtype in (kiln.float32, kiln.float64, kiln.int64, kiln.int32, kiln.float16, kiln.bfloat16):
    t = kiln.full((3, 2), r + 1, dtype=dtype)
    dist.all_reduce(t)
    eq(t, np.full((3, 2), w * (w + 1) / 2))
t = kiln.tensor(float(r + 2))
dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
eq(t, np.prod(np.arange(2, w + 2)))
for op, fn in ((dist.ReduceOp.MAX, max), (dist.ReduceOp.MIN, min)):
    t = kiln.tensor([float(r), float(-r)])
    dist.all_reduce(t, op)
    eq(t, [fn(range(w)), fn(-i for i in range(w))])
t = kiln.full((4,), float(r))
dist.all_reduce(t, dist.ReduceOp.AVG)
eq(t, np.full(4, (w - 1) / 2))
t = kiln.tensor([1 << r, 3], dtype=kiln.int64)
dist.all_reduce(t, dist.ReduceOp.BOR)
eq(t, [(1 << w) - 1, 3])
# async_op: a Work to wait on; get_future
work = dist.all_reduce(kiln.ones(5), async_op=True)
assert work.wait() and work.is_completed() and work.is_success()
fut = dist.all_reduce(kiln.ones(2), async_op=True).get_future()
eq(fut.wait()[0], [w, w])
# broadcast from the last rank
t = kiln.arange(6.0).reshape(2, 3) * (r + 1)
dist.broadcast(t, src=w - 1)
eq(t, np.arange(6.0).reshape(2, 3) * w)
# reduce to rank 1
t = kiln.full((2,), float(r + 1))
dist.reduce(t, dst=1)
if r == 1:
    eq(t, [w * (w + 1) / 2] * 2)
# all_gather, all_gather_into_tensor
outs = [kiln.empty(2, 2) for _ in range(w)]
dist.all_gather(outs, kiln.full((2, 2), float(r)))
for i, o in enumerate(outs):
    eq(o, np.full((2, 2), i))
out = kiln.empty(w, 3)
dist.all_gather_into_tensor(out, kiln.full((3,), float(r)))
eq(out, np.repeat(np.arange(w, dtype=float)[:, None], 3, axis=1))
# reduce_scatter, reduce_scatter_tensor
out = kiln.empty(2)
dist.reduce_scatter(out, [kiln.full((2,), float(i + r)) for i in range(w)])
eq(out, np.full(2, sum(r_ + r for r_ in range(w))))
out = kiln.empty(2)
dist.reduce_scatter_tensor(out, kiln.arange(2.0 * w))
eq(out, np.arange(2.0 * w)[2 * r : 2 * r + 2] * w)
# gather / scatter, rooted at rank 0 and at the last rank
gl = [kiln.empty(1) for _ in range(w)] if r == 0 else None
dist.gather(kiln.tensor([float(r * r)]), gl, dst=0)
if r == 0:
    eq(kiln.cat(gl), [i * i for i in range(w)])
t = kiln.empty(2)
dist.scatter(t, [kiln.full((2,), float(i * 10)) for i in range(w)] if r == w - 1 else None, src=w - 1)
eq(t, [r * 10] * 2)
# all_to_all, all_to_all_single (equal and uneven splits)
outs = [kiln.empty(1) for _ in range(w)]
dist.all_to_all(outs, [kiln.tensor([float(r * 10 + j)]) for j in range(w)])
eq(kiln.cat(outs), [j * 10 + r for j in range(w)])
out = kiln.empty(w)
dist.all_to_all_single(out, kiln.arange(float(w)) + 100 * r)
eq(out, [100 * j + r for j in range(w)])
in_splits = [j + 1 for j in range(w)]  # rank r sends j+1 elements to rank j
out_splits = [r + 1] * w
inp = kiln.cat([kiln.full((j + 1,), float(r)) for j in range(w)])
out = kiln.empty(sum(out_splits))
dist.all_to_all_single(out, inp, out_splits, in_splits)
eq(out, np.repeat(np.arange(w, dtype=float), r + 1))
# point to point: a ring, blocking and async; a recv from any source
nxt, prv = (r + 1) % w, (r - 1) % w
got = kiln.empty(3)
reqs = [dist.isend(kiln.full((3,), float(r)), nxt), dist.irecv(got, prv)]
for q in reqs:
    q.wait()
eq(got, [prv] * 3)
ops = [dist.P2POp(dist.isend, kiln.full((1,), float(r)), nxt), dist.P2POp(dist.irecv, got[:1].clone(), prv)]
for q in dist.batch_isend_irecv(ops):
    q.wait()
if r == 0:
    for _ in range(w - 1):
        x = kiln.empty(1)
        src = dist.recv(x)
        assert x.item() == src * 7, (x, src)
else:
    dist.send(kiln.tensor([float(r * 7)]), dst=0)
# object collectives
objs = [None] * w
dist.all_gather_object(objs, {"rank": r, "t": kiln.arange(r + 1), "s": "x" * r})
assert [o["rank"] for o in objs] == list(range(w)) and objs[w - 1]["t"].tolist() == list(range(w))
ol = [{"lr": 0.1}, [1, 2], "hello"] if r == 0 else [None, None, None]
dist.broadcast_object_list(ol, src=0)
assert ol == [{"lr": 0.1}, [1, 2], "hello"], ol
gl = [None] * w if r == 0 else None
dist.gather_object(("r", r), gl, dst=0)
if r == 0:
    assert gl == [("r", i) for i in range(w)], gl
so = [None]
dist.scatter_object_list(so, [i * 2 for i in range(w)] if r == 0 else None, src=0)
assert so == [r * 2], so
if r == 0:
    dist.send_object_list([{"step": 3}, kiln.ones(2)], dst=w - 1)
elif r == w - 1:
    got = [None, None]
    assert dist.recv_object_list(got) == 0 and got[0] == {"step": 3} and got[1].tolist() == [1.0, 1.0], got
# sub-groups: every rank calls new_group; non-members get NON_GROUP_MEMBER
sub = dist.new_group([0, w - 1])
if r in (0, w - 1):
    t = kiln.full((2,), float(r))
    dist.all_reduce(t, group=sub)
    eq(t, [w - 1] * 2)
    assert dist.get_world_size(sub) == 2 and dist.get_process_group_ranks(sub) == [0, w - 1]
    t = kiln.full((1,), float(r))
    dist.broadcast(t, src=w - 1, group=sub)
    eq(t, [w - 1])
else:
    assert sub is dist.GroupMember.NON_GROUP_MEMBER and dist.get_rank(sub) == -1
# a tensor that requires grad is moved like any other (a Parameter broadcast by hand)
t = kiln.full((3,), float(r), requires_grad=True)
dist.broadcast(t, src=0)
eq(t.detach(), [0.0] * 3)
# the same number of elements in other shapes: Gloo and MPI move bytes, and so does the check
t = kiln.arange(6.0).reshape(2, 3) if r == 0 else kiln.zeros(3, 2)
dist.broadcast(t, src=0)
eq(t.reshape(-1), np.arange(6.0))
# an async collective, then a send it must not wait for (PyTorch queues the collective, so must kiln)
a = kiln.full((4,), float(r))
if r == 0:
    work = dist.all_reduce(a, op=dist.ReduceOp.AVG, async_op=True)
    dist.send(kiln.ones(2), dst=1)
    while not work.is_completed():  # polled: once it says so, the average is written
        pass
    eq(a, np.full(4, (w - 1) / 2))
    work.wait()
elif r == 1:
    dist.recv(kiln.empty(2), src=0)
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
else:
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
# a group made by its members only, then a group every rank makes
if r in (0, 1):
    local = dist.new_group([0, 1], use_local_synchronization=True)
    t = kiln.ones(1)
    dist.all_reduce(t, group=local)
    eq(t, [2.0])
everyone = dist.new_group()
t = kiln.ones(1)
dist.all_reduce(t, group=everyone)
eq(t, [float(w)])
dist.destroy_process_group(everyone)
try:
    dist.all_reduce(t, group=everyone)
except ValueError as e:
    assert "destroyed" in str(e), e
else:
    raise AssertionError("a destroyed group ran a collective")
dist.barrier()
dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
dist.destroy_process_group()
assert not dist.is_initialized()
if backend == "gloo" and os.environ.get("KILN_USE_AGENT_STORE"):
    # under kiln-run the store outlives the group: a second default group in the same processes must not
    # meet the first one's keys there
    dist.init_process_group(backend, timeout=timeout)
    t = kiln.ones(2)
    dist.all_reduce(t)
    eq(t, [float(w)] * 2)
    dist.destroy_process_group()
print(f"rank {r}: ok", flush=True)
