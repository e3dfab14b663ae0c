"""``kiln.optim.Optimizer``: parameter groups, per-parameter state, ``state_dict`` and step hooks.

The structure (``param_groups``, ``state`` keyed by parameter, ``state_dict()`` keyed by integer index)
and the error messages are PyTorch's, so checkpoints and training loops carry over.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from copy import deepcopy
from typing import Any

from kiln import Tensor
from kiln.autograd.grad_mode import set_grad_enabled
from kiln.nn.modules._hooks import RemovableHandle, add_hook, hook_args_kwargs
from kiln.nn.modules._utils import _zero_grad

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    """Singleton marking a hyper-parameter without a default (``lr`` of a bare ``Optimizer``)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _typename(obj) -> str:
    return obj.type() if isinstance(obj, Tensor) else type(obj).__name__


def _use_grad(step):
    """Run ``step`` with autograd recording disabled, unless the optimizer was built with
    ``differentiable=True``: then with it enabled, so the update is part of the graph (PyTorch's rule)."""

    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        with set_grad_enabled(bool(self.defaults.get("differentiable"))):
            return step(self, *args, **kwargs)

    return wrapper


class Optimizer:
    """Base class of all optimizers (``torch.optim.Optimizer``).

    ``params`` is an iterable of tensors or of dicts (parameter groups, each with its own options);
    ``defaults`` fills options a group does not set. Subclasses implement :meth:`step`.
    """

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, but got "
                + _typename(params)
            )
        self.state: defaultdict[Tensor, Any] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for param_group in param_groups:
            self.add_param_group(param_group)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = Optimizer._with_hooks(cls.__dict__["step"])

    @staticmethod
    def _with_hooks(step):
        @functools.wraps(step)
        def wrapper(self, *args, **kwargs):
            for hook in list(self._optimizer_step_pre_hooks.values()):
                args, kwargs = hook_args_kwargs(hook(self, args, kwargs), args, kwargs, step)
            self._opt_called = True  # read by the LR schedulers' call-order warning
            out = step(self, *args, **kwargs)
            for hook in list(self._optimizer_step_post_hooks.values()):
                hook(self, args, kwargs)
            return out

        wrapper._hooked = True
        return wrapper

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_optimizer_step_pre_hooks", OrderedDict())
        self.__dict__.setdefault("_optimizer_step_post_hooks", OrderedDict())

    def __repr__(self) -> str:
        s = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += "\n"
            s += f"Parameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (fine-tuning a layer, a new head...)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the ordering of tensors in "
                "sets will change between runs. Please use a list instead."
            )
        else:
            param_group["params"] = list(params)
        # model.named_parameters() is accepted too: (name, tensor) pairs keep their names in "param_names"
        names = [p[0] for p in param_group["params"] if isinstance(p, tuple)]
        param_group["params"] = [p[1] if isinstance(p, tuple) else p for p in param_group["params"]]
        if names:
            if len(names) != len(param_group["params"]):
                raise ValueError("all optimizer params should be with/without names. Some param names are missing")
            param_group["param_names"] = names
        if self.param_groups and ("param_names" in param_group) != ("param_names" in self.param_groups[0]):
            raise ValueError("all optimizer param groups should be with/without names.")
        for param in param_group["params"]:
            if not isinstance(param, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + _typename(param))
            if not self.defaults.get("differentiable", None) and not (param.is_leaf or param.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        params = param_group["params"]
        if len(params) != len({id(p) for p in params}):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, this will cause an "
                "error; see github.com/pytorch/pytorch/issues/40967 for more information",
                stacklevel=3,
            )
        existing = {id(p) for group in self.param_groups for p in group["params"]}
        if not existing.isdisjoint(id(p) for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every optimized parameter (to ``None`` by default, else to zeros)."""
        _zero_grad((p for group in self.param_groups for p in group["params"]), set_to_none)

    def step(self, closure: Callable[[], float] | None = None):
        """Update the parameters once; ``closure`` re-evaluates the model and returns the loss."""
        raise NotImplementedError

    # ------------------------------------------------------------------ hooks
    def register_step_pre_hook(self, hook) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` before each :meth:`step`; it may return new ``(args, kwargs)``."""
        return add_hook(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` after each :meth:`step`."""
        return add_hook(self._optimizer_step_post_hooks, hook)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``, like PyTorch.

        Parameters are numbered in group order; state tensors are returned by reference.
        """
        param_mappings: dict[int, int] = {}
        start_index = 0

        def pack_group(group):
            nonlocal start_index
            packed = {k: v for k, v in group.items() if k != "params"}
            param_mappings.update(
                {id(p): i for i, p in enumerate(group["params"], start_index) if id(p) not in param_mappings}
            )
            packed["params"] = [param_mappings[id(p)] for p in group["params"]]
            start_index += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        packed_state = {(param_mappings[id(k)] if isinstance(k, Tensor) else k): v for k, v in self.state.items()}
        return {"state": packed_state, "param_groups": param_groups}

    @staticmethod
    def _cast(param: Tensor, value: Any, key: Any = None) -> Any:
        if isinstance(value, Tensor):
            if key == "step":
                return value.clone()
            if param.is_floating_point() and value.is_floating_point():
                return value.to(dtype=param.dtype, device=param.device).clone()
            return value.to(device=param.device).clone()
        if isinstance(value, dict):
            return {k: Optimizer._cast(param, v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(Optimizer._cast(param, v, key) for v in value)
        return value

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore options and state saved by :meth:`state_dict` (state tensors are copied and cast
        to each parameter's dtype and device; ``step`` counters keep theirs)."""
        state_dict = dict(state_dict)
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of optimizer's group"
            )
        id_map = dict(
            zip(
                itertools.chain.from_iterable(g["params"] for g in saved_groups),
                itertools.chain.from_iterable(g["params"] for g in groups),
            )
        )
        state: defaultdict[Any, Any] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = self._cast(param, v)
            else:
                state[k] = v
        new_groups = []
        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
            new_groups.append(new_group)
        self.__setstate__({"state": state, "param_groups": new_groups})
