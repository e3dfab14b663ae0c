"""``ZeroRedundancyOptimizer`` (``torch.distributed.optim.ZeroRedundancyOptimizer``): an optimizer whose
state is sharded across the ranks of a process group (ZeRO stage 1).

Every rank holds every parameter, but the optimizer state (Adam's moments, say) only for its own shard:
the parameters are partitioned greedily by size (largest first, each to the rank with the fewest
elements so far, as PyTorch does). ``step()`` runs the wrapped optimizer on this rank's shard only,
then every rank broadcasts the parameters it updated. Gradients must already be the same on every rank
(after ``DistributedDataParallel``'s backward, for one).

Not built: ``overlap_with_ddp=True`` (running the shards' steps inside DDP's communication hook) raises
``NotImplementedError``; ``join()`` support (uneven inputs) is absent, as in kiln's DDP.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from itertools import chain
from typing import Any

import kiln
from kiln import Tensor
from kiln.distributed import distributed_c10d as _c10d
from kiln.distributed._groups import _skip_consistency_check
from kiln.distributed.ddp import _copy_from_flat
from kiln.optim.optimizer import Optimizer

__all__ = ["ZeroRedundancyOptimizer"]

logger = logging.getLogger(__name__)


def _is_trainable(param: Tensor) -> bool:
    return param.requires_grad


def _copy_to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it moved to the cpu (lists, tuples and dicts rebuilt)."""
    if isinstance(value, Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: _copy_to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return (
            type(value)(*(_copy_to_cpu(v) for v in value))
            if hasattr(value, "_fields")
            else tuple(_copy_to_cpu(v) for v in value)
        )
    return value


def _copy_to_device(value: Any, device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _copy_to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_to_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_to_device(v, device) for v in value)
    return value


class ZeroRedundancyOptimizer(Optimizer):
    """Wrap ``optimizer_class`` so that each rank keeps the state of only its shard of the parameters
    (``torch.distributed.optim.ZeroRedundancyOptimizer``).

    ``params``: tensors or parameter groups, the same on every rank; ``optimizer_class``: the local
    optimizer (e.g. ``kiln.optim.Adam``), built on this rank's shard with ``**defaults``;
    ``process_group``: default the world; ``parameters_as_bucket_view``: keep each rank's parameters in
    one flat tensor (they become views of it), so that the post-step broadcast is one call per rank;
    ``overlap_with_ddp`` is not supported (``NotImplementedError``).

    ``step()`` updates this rank's shard and broadcasts it; :meth:`consolidate_state_dict` gathers every
    rank's state on one rank, after which :meth:`state_dict` there returns the whole optimizer's state in
    the usual format (global parameter indices), which :meth:`load_state_dict` takes on any rank.
    """

    def __init__(
        self,
        params: Iterable,
        optimizer_class: type[Optimizer],
        process_group: Any = None,
        parameters_as_bucket_view: bool = False,
        overlap_with_ddp: bool = False,
        **defaults: Any,
    ) -> None:
        if overlap_with_ddp:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) is not implemented in kiln: call step() after "
                "backward instead (DistributedDataParallel's hooks then do not run the optimizer)"
            )
        params = self._verify_and_init_params(params)
        self._verify_same_dense_param_type()
        # The parent constructor calls add_param_group(), which this class overrides: the flag tells it
        # apart from a user's later call.
        self.initialized = False
        super().__init__(params, defaults)
        self._param_to_rank_cache: dict[int, int] = {}
        self._param_to_index_cache: dict[int, int] = {}
        self._partition_parameters_cache: list[list[dict]] = []
        self._index_to_param_cache: list[Tensor] = []
        self._device_to_params_per_rank_cache: dict[Any, list[list[Tensor]]] = {}
        self._is_trainable_mask = self._get_is_trainable_mask()
        self._default_device = self._all_params[0].device
        if process_group is None:
            process_group = _c10d.group.WORLD
            if process_group is None:
                raise ValueError(
                    "Default process group has not been initialized, please make sure to call init_process_group."
                )
        self.process_group = process_group
        self.world_size: int = _c10d.get_world_size(self.process_group)
        self.rank: int = _c10d.get_rank(self.process_group)
        self.global_rank: int = _c10d.get_global_rank(self.process_group, self.rank)
        self._overlap_with_ddp = False
        self._optim_defaults = defaults
        self._optim_constructor = optimizer_class
        self._init_local_optimizer()
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._buckets: list[list[Tensor]] = []
        self._build_param_buckets()
        # the whole state, on the rank consolidate_state_dict() gathered it to
        self._all_state_dicts: list[dict[str, Any]] = []
        self._params_synced_once = False
        self.initialized = True

    # ------------------------------------------------------------------ parameters and partition
    def _verify_and_init_params(self, params: Any) -> list:
        try:
            all_params = list(params)
        except TypeError as e:
            raise TypeError(
                "`params` argument should be an iterable of Tensors or dicts, but got " + type(params).__name__
            ) from e
        if len(all_params) == 0:
            raise ValueError("ZeroRedundancyOptimizer did not receive any parameters")
        all_tensors = all(isinstance(p, Tensor) for p in all_params)
        all_dicts = all(isinstance(p, dict) for p in all_params)
        if not all_tensors and not all_dicts:
            raise TypeError("`params` argument should be an iterable of Tensors or dicts")
        if all_tensors:
            self._all_params = all_params
        else:
            self._all_params = []
            for group in all_params:
                if "params" not in group:
                    raise ValueError(
                        "Each parameter group passed-in via `params` must have a 'params' key mapping to the "
                        "parameters in the group"
                    )
                group_params = group["params"]
                self._all_params.extend([group_params] if isinstance(group_params, Tensor) else list(group_params))
        return all_params

    def _verify_same_dense_param_type(self) -> None:
        typename = self._all_params[0].type()
        for p in self._all_params[1:]:
            if p.type() != typename:
                raise ValueError(
                    "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got "
                    f"{typename} and {p.type()}"
                )

    def _get_is_trainable_mask(self) -> list[bool]:
        return [_is_trainable(p) for p in self._all_params]

    def _clear_cache(self) -> None:
        self._partition_parameters_cache.clear()
        self._param_to_rank_cache.clear()
        self._index_to_param_cache.clear()
        self._param_to_index_cache.clear()
        self._device_to_params_per_rank_cache.clear()

    def _partition_parameters(self) -> list[list[dict]]:
        """Per rank, its parameter groups: each group's parameters sorted by size (largest first, ties in
        their order) go one by one to the rank holding the fewest elements so far (counted over all groups)."""
        if not self._partition_parameters_cache:
            self._partition_parameters_cache = [[] for _ in range(self.world_size)]
            sizes = [0] * self.world_size
            for group in self.param_groups:
                per_rank: list[list[Tensor]] = [[] for _ in range(self.world_size)]
                for param in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
                    rank = sizes.index(min(sizes))
                    per_rank[rank].append(param)
                    sizes[rank] += param.numel()
                names = dict(zip(map(id, group["params"]), group.get("param_names", ()), strict=False))
                for rank, params in enumerate(per_rank):
                    shard = copy.copy(group)
                    shard["params"] = params
                    if "param_names" in group:
                        shard["param_names"] = [names[id(p)] for p in params]
                    self._partition_parameters_cache[rank].append(shard)
        return self._partition_parameters_cache

    @property
    def _param_to_rank(self) -> dict[int, int]:
        """``id(param)`` -> the rank that updates it."""
        if not self._param_to_rank_cache:
            for rank, groups in enumerate(self._partition_parameters()):
                for group in groups:
                    for p in group["params"]:
                        self._param_to_rank_cache[id(p)] = rank
        return self._param_to_rank_cache

    @property
    def _param_to_index(self) -> dict[int, int]:
        """``id(param)`` -> its index in the whole optimizer's ``state_dict``."""
        if not self._param_to_index_cache:
            self._param_to_index_cache = {
                id(p): i for i, p in enumerate(chain.from_iterable(g["params"] for g in self.param_groups))
            }
        return self._param_to_index_cache

    @property
    def _index_to_param(self) -> list[Tensor]:
        if not self._index_to_param_cache:
            self._index_to_param_cache = list(chain.from_iterable(g["params"] for g in self.param_groups))
        return self._index_to_param_cache

    @property
    def _device_to_params_per_rank(self) -> dict[Any, list[list[Tensor]]]:
        if not self._device_to_params_per_rank_cache:
            for rank, groups in enumerate(self._partition_parameters()):
                for group in groups:
                    for p in group["params"]:
                        key = str(p.device)
                        if key not in self._device_to_params_per_rank_cache:
                            self._device_to_params_per_rank_cache[key] = [[] for _ in range(self.world_size)]
                        self._device_to_params_per_rank_cache[key][rank].append(p)
        return self._device_to_params_per_rank_cache

    def _init_local_optimizer(self) -> None:
        shard = self._partition_parameters()[self.rank]
        self.optim: Optimizer = self._optim_constructor(shard, **self._optim_defaults)
        # the local optimizer fills in its defaults (Adam's betas...): show them in the exposed groups
        self._sync_param_groups(self.optim.param_groups, self.param_groups)

    @staticmethod
    def _sync_param_groups(src: list[dict], dst: list[dict]) -> None:
        """Copy every option but ``params`` from ``src``'s groups into ``dst``'s."""
        if len(src) != len(dst):
            raise RuntimeError(
                f"Mismatch between number of source and destination parameter groups: {len(src)} vs {len(dst)}"
            )
        for s, d in zip(src, dst, strict=True):
            for key, value in s.items():
                if key not in ("params", "param_names"):
                    d[key] = value

    def _build_param_buckets(self) -> None:
        """With ``parameters_as_bucket_view``: each rank's trainable parameters (per device) become views
        of one flat tensor, which ``step`` broadcasts in one call."""
        if not self.parameters_as_bucket_view:
            return
        self._buckets = []
        for device, params_per_rank in self._device_to_params_per_rank.items():
            dev_buckets = []
            for params in params_per_rank:
                trainable = []
                dtype = None
                for p in params:
                    if not _is_trainable(p):
                        p.data = p.data.detach().clone()  # no longer part of an old bucket
                    else:
                        trainable.append(p)
                    dtype = p.dtype
                size = sum(p.numel() for p in trainable)
                if size == 0:
                    bucket = kiln.zeros(1, device=device)  # a rank without parameters still broadcasts
                else:
                    bucket = kiln.empty(size, dtype=dtype, device=device)
                    offset = 0
                    with kiln.no_grad():
                        for p in trainable:
                            n = p.numel()
                            bucket[offset : offset + n].copy_(p.data.reshape(-1))
                            p.data = bucket[offset : offset + n].view(p.shape)
                            offset += n
                dev_buckets.append(bucket)
            self._buckets.append(dev_buckets)

    # ------------------------------------------------------------------ the optimizer's API
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group: its parameters are partitioned across the ranks like the others (the
        existing ones keep their ranks)."""
        super().add_param_group(param_group)
        if self.initialized:
            self._params_synced_once = False  # new calls: check them once
            self._clear_cache()
            self._all_params = list(chain.from_iterable(g["params"] for g in self.param_groups))
            self._is_trainable_mask = self._get_is_trainable_mask()
            shards = self._partition_parameters()[self.rank]
            if len(shards) == len(self.optim.param_groups) + 1:
                self.optim.add_param_group(shards[-1])
            if self.parameters_as_bucket_view:
                self._build_param_buckets()

    def step(self, closure=None, **kwargs: Any):
        """Update this rank's shard with the local optimizer, then broadcast every shard from its rank.
        Returns the closure's loss, if any."""
        mask = self._get_is_trainable_mask()
        if mask != self._is_trainable_mask:
            logger.warning(
                "ZeroRedundancyOptimizer detected that the trainable parameters changed; rebuilding the parameter "
                "buckets if enabled"
            )
            self._build_param_buckets()
            self._is_trainable_mask = mask
            self._params_synced_once = False
        # the exposed groups may have changed (an LR scheduler): pass them on
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        if closure is not None:
            loss = self.optim.step(closure=closure, **kwargs)
        else:
            loss = self.optim.step(**kwargs)
        self._sync_params()
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        return loss

    def _sync_params(self) -> None:
        """Broadcast each rank's updated parameters from that rank (the front end checks that the ranks
        agree on the first step's calls; later steps repeat the same calls unchecked)."""
        if self._params_synced_once:
            with _skip_consistency_check():
                self._broadcast_shards()
        else:
            self._broadcast_shards()
            self._params_synced_once = True

    def _broadcast_shards(self) -> None:
        works = []
        if self.parameters_as_bucket_view:
            for dev_buckets in self._buckets:
                for rank, bucket in enumerate(dev_buckets):
                    works.append(_c10d.broadcast(bucket, group=self.process_group, group_src=rank, async_op=True))
            for w in works:
                w.wait()
            return
        # without buckets: one flat tensor per rank and dtype, written back into the parameters
        flats = []
        for rank, groups in enumerate(self._partition_parameters()):
            params = [p for g in groups for p in g["params"]]
            by_dtype: dict[Any, list[Tensor]] = {}
            for p in params:
                by_dtype.setdefault((p.dtype, str(p.device)), []).append(p)
            for (_dtype, _device), ps in by_dtype.items():
                with kiln.no_grad():
                    flat = kiln.cat([p.detach().reshape(-1) for p in ps])
                works.append(_c10d.broadcast(flat, group=self.process_group, group_src=rank, async_op=True))
                flats.append((rank, ps, flat))
        for w in works:
            w.wait()
        with kiln.no_grad():
            for rank, ps, flat in flats:
                if rank != self.rank:
                    _copy_from_flat(flat, ps)

    # ------------------------------------------------------------------ checkpoints
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's optimizer state on rank ``to`` (a rank of the group), where
        :meth:`state_dict` can then return the whole state. Every rank must call it."""
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        local = _copy_to_cpu(self.optim.state_dict())
        gathered: list | None = [None] * self.world_size if self.rank == to else None
        _c10d.gather_object(local, gathered, group=self.process_group, group_dst=to)
        self._all_state_dicts = list(gathered) if gathered is not None else []

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer's state, with global parameter indices (after :meth:`consolidate_state_dict`
        to this rank; raises otherwise)."""
        if len(self._all_state_dicts) == 0:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you meant to save the global "
                "state."
            )
        state_dict = super().state_dict()
        state_dict["state"] = {k: v for k, v in state_dict["state"].items() if v is not None}
        partition = self._partition_parameters()
        for rank, local in enumerate(self._all_state_dicts):
            local_groups = local["param_groups"]
            global_groups = partition[rank]
            if len(local_groups) != len(global_groups):
                raise RuntimeError("Mismatch between number of local and global parameter groups")
            for local_group, global_group in zip(local_groups, global_groups, strict=True):
                if len(local_group["params"]) != len(global_group["params"]):
                    raise RuntimeError("Mismatch between number of local and global parameters in parameter group")
                for local_index, param in zip(local_group["params"], global_group["params"], strict=True):
                    if local_index in local["state"]:
                        state_dict["state"][self._param_to_index[id(param)]] = local["state"][local_index]
        state_dict["state"] = dict(sorted(state_dict["state"].items()))
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole optimizer state (from :meth:`state_dict`): each rank keeps the state of its own
        shard."""
        state_dict = dict(state_dict)
        state_dict["state"] = dict(state_dict["state"])
        for index, value in list(state_dict["state"].items()):
            param = self._index_to_param[index]
            if self._param_to_rank[id(param)] != self.rank:
                state_dict["state"][index] = None  # another rank's
            else:
                self.optim.state[param] = _copy_to_device(value, param.device)
                for name, v in list(self.optim.state[param].items()):
                    if isinstance(v, Tensor) and v.dim() == 0:
                        self.optim.state[param][name] = v.cpu()
        super().load_state_dict(state_dict)
        self._sync_param_groups(state_dict["param_groups"], self.param_groups)
        self._sync_param_groups(self.param_groups, self.optim.param_groups)

    def join_hook(self, **kwargs: Any):
        """Uneven inputs (PyTorch's ``Joinable``): not built in kiln."""
        raise NotImplementedError("ZeroRedundancyOptimizer.join_hook() (uneven inputs) is not implemented in kiln")
