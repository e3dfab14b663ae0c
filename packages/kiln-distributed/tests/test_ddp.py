"""DistributedDataParallel: the bucket assignment against PyTorch's, the pieces that need no processes,
and (ddp_scripts/ddp_worker.py, started once per backend on 2 ranks) training that matches one process
on the whole batch: an MLP and a CNN with SGD and Adam, several buckets, no_sync, unused parameters,
gradient_as_bucket_view, buffers, communication hooks, and the errors for models that differ across
ranks or parameters left without gradients."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import kiln
import kiln.distributed as dist
import kiln.nn as nn
from kiln.distributed.ddp import (
    _DEFAULT_FIRST_BUCKET_BYTES,
    GradBucket,
    _compute_bucket_assignment_by_size,
    _find_tensors,
)

_spec = importlib.util.spec_from_file_location("ddp_launch", Path(__file__).parent / "ddp_scripts" / "launch.py")
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

CHECKS = [
    "mlp_sgd",
    "mlp_adam_small_buckets",
    "cnn_sgd",
    "cnn_adam_small_buckets",
    "digits_cnn_on_the_digits",
    "initial_buckets_reverse_order_small_first",
    "buckets_rebuilt_in_gradient_order",
    "no_sync_accumulates_then_reduces_the_sum",
    "gradient_as_bucket_view",
    "gradient_as_bucket_view_zero_grad_keeps_views",
    "find_unused_branch_unused_some_iterations",
    "find_unused_globally_unused_grad_untouched",
    "find_unused_outputs_outside_the_loss",
    "static_graph_with_an_unused_head",
    "unused_parameter_without_find_unused_raises",
    "different_shapes_across_ranks_raise",
    "different_param_counts_raise",
    "broadcast_buffers_from_rank_0",
    "comm_hooks",
    "compressed_comm_hooks",
    "state_dict_and_module_attribute",
    "eval_and_no_grad_forward",
]


REPORTS = launch.Reports("ddp_worker.py", 2, CHECKS)


@pytest.mark.parametrize("backend", launch.backends())
@pytest.mark.parametrize("name", CHECKS)
def test_ddp_on_two_ranks(backend, name):
    REPORTS.assert_ok(backend, name)


@pytest.mark.parametrize("backend", launch.backends())
def test_every_worker_check_is_listed(backend):
    REPORTS.assert_complete(backend)


# ------------------------------------------------------------------------------------------------ no processes


def _params(spec):
    return [kiln.zeros(n, dtype=dt) for n, dt in spec]


@pytest.mark.parametrize(
    "spec,limits",
    [
        ([(1000, kiln.float32)] * 5, [1024 * 1024]),
        ([(300, kiln.float32), (5, kiln.float32), (700, kiln.float32), (100, kiln.float32)], [1000, 2000]),
        ([(300, kiln.float32), (300, kiln.float64), (300, kiln.float32), (300, kiln.float64)], [1500, 1200]),
        ([(n, kiln.float32) for n in (3, 1000, 7, 250, 250, 600, 2, 2)], [1200, 4000]),
        ([(256 * 1024, kiln.float32), (10, kiln.float32), (300 * 1024, kiln.float32)], [_DEFAULT_FIRST_BUCKET_BYTES]),
    ],
)
def test_bucket_assignment_matches_pytorch(spec, limits):
    torch = pytest.importorskip("torch")
    td = pytest.importorskip("torch.distributed")
    if not td.is_available():
        pytest.skip("torch.distributed is not built")
    tdt = {kiln.float32: torch.float32, kiln.float64: torch.float64}
    ours_in = _params(spec)
    theirs_in = [torch.zeros(n, dtype=tdt[dt]) for n, dt in spec]
    assert _compute_bucket_assignment_by_size(ours_in, limits) == tuple(
        list(x) for x in td._compute_bucket_assignment_by_size(theirs_in, limits)
    )
    # in a given order (DDP's reverse order, and its rebuild in gradient order)
    order = list(reversed(range(len(spec))))
    ours = _compute_bucket_assignment_by_size([ours_in[i] for i in order], limits, None, order)
    theirs = td._compute_bucket_assignment_by_size([theirs_in[i] for i in order], limits, [False] * len(spec), order)
    assert sorted(map(sorted, ours[0])) == sorted(map(sorted, theirs[0]))
    assert [sorted(b) for b in ours[0]] == [sorted(b) for b in theirs[0]]
    assert ours[1] == list(theirs[1])


def test_bucket_assignment_reverse_order_small_first_bucket():
    # what DDP builds at construction: reverse order of parameters(), 1 MiB first bucket, then 25 MiB
    mb = 1024 * 1024
    params = [kiln.zeros(n // 4) for n in (mb // 2, mb // 2, mb // 2, 4 * mb, 30 * mb, mb)]
    order = list(reversed(range(len(params))))
    buckets, limits = _compute_bucket_assignment_by_size([params[i] for i in order], [mb, 25 * mb], None, order)
    assert buckets == [[5], [4], [3, 2, 1, 0]]
    assert limits == [mb, 25 * mb, 25 * mb]


def test_grad_bucket_accessors():
    buf = kiln.arange(10.0)
    p1, p2 = nn.Parameter(kiln.zeros(2, 3)), nn.Parameter(kiln.zeros(4))
    views = [buf[:6].view(2, 3), buf[6:].view(4)]
    b = GradBucket(1, 2, buf, views, [p1, p2])
    assert b.index() == 1 and b.is_last() and b.buffer() is buf
    assert [g.shape for g in b.gradients()] == [(2, 3), (4,)]
    assert b.parameters()[0] is p1 and b.parameters()[1] is p2
    np.testing.assert_array_equal(b.gradients()[1].numpy(), [6.0, 7.0, 8.0, 9.0])
    other = kiln.zeros(10)
    b.set_buffer(other)
    assert b.buffer() is other
    assert not GradBucket(0, 2, buf, views, [p1, p2]).is_last()


def test_find_tensors_walks_outputs():
    @dataclasses.dataclass
    class Out:
        logits: kiln.Tensor
        extra: dict

    a, b, c, d = (kiln.ones(1) * i for i in range(4))
    found = list(_find_tensors((a, [b, {"k": c}], Out(d, {"n": None, "s": "x"}), 3, None)))
    assert [t.item() for t in found] == [0.0, 1.0, 2.0, 3.0]


def test_kiln_nn_parallel_name_is_this_class():
    from kiln.distributed.ddp import DistributedDataParallel
    from kiln.nn.parallel import DistributedDataParallel as FromNN

    assert FromNN is DistributedDataParallel


def test_construction_without_a_process_group_says_so():
    from kiln.distributed.ddp import DistributedDataParallel

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DistributedDataParallel(nn.Linear(2, 2))
