"""``swap_in_optimizer_params_and_state`` (``torch.optim.swap_in_optimizer_params_and_state``): run an
optimizer's APIs on other parameter tensors and another state for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

from kiln import Tensor

__all__ = ["swap_in_optimizer_params_and_state"]

_NAME = "swap_in_optimizer_params_and_state"


def _checked_state(state) -> dict:
    if not isinstance(state, dict):
        raise RuntimeError(
            f"{_NAME} requires swapin_optim_state['state'] to be a dict mapping packed parameter ids to per-param "
            f"state dicts, got {type(state).__name__}."
        )
    if any(isinstance(key, Tensor) for key in state):
        raise RuntimeError(f"{_NAME} requires optimizer.state_dict()-style state keyed by packed parameter ids.")
    if any(isinstance(key, int) and not isinstance(value, dict) for key, value in state.items()):
        raise RuntimeError(f"{_NAME} requires per-parameter optimizer state entries to be dictionaries.")
    return state


def _checked_group(index: int, live: dict, group) -> list[int]:
    if not isinstance(group, dict):
        raise RuntimeError(f"{_NAME} requires each optimizer param group to be a dictionary.")
    ids = group.get("params")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise RuntimeError(
            f"{_NAME} requires optimizer.state_dict()-style param_groups[*]['params'] entries keyed by packed "
            "parameter ids."
        )
    if len(live["params"]) != len(ids):
        raise RuntimeError(
            f"swapin_optim_state param group {index} has a different number of params than the live optimizer "
            "param group."
        )
    only_swapin = [key for key in group if key not in live]
    only_live = [key for key in live if key not in group]
    if only_swapin or only_live:
        raise RuntimeError(
            f"{_NAME} requires optimizer.state_dict()-style param group keys to exactly match the live optimizer "
            f"group keys for group {index}. Keys only in swap-in: {only_swapin}. Keys only in live: {only_live}."
        )
    return ids


@contextlib.contextmanager
def swap_in_optimizer_params_and_state(
    optimizer, swapin_parameters: dict[str, Tensor], swapin_optim_state: dict[str, Any]
):
    """Within the ``with`` block, ``optimizer`` works on ``swapin_parameters`` (tensors in the order of its
    parameters, e.g. a ``named_parameters()`` dict) with the state and hyperparameters of
    ``swapin_optim_state`` (an ``optimizer.state_dict()``-shaped dict); on exit its own parameters, groups
    and state come back. In-place changes to the swapped-in state tensors persist in
    ``swapin_optim_state``; new entries do not. The optimizer's state must already exist.
    """
    if not optimizer.state:
        raise RuntimeError(f"{_NAME} requires initialized optimizer state.")
    if not isinstance(swapin_optim_state, dict):
        raise RuntimeError(f"{_NAME} requires a DCP-style optimizer state_dict.")
    state = _checked_state(swapin_optim_state.get("state"))
    groups = swapin_optim_state.get("param_groups")
    if not isinstance(groups, list):
        raise RuntimeError(
            f"{_NAME} requires swapin_optim_state['param_groups'] to be a list of param-group dicts, got "
            f"{type(groups).__name__}."
        )
    if len(groups) != len(optimizer.param_groups):
        raise RuntimeError("swapin_optim_state has a different number of parameter groups than the live optimizer.")
    tensors = list(swapin_parameters.values())
    offset, seen, plan = 0, set(), []
    for index, (live, group) in enumerate(zip(optimizer.param_groups, groups)):
        ids = _checked_group(index, live, group)
        seen.update(ids)
        if offset + len(ids) > len(tensors):
            raise RuntimeError(
                f"{_NAME} requires the explicit parameter state to match optimizer.param_groups ordering."
            )
        plan.append((live, group, tensors[offset : offset + len(ids)]))
        offset += len(ids)
    extra = [key for key in state if key not in seen]
    if extra:
        raise RuntimeError(
            f"{_NAME} requires swapin_optim_state['state'] to be keyed only by packed parameter ids from "
            f"param_groups[*]['params']; got extra keys {extra!r}."
        )
    own_state = optimizer.state
    snapshots = [dict(group) for group in optimizer.param_groups]
    try:
        swapped: defaultdict = defaultdict(dict)
        for live, group, params in plan:
            live["params"] = params
            live.update({key: value for key, value in group.items() if key != "params"})
            for param, pid in zip(params, group["params"]):
                swapped[param] = dict(state.get(pid, {}))
        optimizer.state = swapped
        yield
    finally:
        for group, snapshot in zip(optimizer.param_groups, snapshots):
            group.clear()
            group.update(snapshot)
        optimizer.state = own_state
