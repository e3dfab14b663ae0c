"""ZeroRedundancyOptimizer on 3 ranks (ddp_scripts/zero_worker.py, started once per backend): Adam and
SGD match the plain optimizer in one process (alone and under DistributedDataParallel), PyTorch's greedy
partition, parameters as bucket views, the consolidated state_dict and loading it back, add_param_group,
and the errors; plus what can be checked without processes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import kiln
import kiln.distributed as dist
from kiln.distributed.optim import ZeroRedundancyOptimizer

_spec = importlib.util.spec_from_file_location("ddp_launch", Path(__file__).parent / "ddp_scripts" / "launch.py")
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

CHECKS = [
    "adam_matches_plain_adam",
    "with_ddp_sgd_momentum",
    "parameters_as_bucket_view",
    "consolidate_state_dict_and_load",
    "add_param_group_and_lr_changes",
    "partition_is_pytorchs_greedy",
    "errors",
]


REPORTS = launch.Reports("zero_worker.py", 3, CHECKS)


@pytest.mark.parametrize("backend", launch.backends())
@pytest.mark.parametrize("name", CHECKS)
def test_zero_on_three_ranks(backend, name):
    REPORTS.assert_ok(backend, name)


@pytest.mark.parametrize("backend", launch.backends())
def test_every_worker_check_is_listed(backend):
    REPORTS.assert_complete(backend)


def test_importable_from_kiln_distributed_optim():
    import kiln.distributed.optim as optim

    assert optim.ZeroRedundancyOptimizer is ZeroRedundancyOptimizer
    assert issubclass(ZeroRedundancyOptimizer, kiln.optim.Optimizer)


def test_overlap_with_ddp_not_built():
    p = kiln.nn.Parameter(kiln.zeros(2))
    with pytest.raises(NotImplementedError, match="overlap_with_ddp=True"):
        ZeroRedundancyOptimizer([p], kiln.optim.SGD, overlap_with_ddp=True, lr=0.1)


def test_without_a_process_group_says_so():
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    p = kiln.nn.Parameter(kiln.zeros(2))
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        ZeroRedundancyOptimizer([p], kiln.optim.SGD, lr=0.1)
